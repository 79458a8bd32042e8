"""engine.md's admission rules, each written once: the order key, the phase caps and the
feasibility checks (limit, budget, capacity).

The passes decide with these functions and ``reasons`` explains with the same ones
(``first_failing``), so the reason a person reads cannot drift from the decision. Every
predicate takes the compute resource (``CRInfo``) rather than its group: the departments work
(organisation.md) adds the levels a task is counted at, and only the bodies here change then,
not their callers. They are small and called per candidate on the hot path: no allocation
beyond the key tuple, no lookups the caller already made twice.
"""

from __future__ import annotations

from typing import Literal

from .budget import start_ok
from .index import CRInfo, EstateIndex, GroupInfo
from .state import State, Task

Key = tuple[int, int, int, str]
"""engine.md's order between competitors: (the profile's place in the target pool's
execution order, the policy's place on the profile, submission, task id)."""

Check = Literal["limit", "budget", "capacity"]
"""A feasibility check, in engine.md's order of reasons (after "order", which only strict
queues have and which is their position, not a check)."""

LIMIT: Check = "limit"
BUDGET: Check = "budget"
CAPACITY: Check = "capacity"


def order_key(cr: CRInfo, exec_pos: int, t: Task) -> Key:
    """The key a candidate of ``cr`` competes with; ``exec_pos`` is its profile's place in the
    execution order of the pool it is aimed at (phase 2: its first pool's)."""
    return (exec_pos, cr.policy_pos, t.seq, t.id)


def phase_cap(gi: GroupInfo, lend: bool) -> int:
    """How much the group may use in a phase: within its reservation in phases 1 and 2
    (never above its limit), up to its limit in phase 3."""
    return gi.limit if lend else min(gi.reservation, gi.limit)


def headroom(index: EstateIndex, state: State, cr: CRInfo, lend: bool) -> int:
    """Milli-GPUs ``cr``'s group may still take in this phase (the limit check: a task fits
    when its size is at most this)."""
    return phase_cap(index.groups[cr.group], lend) - state.used.get(cr.group, 0)


def budget_ok(index: EstateIndex, state: State, cr: CRInfo, now: int) -> bool:
    """The budget check: weight-0 work and groups without a budget always pass; otherwise the
    start check of budget.py."""
    if cr.weight <= 0:
        return True
    b = index.groups[cr.group].budget
    if b is None:
        return True
    return start_ok(state.meter(cr.group), b, cr.weight, now, state.enabled)


def first_fit(state: State, cr: CRInfo, size: int) -> str | None:
    """The capacity check: the first pool of the profile with room for ``size``, or None."""
    free = state.free
    for p in cr.pools:
        if free.get(p, -1) >= size:
            return p
    return None


def first_failing(index: EstateIndex, state: State, cr: CRInfo, size: int, now: int,
                  lend: bool = True) -> Check | None:
    """The first check a task of ``size`` of ``cr`` fails in this phase, in engine.md's order
    (limit, budget, capacity), or None when it may be placed. Phase 3 (``lend``) is the
    one a waiting task's reason speaks of."""
    if size > headroom(index, state, cr, lend):
        return LIMIT
    if not budget_ok(index, state, cr, now):
        return BUDGET
    if first_fit(state, cr, size) is None:
        return CAPACITY
    return None
