"""A compute resource's queue.

engine.md's queue order is a total order: tasks that ran before (were preempted) come first,
by their original submission, then tasks that never ran, by submission. So the queue is two
parts: a heap for the preempted (rare, any order of arrival) and a FIFO for the rest (always
appended in submission order). With a team lead's ``project_priority`` (organisation.md) the
never-run part is one FIFO per project, in the order of the group's ``projects`` (tasks of no
listed project last): still appended in submission order within each. Removal is lazy, by a token per enqueue, because finishing or
cancelling a queued task, or a best_effort placement past the head, must not cost a scan.
Two sorted lists of the queued tasks' submission seqs, one per part, answer "my place in
line" in O(log n) (sortedcontainers), so no caller keeps a second copy of the order.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Callable, Iterator

from sortedcontainers import SortedList

from .task import ENDED, PLACED, QUEUED, Task

__all__ = ["CRQueue", "QUEUED", "PLACED", "ENDED"]


_RANK_SHIFT = 44
"""A never-run task's place key is ``rank << 44 | seq``: one sorted list of ints answers the
place in line with or without project ranks (2**44 submissions is far beyond any daemon)."""

_BACK = 1 << 62
"""Added to a never-run task's place key in the buckets' order: the preempted part (keyed by
seq alone) comes first."""

_WALK = 32
"""How many tasks ``first`` looks at in line before it asks the buckets: most heads are found
within a few, and a queue's buckets are only built once a walk this long has failed."""

Bucket = list[tuple[int, int, Task]]


class CRQueue:
    __slots__ = (
        "front",
        "back",
        "backs",
        "ranks",
        "live",
        "sizes",
        "stale",
        "front_seqs",
        "back_seqs",
        "buckets",
    )

    def __init__(self, ranks: dict[str, int] | None = None) -> None:
        self.ranks = ranks
        """Project → its place in the queue order (project priority); None: submission
        order only."""
        self.front: list[tuple[int, int, Task]] = []
        """Heap of (submission seq, token, task) of tasks that ran before."""
        self.backs: list[deque[tuple[Task, int]]] = [
            deque() for _ in range(len(ranks) + 1 if ranks else 1)
        ]
        """Per project rank: (task, token) of tasks that never ran, in submission order."""
        self.back = self.backs[0]
        self.live = 0
        self.sizes: dict[int, int] = {}
        """How many queued tasks have each size: best_effort skips a queue at once when even
        its smallest task cannot go anywhere."""
        self.stale = 0
        self.front_seqs: SortedList = SortedList()
        self.back_seqs: SortedList = SortedList()
        self.buckets: dict[tuple[str, int], Bucket] | None = None
        """(user, size) → heap of (place in queue order, token, task): built the first time
        ``first`` walks far without an answer, then kept up by push and resize. What the
        rules ask of a deep queue's tasks (their user's limit, their size against the room,
        the first pool that fits them) depends on a task's user and size only, so the first
        task that passes is the first of one bucket's fronts: a look at each bucket instead of
        a walk over every task its user's limit holds back (issue 29's what-if)."""

    @staticmethod
    def _valid(t: "Task", token: int) -> bool:
        return t.status == QUEUED and t.qtoken == token

    def _count(self, size: int, d: int) -> None:
        n = self.sizes.get(size, 0) + d
        if n:
            self.sizes[size] = n
        else:
            self.sizes.pop(size, None)

    def rank(self, t: "Task") -> int:
        r = self.ranks
        if not r:
            return 0
        return r.get(t.project, len(r)) if t.project is not None else len(r)

    def _key(self, t: "Task") -> int:
        return (self.rank(t) << _RANK_SHIFT) | t.seq if self.ranks else t.seq

    def _order(self, t: "Task") -> int:
        """``t``'s place in queue order as one int (the buckets' key)."""
        return t.seq if t.ran_before else _BACK | self._key(t)

    def _bucket(self, t: "Task", token: int) -> None:
        b = self.buckets
        if b is not None:
            h = b.get((t.user, t.size))
            if h is None:
                h = b[(t.user, t.size)] = []
            heapq.heappush(h, (self._order(t), token, t))

    def push(self, t: "Task") -> None:
        """Enqueues ``t`` (already marked queued) in its place: front if it ran before."""
        t.qtoken += 1
        if t.ran_before:
            heapq.heappush(self.front, (t.seq, t.qtoken, t))
            self.front_seqs.add(t.seq)
        else:
            self.backs[self.rank(t)].append((t, t.qtoken))
            self.back_seqs.add(self._key(t))
        self.live += 1
        self._count(t.size, 1)
        if self.buckets is not None:
            self._bucket(t, t.qtoken)

    def left(self, t: "Task") -> None:
        """``t`` left the queue (placed or ended); its entry is dropped lazily."""
        if t.ran_before:
            self.front_seqs.discard(t.seq)
        else:
            self.back_seqs.discard(self._key(t))
        self.live -= 1
        self.stale += 1
        self._count(t.size, -1)
        if self.stale > 64 and self.stale > self.live:
            self._compact()

    def resized(self, t: "Task", old: int) -> None:
        self._count(old, -1)
        self._count(t.size, 1)
        if self.buckets is not None:  # the old bucket's entry is stale by its size
            self._bucket(t, t.qtoken)

    def _compact(self) -> None:
        self.front = [e for e in self.front if self._valid(e[2], e[1])]
        heapq.heapify(self.front)
        self.backs = [deque(e for e in b if self._valid(e[0], e[1])) for b in self.backs]
        self.back = self.backs[0]
        self.stale = 0
        self.buckets = None  # rebuilt from the live entries when next asked

    def head(self) -> "Task | None":
        # ``_valid`` written out: the hot path of every pass (each placement asks it).
        front = self.front
        while front:
            _, tok, t = front[0]
            if t.status == QUEUED and t.qtoken == tok:
                return t
            heapq.heappop(front)
            self.stale -= 1
        for back in self.backs:
            while back:
                t, tok = back[0]
                if t.status == QUEUED and t.qtoken == tok:
                    return t
                back.popleft()
                self.stale -= 1
        return None

    def oldest(self) -> "Task | None":
        """The queued task submitted first (the longest wait), without dropping stale
        entries as ``head`` does: a read, for metrics at scrape time. The preempted part is
        a heap (rare, small); the FIFO's first valid entry is its oldest."""
        best: "Task | None" = None
        for _, tok, t in self.front:
            if self._valid(t, tok) and (best is None or t.seq < best.seq):
                best = t
        for back in self.backs:
            for t, tok in back:
                if self._valid(t, tok):
                    if best is None or t.seq < best.seq:
                        best = t
                    break
        return best

    def __iter__(self) -> Iterator["Task"]:
        """Queued tasks in queue order."""
        if self.front:  # preempted work is rare: most queues have none to sort
            for _, tok, t in sorted(self.front, key=lambda e: e[0]):
                if self._valid(t, tok):
                    yield t
        for back in self.backs:
            for t, tok in back:
                if self._valid(t, tok):
                    yield t

    def _fronts(self) -> list[tuple[int, "Task"]]:
        """Each bucket's first live task with its place in queue order, in queue order;
        builds the buckets on first use and drops their stale fronts (and empty buckets)."""
        b = self.buckets
        if b is None:
            b = self.buckets = {}
            for _, tok, t in self.front:
                if self._valid(t, tok):
                    b.setdefault((t.user, t.size), []).append((t.seq, tok, t))
            for back in self.backs:
                for t, tok in back:
                    if self._valid(t, tok):
                        b.setdefault((t.user, t.size), []).append((_BACK | self._key(t), tok, t))
            for h in b.values():
                heapq.heapify(h)
        out: list[tuple[int, Task]] = []
        dead: list[tuple[str, int]] = []
        for key, h in b.items():
            size = key[1]
            while h:
                order, tok, t = h[0]
                if t.status == QUEUED and t.qtoken == tok and t.size == size:
                    out.append((order, t))
                    break
                heapq.heappop(h)
            else:
                dead.append(key)
        for key in dead:
            del b[key]
        out.sort(key=lambda e: e[0])
        return out

    def first(self, ok: Callable[["Task"], bool]) -> "Task | None":
        """The first queued task in queue order that ``ok`` accepts. ``ok`` must depend only
        on a task's user and size (and on nothing that changes during the call): past the
        first ``_WALK`` entries in line (stale ones count: they cost the walk too), only each
        (user, size) bucket's first task is asked."""
        b = self.buckets
        if b is None or len(b) > _WALK:
            front = self.front
            if len(front) <= _WALK:
                n = len(front)
                if front:  # (seq, token) is unique: the tasks themselves are never compared
                    for _, tok, t in sorted(front):
                        if t.status == QUEUED and t.qtoken == tok and ok(t):
                            return t
                done = True
                for back in self.backs:
                    for t, tok in back:
                        n += 1
                        if n > _WALK:
                            done = False
                            break
                        if t.status == QUEUED and t.qtoken == tok and ok(t):
                            return t
                    if not done:
                        break
                if done:
                    return None
        else:  # few buckets: the head first (often the answer), else one look at each
            h = self.head()
            if h is None or ok(h):
                return h
        for _, t in self._fronts():
            if ok(t):
                return t
        return None

    def min_size_where(self, ok: Callable[["Task"], bool]) -> int | None:
        """The smallest size among queued tasks that ``ok`` accepts (``ok`` as for
        ``first``), or None."""
        best: int | None = None
        for _, t in self._fronts():
            if (best is None or t.size < best) and ok(t):
                best = t.size
        return best

    def position(self, t: "Task") -> int:
        """0-based place of queued ``t`` in queue order (0 = the head)."""
        # sortedcontainers ships no types: its answers are ints, said so here once.
        if t.ran_before:
            return int(self.front_seqs.bisect_left(t.seq))
        return len(self.front_seqs) + int(self.back_seqs.bisect_left(self._key(t)))

    def min_size(self) -> int | None:
        return min(self.sizes) if self.sizes else None
