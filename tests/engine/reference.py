"""A reference engine, written from ../shared/spec/engine.md for the tests only.

It is meant to be obviously correct, not fast: no incremental counters, no parked queues, no
wake-ups. Every decision recomputes what it needs from a plain snapshot of the tasks, so a
missed wake-up or a stale counter in the real engine (kliqued/engine) shows up as a difference
between the two. It covers the flat estate of engine.md: phases 0 to 3, the order among
competitors, reclaim with eligibility and sparing, the budget start check, and the repeat at
one moment. It does not meter budgets: the caller passes each group's remaining budget at the
pass's moment (the meters are compared by other tests), and it gives no reasons or alerts.

Read it beside engine.md: each function names the paragraph it implements.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kliqued.engine import EstateIndex, State
from kliqued.engine.budget import budget_units


@dataclass
class RTask:
    id: str
    resource: str
    group: str
    size: int
    weight: int
    seq: int
    """Submission order; a preempted task keeps its original."""
    ran_before: bool
    pool: str | None = None
    """The pool it is placed on, or None while queued."""
    placed_order: int = 0
    """Larger is newer ("at one moment, the later placed is the newer")."""
    orphan: bool = False


@dataclass
class RState:
    tasks: dict[str, RTask]
    remaining: dict[str, int]
    """Per group with a budget: budget units left in the period at this moment."""
    order_counter: int = 0
    decisions: list[tuple] = field(default_factory=list)


def snapshot(index: EstateIndex, state: State, now: int) -> RState:
    """The real engine's state as plain records (queued and placed tasks only)."""
    tasks: dict[str, RTask] = {}
    for t in state.tasks.values():
        if t.state == "ended":
            continue
        tasks[t.id] = RTask(t.id, t.resource, t.group, t.size, t.weight, t.seq,
                            t.ran_before, t.pool if t.state == "placed" else None,
                            t.place_seq if t.state == "placed" else 0, t.orphan)
    remaining = {}
    for g, gi in index.groups.items():
        if gi.budget is not None:
            used = state.meter(g).used(gi.budget.period, now, state.enabled)
            remaining[g] = budget_units(gi.budget) - used
    top = max((t.placed_order for t in tasks.values()), default=0)
    return RState(tasks, remaining, top)


# ------------------------------------------------------------------ reading the snapshot
def used(rs: RState, group: str) -> int:
    return sum(t.size for t in rs.tasks.values() if t.pool is not None and t.group == group)


def free(index: EstateIndex, rs: RState, pool: str) -> int:
    return index.pools[pool].capacity - sum(t.size for t in rs.tasks.values()
                                            if t.pool == pool)


def queue(index: EstateIndex, rs: RState, resource: str) -> list[RTask]:
    """Terms: submission order, preempted tasks first in their original order."""
    q = [t for t in rs.tasks.values() if t.resource == resource and t.pool is None]
    return sorted(q, key=lambda t: (not t.ran_before, t.seq, t.id))


def within_reservation(index: EstateIndex, rs: RState, t: RTask) -> bool:
    return used(rs, t.group) + t.size <= index.groups[t.group].reservation


def within_limit(index: EstateIndex, rs: RState, t: RTask) -> bool:
    return used(rs, t.group) + t.size <= index.groups[t.group].limit


def start_check(index: EstateIndex, rs: RState, t: RTask) -> bool:
    """Time budgets, "Start check"."""
    b = index.groups[t.group].budget
    if b is None or t.weight == 0:
        return True
    left = rs.remaining[t.group]
    if left <= 0:
        return False
    placed = [x for x in rs.tasks.values() if x.pool is not None and x.group == t.group]
    if not any(x.weight > 0 for x in placed):
        return True  # the one-task exception
    rate = sum(x.weight for x in placed)
    # remaining / (rate + w) >= low_watermark, hours on both sides: in units of weight
    # milli x ms, remaining >= (rate + w) * low_watermark_ms.
    return left >= (rate + t.weight) * b.low_watermark_s * 1000


def first_fit(index: EstateIndex, rs: RState, t: RTask) -> str | None:
    for p in index.resources[t.resource].pools:
        if free(index, rs, p) >= t.size:
            return p
    return None


# ------------------------------------------------------------------ changing the snapshot
def place(rs: RState, t: RTask, pool: str, phase: str) -> None:
    rs.order_counter += 1
    t.pool, t.placed_order = pool, rs.order_counter
    rs.decisions.append(("place", t.id, pool, phase))


def preempt(rs: RState, t: RTask, kind: str, by: str | None) -> None:
    t.pool, t.placed_order, t.ran_before = None, 0, True
    rs.decisions.append(("preempt", t.id, kind, by))


# ------------------------------------------------------------------ the phases
def order_key(index: EstateIndex, t: RTask, pool: str) -> tuple:
    """Order among competitors: execution position in the pool, policy position on the
    profile, submission order, task id."""
    cr = index.resources[t.resource]
    return (cr.exec_pos[pool], cr.policy_pos, t.seq, t.id)


def placeable(index: EstateIndex, rs: RState, t: RTask, phase: str) -> str | None:
    """The pool ``t`` would go to in phase 1 ("reserve") or 3 ("lend"), or None."""
    if phase == "reserve" and not within_reservation(index, rs, t):
        return None
    if not within_limit(index, rs, t) or not start_check(index, rs, t):
        return None
    return first_fit(index, rs, t)


def fill(index: EstateIndex, rs: RState, phase: str) -> None:
    """Phases 1 and 3: repeatedly place the candidate that goes first, then recompute."""
    while True:
        best: tuple | None = None
        for name, cr in index.resources.items():
            for t in queue(index, rs, name):
                pool = placeable(index, rs, t, phase)
                if pool is not None:
                    key = order_key(index, t, pool)
                    if best is None or key < best[0]:
                        best = (key, t, pool)
                    break
                if cr.strict:
                    break  # strict: only the head
        if best is None:
            return
        place(rs, best[1], best[2], phase)


def choose_victims(index: EstateIndex, rs: RState, pool: str, t: RTask) -> list[RTask] | None:
    """Reclaim in one pool: newest placement first, eligible only, until the task fits; then
    spare from the last chosen to the first. None when the pool cannot be freed enough."""
    need = t.size - free(index, rs, pool)
    if need <= 0:
        return []
    placed = sorted((x for x in rs.tasks.values()
                     if x.pool == pool and x.group != t.group and not x.orphan),
                    key=lambda x: -x.placed_order)
    chosen: list[RTask] = []
    taken: dict[str, int] = {}
    freed = 0
    for v in placed:
        owner_used = used(rs, v.group) - taken.get(v.group, 0)
        if owner_used - v.size < index.groups[v.group].reservation:
            continue
        chosen.append(v)
        taken[v.group] = taken.get(v.group, 0) + v.size
        freed += v.size
        if freed >= need:
            break
    if freed < need:
        return None
    for v in list(reversed(chosen)):
        if freed - v.size >= need:
            chosen.remove(v)
            freed -= v.size
    return chosen


def reclaim(index: EstateIndex, rs: RState) -> None:
    """Phase 2."""
    gave_up: set[str] = set()
    while True:
        best: tuple | None = None
        for name, cr in index.resources.items():
            if name in gave_up:
                continue
            for t in queue(index, rs, name):
                if within_reservation(index, rs, t):
                    key = order_key(index, t, cr.pools[0]) if cr.pools else None
                    if key is not None and (best is None or key < best[0]):
                        best = (key, t)
                    break
                if cr.strict:
                    break
        if best is None:
            return
        t = best[1]
        cr = index.resources[t.resource]
        if not start_check(index, rs, t):
            gave_up.add(cr.name)  # fails its budget start check: triggers no reclaim
            continue
        pool = first_fit(index, rs, t)
        if pool is not None:
            place(rs, t, pool, "reclaim")
            continue
        for p in cr.pools:
            victims = choose_victims(index, rs, p, t)
            if victims is not None:
                for v in victims:
                    preempt(rs, v, "reclaimed", t.group)
                place(rs, t, p, "reclaim")
                break
        else:
            gave_up.add(cr.name)


def budgets(index: EstateIndex, rs: RState) -> None:
    """Phase 0: a used-up budget preempts the group's weighted placed tasks, newest first."""
    for g in sorted(rs.remaining):
        if rs.remaining[g] > 0:
            continue
        placed = sorted((x for x in rs.tasks.values()
                         if x.pool is not None and x.group == g and x.weight > 0
                         and not x.orphan), key=lambda x: -x.placed_order)
        for v in placed:
            preempt(rs, v, "budget", None)


def run_pass(index: EstateIndex, rs: RState) -> list[tuple]:
    """One moment: the pass, repeated until a pass places and preempts nothing."""
    while True:
        before = len(rs.decisions)
        budgets(index, rs)
        fill(index, rs, "reserve")
        reclaim(index, rs)
        fill(index, rs, "lend")
        if len(rs.decisions) == before:
            return rs.decisions
