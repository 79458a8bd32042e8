"""engine.md's admission rules, each written once: the order key, the phase caps and the
feasibility checks (limit, budget, capacity).

The passes decide with these functions and ``reasons`` explains with the same ones
(``first_failing``), so the reason a person reads cannot drift from the decision. A task is
counted at its levels (organisation.md: its group, then each envelope above); every check
here runs over them, with a short path for the flat group (one level), which is the common
case and must cost what it did before departments. They are small and called per candidate
on the hot path: no allocation beyond the key tuple, no lookups the caller already made
twice; the levels' numbers come resolved from the index (``GroupInfo.outer``, ``budgeted``).
"""

from __future__ import annotations

from typing import Literal

from klique_util.nodefit import choose_nodes

from .budget import remaining, start_ok
from .index import CRInfo, EstateIndex, GroupInfo
from .state import State, Task

Key = tuple[int, int, int, str]
"""engine.md's order between competitors: (the profile's place in the target pool's
execution order, the policy's place on the profile, submission, task id)."""

Check = Literal["user_limit", "limit", "budget", "capacity"]
"""A feasibility check, in the order of reasons (after "order", which only strict queues have
and which is their position, not a check): engine.md's, with organisation.md's user limit."""

USER_LIMIT: Check = "user_limit"
LIMIT: Check = "limit"
BUDGET: Check = "budget"
CAPACITY: Check = "capacity"


def order_key(cr: CRInfo, exec_pos: int, t: Task) -> Key:
    """The key a candidate of ``cr`` competes with; ``exec_pos`` is its profile's place in the
    execution order of the pool it is aimed at (phase 2: its first pool's)."""
    return (exec_pos, cr.policy_pos, t.seq, t.id)


def phase_cap(gi: GroupInfo, lend: bool) -> int:
    """How much a flat group may use in a phase: within its reservation in phases 1 and 2
    (never above its limit), up to its limit in phase 3."""
    return gi.limit if lend else min(gi.reservation, gi.limit)


def limit_room(index: EstateIndex, state: State, gi: GroupInfo) -> int:
    """Milli-GPUs a task of ``gi`` may take under every level's limit (organisation.md
    "Limits": ``used(x) + s <= limit(x)`` at every level)."""
    used = state.used
    room = gi.limit - used.get(gi.name, 0)
    for x, _, limit in gi.outer:
        r = limit - used.get(x, 0)
        if r < room:
            room = r
    return room


def reservation_room(
    index: EstateIndex, state: State, gi: GroupInfo, upto: int | None = None
) -> int:
    """The largest task of ``gi`` that is within reservation at some level among its first
    ``upto + 1`` (all when None): ``used(x) + s <= reservation(x)`` at one of them."""
    used = state.used
    room = gi.reservation - used.get(gi.name, 0)
    for x, reservation, _ in gi.outer if upto is None else gi.outer[:upto]:
        r = reservation - used.get(x, 0)
        if r > room:
            room = r
    return room


def innermost_within(index: EstateIndex, state: State, gi: GroupInfo, size: int) -> int | None:
    """The place (0 = the group's own) of the nearest level at which a task of ``size`` is
    within reservation, or None. Its subtree is the guarantee a reclaim restores."""
    used = state.used
    if used.get(gi.name, 0) + size <= gi.reservation:
        return 0
    for i, (x, reservation, _) in enumerate(gi.outer, 1):
        if used.get(x, 0) + size <= reservation:
            return i
    return None


def headroom(
    index: EstateIndex, state: State, cr: CRInfo, lend: bool, upto: int | None = None
) -> int:
    """Milli-GPUs ``cr``'s group may still take in this phase (a task fits when its size is
    at most this): under every level's limit, and in phases 1 and 2 (``lend`` False) within
    reservation at one of the first ``upto + 1`` levels (all when None)."""
    gi = index.groups[cr.group]
    used = state.used
    own = used.get(gi.name, 0)
    outer = gi.outer
    if not outer:
        return phase_cap(gi, lend) - own
    if lend:
        return limit_room(index, state, gi)
    # limit_room and reservation_room in one walk over the levels (called per candidate).
    room = gi.limit - own
    within = gi.reservation - own
    last = len(outer) if upto is None else upto
    for i, (x, reservation, limit) in enumerate(outer):
        u = used.get(x, 0)
        if limit - u < room:
            room = limit - u
        if i < last and reservation - u > within:
            within = reservation - u
    return room if within > room else within


def user_ok(state: State, gi: GroupInfo, t: Task) -> bool:
    """organisation.md's user limit: ``used(g, user) + s <= user_limit(g)``."""
    ul = gi.user_limit
    return ul is None or state.user_used.get((gi.name, t.user), 0) + t.size <= ul


def failing_budget_level(index: EstateIndex, state: State, cr: CRInfo, now: int) -> str | None:
    """The nearest level whose budget start check (budget.start_ok) a task of ``cr`` fails,
    or None. Weight-0 work and levels without a budget always pass (engine.md;
    organisation.md "Budgets at every level").

    Within a pass (``state.pass_budget_left`` set) what is left of a level's budget is
    looked up once, with its meter: at one moment it changes with no placement or
    preemption (they change the rate; charges accrue only as time passes), while the rate
    and the weighted-task count are read as they are now."""
    w = cr.weight
    if w <= 0:
        return None
    cache = state.pass_budget_left
    for x, b, watermark_ms in index.groups[cr.group].budgeted:
        if cache is None:
            if not start_ok(state.meter(x), b, w, now, state.enabled):
                return x
            continue
        hit = cache.get(x)
        if hit is None:
            m = state.meter(x)
            hit = cache[x] = (remaining(m, b, now, state.enabled), m)
        left, m = hit
        # start_ok, with ``left`` as looked up above.
        if left <= 0 or (m.weighted_tasks and left < (m.rate + w) * watermark_ms):
            return x
    return None


def budget_ok(index: EstateIndex, state: State, cr: CRInfo, now: int) -> bool:
    """The budget check: the start check of budget.py at every budgeted level."""
    return (
        cr.weight <= 0
        or not index.groups[cr.group].budgeted
        or failing_budget_level(index, state, cr, now) is None
    )


def failing_limit_level(index: EstateIndex, state: State, gi: GroupInfo, size: int) -> str | None:
    """The nearest level whose limit a task of ``size`` would pass, or None."""
    used = state.used
    if used.get(gi.name, 0) + size > gi.limit:
        return gi.name
    for x, _, limit in gi.outer:
        if used.get(x, 0) + size > limit:
            return x
    return None


def fits(state: State, cr: CRInfo, pool: str, size: int) -> bool:
    """Room for a task of ``size`` of ``cr`` on ``pool`` now: its declared capacity
    (engine.md), and, where the pool declares its machines, one machine (or ``cr.nodes``
    machines for a gang) with room for its part (issue 15)."""
    if state.free.get(pool, -1) < size:
        return False
    nf = state.node_free.get(pool)
    return nf is None or choose_nodes(nf, size, cr.nodes) is not None


def first_fit(state: State, cr: CRInfo, size: int) -> str | None:
    """The capacity check: the first pool of the profile with room for ``size``, or None."""
    free = state.free
    nodes = state.node_free
    for p in cr.pools:
        if free.get(p, -1) >= size:
            nf = nodes.get(p)
            if nf is None or choose_nodes(nf, size, cr.nodes) is not None:
                return p
    return None


def first_failing(
    index: EstateIndex,
    state: State,
    cr: CRInfo,
    size: int,
    now: int,
    lend: bool = True,
    user: str | None = None,
) -> Check | None:
    """The first check a task of ``size`` (of ``user``, when given) of ``cr`` fails in this
    phase, in the order of reasons (user limit, limit, budget, capacity), or None when it
    may be placed. Phase 3 (``lend``) is the one a waiting task's reason speaks of."""
    gi = index.groups[cr.group]
    if (
        user is not None
        and gi.user_limit is not None
        and state.user_used.get((gi.name, user), 0) + size > gi.user_limit
    ):
        return USER_LIMIT
    if size > headroom(index, state, cr, lend):
        return LIMIT
    if not budget_ok(index, state, cr, now):
        return BUDGET
    if first_fit(state, cr, size) is None:
        return CAPACITY
    return None
