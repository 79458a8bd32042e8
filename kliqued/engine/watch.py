"""Compute resources parked until room frees in one of their pools.

After a pass, most queues in a big estate cannot place anything. Looking at all of them again
whenever any GPU frees would make every pass cost the whole estate, and waking every queue
that waits on a pool when one GPU frees there (a thundering herd of a hundred queues) still
costs far more than the placement it leads to. So a queue blocked only by room is parked on
each of its pools, keyed by the order it would be placed in on that pool (engine.md's order
among competitors), and phase 3 wakes parked queues one at a time in that order, only while
the pool has room for them. The key stored is a lower bound of the queue's real key, so no
queue is ever woken later than its turn; waking one early only costs a look.

Queues whose head is within reservation are few (a reclaim normally serves them) and must be
considered in phase 1, so they are parked separately by size and all woken at once.

An envelope's limit (organisation.md) is room shared by every queue of its subtree, so queues
of borrowed work that only the envelope's limit holds back are parked on it the same way,
under ``level_key(group)``, and woken one at a time as the subtree frees GPUs.
"""

from __future__ import annotations

import heapq

Key = tuple[int, int, int, str]


def pool_hold(pool: str) -> str:
    """Where gang (multi-node) queues wait for a pool: woken by any GPU freed there, since
    whether N machines have room is not one number a watcher can compare (issue 15)."""
    return "\1" + pool


def level_key(group: str) -> str:
    """Where queues held by an envelope's limit are parked, beside the pools: an envelope's
    limit is room shared by its subtree, woken in order like a pool's (organisation.md).
    The NUL prefix keeps it apart from every pool name."""
    return "\0" + group


class Watchers:
    __slots__ = ("version", "lend", "lend_need", "reserve", "lend_at", "_aside", "_users")

    def __init__(self, pools: dict[str, int]) -> None:
        """``pools``: each pool and how many compute resources use it (to bound garbage)."""
        self._users = pools
        self.version: dict[str, int] = {}
        self.lend: dict[str, list[tuple[Key, int, str, int]]] = {p: [] for p in pools}
        """Per pool: (key on this pool, version, resource, size needed)."""
        self.lend_need: dict[str, list[tuple[int, int, str]]] = {p: [] for p in pools}
        """The same entries by size, to know at once whether any could fit."""
        self.reserve: dict[str, list[tuple[int, int, str]]] = {p: [] for p in pools}
        self.lend_at: dict[str, tuple[int, tuple[str, ...], int]] = {}
        """Per resource, its last lend parking: (version, the pools or envelopes it waits
        on, size needed); current while its version is (``lend_parking``)."""
        self._aside: dict[str, list[tuple[Key, int, str, int]]] = {}

    def forget(self, name: str) -> int:
        """Invalidates the resource's entries (it is being looked at); the new version."""
        v = self.version.get(name, 0) + 1
        self.version[name] = v
        return v

    def current(self, name: str, v: int) -> bool:
        return self.version.get(name) == v

    def park_lend(
        self, name: str, pools: tuple[str, ...], keys: list[Key] | None, need: int
    ) -> int:
        """Parks ``name`` on ``pools`` (each with its key there) for ``need``; its version.
        ``keys`` None: only by size (``order: fair`` on a flat estate orders the parked
        queues itself, in ``FairParking``, and never wakes them by key)."""
        v = self.forget(name)
        on: list[str] = []
        for i, p in enumerate(pools):
            h = self.lend.get(p)
            if h is None:
                continue
            on.append(p)
            if keys is not None:
                heapq.heappush(h, (keys[i], v, name, need))
            hn = self.lend_need[p]
            heapq.heappush(hn, (need, v, name))
            if len(hn) > 256 and len(hn) > 4 * self._users.get(p, 0):
                self._compact(p)
        self.lend_at[name] = (v, tuple(on), need)
        return v

    def lend_parking(self, name: str) -> tuple[int, tuple[str, ...], int] | None:
        """(version, pools, size needed) of ``name``'s lend parking while it is current:
        the queue has not been looked at since it parked."""
        e = self.lend_at.get(name)
        return e if e is not None and self.version.get(name) == e[0] else None

    def park_reserve(self, name: str, pools: tuple[str, ...], need: int) -> None:
        v = self.forget(name)
        for p in pools:
            h = self.reserve.get(p)
            if h is not None:
                heapq.heappush(h, (need, v, name))
                if len(h) > 256 and len(h) > 4 * self._users.get(p, 0):
                    self._compact(p)

    def _compact(self, p: str) -> None:
        ver = self.version
        self.lend[p] = [e for e in self.lend[p] if ver.get(e[2]) == e[1]]
        heapq.heapify(self.lend[p])
        self.lend_need[p] = [e for e in self.lend_need[p] if ver.get(e[2]) == e[1]]
        heapq.heapify(self.lend_need[p])
        self.reserve[p] = [e for e in self.reserve[p] if ver.get(e[2]) == e[1]]
        heapq.heapify(self.reserve[p])

    def wake_reserve(self, pool: str, free: int, out: set[str]) -> None:
        """Every queue within reservation parked on ``pool`` that now fits there."""
        h = self.reserve.get(pool)
        ver = self.version
        while h and h[0][0] <= free:
            _, v, name = heapq.heappop(h)
            if ver.get(name) == v:
                out.add(name)

    def wake_lend(self, pool: str, free: int, out: set[str]) -> None:
        """Every queue parked on ``pool`` (or an envelope's limit) that could fit in ``free``:
        ``order: fair`` chooses by shares, not by the pool's order, so it needs them all. The
        woken queues are looked at (``forget``), which drops their other entries."""
        h = self.lend_need.get(pool)
        ver = self.version
        while h and h[0][0] <= free:
            _, v, name = heapq.heappop(h)
            if ver.get(name) == v:
                out.add(name)

    def peek_lend(self, pool: str, free: int) -> list[tuple[int, int, str]]:
        """The current entries (size needed, version, resource) of ``pool`` that fit in
        ``free``, left in place: ``order: fair`` on a flat estate looks at the queues they
        name lazily, and a queue it does not look at stays parked as it was (a queue it
        looks at is forgotten, which makes its entries stale). The entries that fit are the
        top of the heap, so only they are visited."""
        h = self.lend_need.get(pool)
        if not h:
            return []
        ver = self.version
        out: list[tuple[int, int, str]] = []
        todo = [0]
        n = len(h)
        stale = 0
        while todo:
            i = todo.pop()
            e = h[i]
            if e[0] > free:
                continue
            if ver.get(e[2]) == e[1]:
                out.append(e)
            else:
                stale += 1
            c = 2 * i + 1
            if c < n:
                todo.append(c)
                if c + 1 < n:
                    todo.append(c + 1)
        if stale > 64 and stale > len(out):  # entries of queues looked at since: drop them
            self._compact(pool)
        return out

    def next_lend(self, pool: str, free: int) -> tuple[Key, int, str, int] | None:
        """The parked queue that comes first on ``pool`` among those that fit in ``free``;
        the ones passed over (too big now) are kept for :meth:`restore`."""
        ver = self.version
        hn = self.lend_need.get(pool)
        while hn and ver.get(hn[0][2]) != hn[0][1]:
            heapq.heappop(hn)
        if not hn or hn[0][0] > free:
            return None
        h = self.lend[pool]
        while h:
            key, v, name, need = heapq.heappop(h)
            if ver.get(name) != v:
                continue
            if need > free:
                self._aside.setdefault(pool, []).append((key, v, name, need))
                continue
            return key, v, name, need
        return None

    def restore(self) -> None:
        for p, entries in self._aside.items():
            h = self.lend[p]
            for e in entries:
                heapq.heappush(h, e)
        self._aside.clear()
