"""Phase 2's victim choice for one pool (engine.md "Reclaim", organisation.md "Reclaim").

Kept apart from the pass loop because it is the one rule with a subtle order: victims newest
placement first, each eligible only if it stays outside the guarantee being restored and its
own levels stay at or above their reservations counting the victims already chosen, stop as
soon as every constraint holds (room in the pool, every level's limit), then spare, from the
last chosen back to the first, each victim without which every constraint still holds.

A flat estate has one constraint (room in the pool) and one level per group; it keeps the
direct form (``_on_pool``), which is the hot path of a reclaim. With departments the general
form (``_across_levels``) also takes victims on other pools to free an envelope's limit.

lending.md changes two things, both opt-in: a protected task is never eligible
(``protection``), and with ``victims: least_lost_work`` the candidates are taken in that
order (``victims``) rather than newest first; both forms then read the candidates as one
sorted list instead of merging each group's placements from the newest.
"""

from __future__ import annotations

import heapq
from typing import Iterator

from klique_util.nodefit import choose_nodes

from .index import EstateIndex, GroupInfo
from .protection import protected
from .state import State, Task
from .victims import in_victim_order


def choose_victims(
    index: EstateIndex,
    state: State,
    pool: str,
    waiting: GroupInfo,
    size: int,
    guarded: str,
    nodes: int = 1,
    now: int = 0,
) -> list[Task] | None:
    """The tasks to preempt so that a task of ``waiting``'s group and ``size`` can be placed
    on ``pool`` under every level's limit, or None when that cannot be done (the pool is
    then passed over). ``guarded`` is the nearest level at which the task is within
    reservation: no victim is taken from its subtree. ``now`` is when protections and lost
    work are judged (lending.md; the reason asks at a later moment too)."""
    used = state.used
    groups = index.groups
    short: dict[str, int] = {}
    for y in waiting.levels:
        n = used.get(y, 0) + size - groups[y].limit
        if n > 0:
            short[y] = n
    room = _Room(state, pool, size, nodes)
    lending = index.protecting or index.least_lost_work
    if not short and len(waiting.levels) == 1 and index.depth == 1 and room.nf is None:
        return _on_pool(index, state, pool, waiting.name, room.need, now if lending else None)
    return _across_levels(
        index, state, pool, waiting, guarded, room, short, now if lending else None
    )


class _Room:
    """Room on the pool for the waiting task as victims are chosen and spared: its free GPUs
    against the declared capacity, and, where the pool declares its machines, whether the
    task (or gang) then fits them (issue 15)."""

    __slots__ = ("need", "freed", "nf", "size", "nodes")

    def __init__(self, state: State, pool: str, size: int, nodes: int) -> None:
        self.need = size - state.free.get(pool, 0)
        self.freed = 0
        nf = state.node_free.get(pool)
        self.nf = list(nf) if nf is not None else None
        self.size = size
        self.nodes = nodes

    def short(self) -> bool:
        if self.freed < self.need:
            return True
        return self.nf is not None and choose_nodes(self.nf, self.size, self.nodes) is None

    def add(self, t: Task, sign: int) -> None:
        self.freed += sign * t.size
        if self.nf is not None:
            for i, amount in t.alloc:
                if i < len(self.nf):
                    self.nf[i] += sign * amount


def _across_levels(
    index: EstateIndex,
    state: State,
    pool: str,
    waiting: GroupInfo,
    guarded: str,
    room: _Room,
    short: dict[str, int],
    now: int | None = None,
) -> list[Task] | None:
    """organisation.md's reclaim: a victim is eligible when it is outside ``guarded``'s
    subtree and each of its levels that the waiting task does not share stays at or above
    its reservation; it is useful while it is on ``pool`` and room there is short, or in
    the subtree of a level of the waiting task whose limit is short."""
    used = state.used
    groups = index.groups
    mine = set(waiting.levels)
    by_pool = state.placed_by_pool_group.get(pool, {})
    scan_all: dict[str, bool] = {}
    if room.short():
        for h in by_pool:
            scan_all[h] = False
    if short:
        for h, hi in groups.items():
            if not hi.envelope and any(y in short for y in hi.levels):
                scan_all[h] = True
    excess: dict[str, int] = {}
    heap: list[tuple[int, Task, Iterator[Task]]] = []
    pooled: list[Task] = []  # with lending.md's settings: every candidate, sorted below
    for h, everywhere in scan_all.items():
        info = groups.get(h)
        if h == waiting.name or info is None or guarded in info.levels:
            continue
        hi = info
        ok = True
        for z in hi.levels:
            if z not in mine:
                if z not in excess:
                    excess[z] = used.get(z, 0) - groups[z].reservation
                if excess[z] <= 0:
                    ok = False
        if not ok:
            continue
        src = state.placed_by_group.get(h, {}) if everywhere else by_pool.get(h, {})
        if now is not None:
            pooled.extend(t for t in src.values() if not protected(index, t, now))
            continue
        it = reversed(src.values())
        first = next(it, None)
        if first is not None:
            heap.append((-first.place_seq, first, it))
    heapq.heapify(heap)
    freed = {y: 0 for y in short}

    def holds() -> bool:
        return not room.short() and all(freed[y] >= n for y, n in short.items())

    def newest_first() -> Iterator[Task]:
        while heap:
            _, t, it = heap[0]
            nxt = next(it, None)
            if nxt is None:
                heapq.heappop(heap)
            else:
                heapq.heapreplace(heap, (-nxt.place_seq, nxt, it))
            yield t

    stream = (
        newest_first() if now is None else iter(in_victim_order(pooled, now, index.least_lost_work))
    )
    chosen: list[Task] = []
    for t in stream:
        if holds():
            break
        if t.orphan or t.size <= 0:
            continue
        levels = groups[t.group].levels
        on_pool = t.pool == pool
        if not (
            (on_pool and room.short()) or any(y in short and freed[y] < short[y] for y in levels)
        ):
            continue  # not useful (and it never becomes useful again)
        if any(z not in mine and excess[z] - t.size < 0 for z in levels):
            continue  # would take one of its levels below its reservation
        chosen.append(t)
        for z in levels:
            if z not in mine:
                excess[z] -= t.size
            if z in freed:
                freed[z] += t.size
        if on_pool:
            room.add(t, 1)
    if not holds():
        return None
    spared: set[int] = set()
    for i in range(len(chosen) - 1, -1, -1):
        t = chosen[i]
        levels = groups[t.group].levels
        on_pool = t.pool == pool
        if any(z in freed and freed[z] - t.size < short[z] for z in levels):
            continue
        if on_pool:
            room.add(t, -1)
            if room.short():
                room.add(t, 1)
                continue
        spared.add(i)
        for z in levels:
            if z in freed:
                freed[z] -= t.size
    return [t for i, t in enumerate(chosen) if i not in spared]


def _on_pool(
    index: EstateIndex,
    state: State,
    pool: str,
    waiting_group: str,
    need: int,
    now: int | None = None,
) -> list[Task] | None:
    """A flat estate's victims on ``pool`` so that ``need`` more milli-GPUs are free there.
    ``now`` given (lending.md's settings in use): protected tasks are passed over and the
    candidates go in the ``victims`` order (``_on_pool_ordered``)."""
    by_group = state.placed_by_pool_group.get(pool)
    if not by_group:
        return None
    used = state.used
    groups = index.groups
    pool_used = state.pool_group_used.get(pool, {})
    excess: dict[str, int] = {}
    bound = 0
    for g, tasks in by_group.items():
        if g == waiting_group or not tasks:
            continue
        gi = groups.get(g)
        res = gi.reservation if gi is not None else 0
        ex = used.get(g, 0) - res
        if ex <= 0:
            continue
        excess[g] = ex
        bound += min(ex, pool_used.get(g, 0))
    if bound < need:
        return None  # even every borrowed GPU on this pool would not be enough
    if now is not None:
        return _on_pool_ordered(index, by_group, excess, need, now)
    # Newest placement first across the borrowing groups: merge their per-pool lists, which
    # are in placement order, from the end.
    heap: list[tuple[int, int, Task, Iterator[Task]]] = []
    for g in excess:
        it = reversed(by_group[g].values())
        for t in it:
            heap.append((-t.place_seq, 0, t, it))
            break
    heapq.heapify(heap)
    chosen: list[Task] = []
    freed = 0
    while heap and freed < need:
        _, _, t, it = heap[0]
        g = t.group
        ex = excess[g]
        if ex > 0 and t.size > 0 and not t.orphan and ex - t.size >= 0:
            chosen.append(t)
            excess[g] = ex - t.size
            freed += t.size
        if excess[g] <= 0:
            heapq.heappop(heap)  # nothing more of this group is eligible
            continue
        nxt = next(it, None)
        if nxt is None:
            heapq.heappop(heap)
        else:
            heapq.heapreplace(heap, (-nxt.place_seq, 0, nxt, it))
    return _spared(chosen, freed, need)


def _on_pool_ordered(
    index: EstateIndex,
    by_group: dict[str, dict[str, Task]],
    excess: dict[str, int],
    need: int,
    now: int,
) -> list[Task] | None:
    """``_on_pool`` with lending.md's settings: the borrowers' unprotected tasks on the pool
    in the ``victims`` order, each eligible while its group stays at or above its
    reservation; then sparing from the last chosen back, as engine.md says."""
    pooled = [t for g in excess for t in by_group[g].values() if not protected(index, t, now)]
    chosen: list[Task] = []
    freed = 0
    for t in in_victim_order(pooled, now, index.least_lost_work):
        if freed >= need:
            break
        ex = excess[t.group]
        if t.size > 0 and not t.orphan and ex - t.size >= 0:
            chosen.append(t)
            excess[t.group] = ex - t.size
            freed += t.size
    return _spared(chosen, freed, need)


def _spared(chosen: list[Task], freed: int, need: int) -> list[Task] | None:
    """The victims left once sparing goes back from the last chosen to the first (engine.md:
    a chosen task whose GPUs are not needed after all is kept), or None when even all of them
    do not free ``need``: then nothing is preempted."""
    if freed < need:
        return None
    spared: set[int] = set()
    for i in range(len(chosen) - 1, -1, -1):
        if freed - chosen[i].size >= need:
            freed -= chosen[i].size
            spared.add(i)
    return [t for i, t in enumerate(chosen) if i not in spared]
