"""Phase 2's victim choice in one pool (engine.md "Reclaim").

Kept apart from the pass loop because it is the one rule with a subtle order: victims newest
placement first, each eligible only if its group stays at or above its reservation counting
the victims already chosen, stop as soon as the waiting task fits, then spare, from the last
chosen back to the first, each victim without which the task still fits.
"""

from __future__ import annotations

import heapq
from typing import Iterator

from .index import EstateIndex
from .state import State, Task


def choose_victims(index: EstateIndex, state: State, pool: str, waiting_group: str,
                   need: int) -> list[Task] | None:
    """The tasks to preempt on ``pool`` so that ``need`` more milli-GPUs are free there, or
    None when the pool cannot be freed enough (it is then passed over)."""
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
    if freed < need:
        return None
    spared: set[int] = set()
    for i in range(len(chosen) - 1, -1, -1):
        if freed - chosen[i].size >= need:
            freed -= chosen[i].size
            spared.add(i)
    return [t for i, t in enumerate(chosen) if i not in spared]
