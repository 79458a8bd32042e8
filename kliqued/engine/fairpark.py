"""The queues parked for room, kept in lending.md's fair order across passes (flat estates).

Fair phase 3 on a flat estate places the candidate with the lowest (share, engine.md's key),
and looks at a queue parked on a pool that gained room only while it could come before the
tree's pick (docs/decisions.md E3). Finding those queues by listing every entry the new room
wakes, each pass, cost about 5,000 entries and their shares a pass on the XL estate to look
at about a hundred. So each pool keeps its lend-parked queues in a heap by (their group's
share, a key no candidate of the queue on that pool comes before) from pass to pass, and a
phase merges the heaps of the pools that gained room and still have some, reading them only
from the lowest up to the pick; a pool that fills up leaves the merge at once.

An entry may sit below where it belongs, never above: a share that rose since it was pushed
is corrected when the entry comes to the top (re-pushed at the share now), and a share that
fell (a task of the group ended or was preempted: ``State.share_fell``) gets a fresh entry
before the next phase 3 reads the heaps. An entry is current while its queue's lend parking
is (the watchers' version); the others are dropped on the way or by a compaction.
"""

from __future__ import annotations

import heapq
from typing import Callable

from .watch import Key

Entry = tuple[int, Key, str, int]
"""(scaled share of the queue's group, lower bound of the queue's key on the pool, compute
resource, the version of its lend parking)."""


class FairParking:
    """Per pool, the heap of its parked queues; during a phase, the merge of the heaps in
    play, the entries the phase parked (seen from the next phase) and those it passed over
    (too big for the pool's room: kept for the next)."""

    __slots__ = ("heaps", "tops", "pending", "aside")

    def __init__(self) -> None:
        self.heaps: dict[str, list[Entry]] = {}
        self.tops: list[tuple[int, Key, str, int, str]] = []
        """The merge: each pool in play with its top entry (stale when the top moved)."""
        self.pending: list[tuple[str, Entry]] = []
        """Queues parked during the running phase, by pool: it looked at them already."""
        self.aside: list[tuple[str, Entry]] = []

    def push(self, pool: str, e: Entry) -> None:
        """Files ``e`` in ``pool``'s heap (fair phase 3 files the fresh entries of the queues
        whose share fell straight into ``heaps``, the same way, in its hot loop)."""
        h = self.heaps.get(pool)
        if h is None:
            h = self.heaps[pool] = []
        heapq.heappush(h, e)

    def parked(self, pool: str, e: Entry) -> None:
        """A queue the running phase parked on ``pool``: read from the next phase on."""
        self.pending.append((pool, e))

    def start(self, pools: list[str]) -> None:
        """The phase reads the heaps of ``pools`` (those that gained room and have some)."""
        tops = self.tops
        tops.clear()
        for p in pools:
            h = self.heaps.get(p)
            if h:
                tops.append(h[0] + (p,))
        heapq.heapify(tops)

    def first_before(
        self,
        best: tuple[int, Key] | None,
        version: dict[str, int],
        share: Callable[[str], int],
        fits: Callable[[str, str], bool | None],
    ) -> str | None:
        """The queue of the lowest entry in play below ``best`` (None: any) whose parking is
        current (``version``: the watchers' versions; an entry's parking is current while
        its queue's version is the entry's) and that fits its pool now. ``share(queue)``:
        its group's scaled share now. ``fits(name, pool)``: True, False (the entry waits for
        the next phase) or None (the pool has no room for any queue left: it leaves the
        merge). None when no entry below ``best`` is left."""
        tops = self.tops
        heaps = self.heaps
        pop, replace = heapq.heappop, heapq.heapreplace
        while tops:
            p = tops[0][4]
            h = heaps[p]
            s, lb, n, v = e = h[0]
            if version.get(n) != v:
                pop(h)
            else:
                now_s = share(n)
                if now_s != s:  # its group placed since: its share rose (or a fresher entry)
                    replace(h, (now_s, lb, n, v))
                else:
                    if best is not None and (s, lb) >= best:
                        return None
                    ok = fits(n, p)
                    if ok is None:
                        pop(tops)  # the pool is full: nothing on it can come now
                        continue
                    pop(h)
                    if h:
                        replace(tops, h[0] + (p,))
                    else:
                        pop(tops)
                    if ok:
                        return n
                    self.aside.append((p, e))
                    continue
            # The pool's top moved: so does its place in the merge.
            if h:
                replace(tops, h[0] + (p,))
            else:
                pop(tops)
        return None

    def settle(self, current: Callable[[str, int], bool], users: Callable[[str], int]) -> None:
        """The phase ended: its parkings and the entries it passed over go back in their
        heaps; a heap whose stale entries outnumber ``users(pool)`` (the queues that could
        park there) is rebuilt with one entry per queue, its lowest."""
        heaps = self.heaps
        touched: set[str] = set()
        for p, e in self.aside:
            heapq.heappush(heaps[p], e)
        for p, e in self.pending:
            self.push(p, e)
            touched.add(p)
        self.aside.clear()
        self.pending.clear()
        self.tops.clear()
        for p in touched:
            h = heaps[p]
            if len(h) > 2 * users(p) + 64:
                keep: dict[str, Entry] = {}
                for e in h:
                    if current(e[2], e[3]):
                        k = keep.get(e[2])
                        if k is None or e < k:
                            keep[e[2]] = e
                h[:] = list(keep.values())
                heapq.heapify(h)
