"""lending.md "Phase 4 (rebalance)": the victims one candidate may take from other
borrowers on one pool, with ``order: fair``.

For candidate ``T`` (group ``G``, size ``s``) a placed task ``v`` of another group ``H`` is
eligible only if, counting the victims already chosen (``chosen(L)``, ``v`` included):
at every level of ``H`` that is not a level of ``T``, ``used(L) - chosen(L) >=
reservation(L)``; ``v`` is not protected; and at the diverging levels ``X`` (of ``T``) and
``Y`` (of ``v``), ``max(0, used(X) + s - reservation(X)) / w(X) <= (used(Y) - chosen(Y) -
reservation(Y)) / w(Y)``, ``used(X)`` as before the attempt (after the move the taker's share
is no higher than the giver's). Victims are tried by the share of their diverging level
before the attempt, highest first, then in the ``victims`` order; chosen until ``T`` fits,
then spared from the last chosen back; a pool that cannot be freed enough gives None.
"""

from __future__ import annotations

from fractions import Fraction

from .fair import diverging, share
from .index import EstateIndex, GroupInfo
from .protection import protected
from .reclaim import _Room
from .state import State, Task
from .victims import victim_key


def rebalance_victims(
    index: EstateIndex, state: State, pool: str, taker: GroupInfo, size: int, nodes: int, now: int
) -> list[Task] | None:
    room = _Room(state, pool, size, nodes)
    if not room.short():
        return []
    groups = index.groups
    used = state.used
    mine = set(taker.levels)
    ranked: list[tuple[Fraction, tuple[int, int, str], Task, str, str]] = []
    for h, tasks in state.placed_by_pool_group.get(pool, {}).items():
        hi = groups.get(h)
        if h == taker.name or hi is None or not tasks:
            continue
        x, y = diverging(taker, hi)
        ys = share(index, state, y)
        for v in tasks.values():
            if v.orphan or v.size <= 0 or protected(index, v, now):
                continue
            ranked.append((-ys, victim_key(v, now, index.least_lost_work), v, x, y))
    ranked.sort(key=lambda r: (r[0], r[1]))
    chosen_in: dict[str, int] = {}
    chosen: list[Task] = []
    for _, _, v, x, y in ranked:
        if not room.short():
            break
        levels = groups[v.group].levels
        if any(
            used.get(z, 0) - chosen_in.get(z, 0) - v.size < groups[z].reservation
            for z in levels
            if z not in mine
        ):
            continue  # it would take one of its levels below its reservation
        xi, yi = groups[x], groups[y]
        taker_share = Fraction(max(0, used.get(x, 0) + size - xi.reservation), xi.lend_weight)
        giver_share = Fraction(
            used.get(y, 0) - chosen_in.get(y, 0) - v.size - yi.reservation, yi.lend_weight
        )
        if taker_share > giver_share:
            continue  # the move would leave the taker above the giver
        chosen.append(v)
        for z in levels:
            chosen_in[z] = chosen_in.get(z, 0) + v.size
        room.add(v, 1)
    if room.short():
        return None
    spared: set[int] = set()
    for i in range(len(chosen) - 1, -1, -1):
        v = chosen[i]
        room.add(v, -1)
        if room.short():
            room.add(v, 1)
            continue
        spared.add(i)
    return [v for i, v in enumerate(chosen) if i not in spared]
