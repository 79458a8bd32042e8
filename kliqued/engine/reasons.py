"""Why a queued task waits, as a person reads it (engine.md "Reasons").

A reason is a pure function of the estate, the state and the time, so it is computed when
someone asks rather than stored for each of 100,000 queued tasks at every pass. Where several
hold, the first kind in engine.md's list is given: order, limit, budget, capacity.
"""

from __future__ import annotations

from klique_util.fmt import hours
from klique_util.units import from_milli, milli_str, unit_hours

from .budget import budget_units, remaining
from .decisions import BudgetStatus, Reason, no_autoscaler_text, no_worker_text
from .index import CRInfo, EstateIndex
from .periods import format_minute, next_period_start, period_start
from .rules import (
    BUDGET,
    CAPACITY,
    LIMIT,
    USER_LIMIT,
    failing_budget_level,
    failing_limit_level,
    first_failing,
    user_ok,
)
from .protection import protected_until
from .reclaim import choose_victims
from .rules import budget_ok, innermost_within
from .state import PLACED, QUEUED, State, Task


def _gpus(milli: int) -> str:
    return milli_str(milli)


def waiting_reason(
    index: EstateIndex, state: State, task_id: str, now: int, position: int | None = None
) -> Reason | None:
    """The reason ``task_id`` waits, or None if it is not queued. ``position`` (0 = the
    head), when the caller keeps it, saves walking a strict queue to find the task."""
    t = state.tasks.get(task_id)
    if t is None or t.status != QUEUED:
        return None
    return _reason(index, state, t, now, position)


def waiting_reasons(index: EstateIndex, state: State, now: int) -> dict[str, Reason]:
    """Every queued task's reason, in queue order per compute resource."""
    out: dict[str, Reason] = {}
    for name in sorted(state.queues):
        q = state.queues[name]
        if not q.live:
            continue
        for pos, t in enumerate(q):
            out[t.id] = _reason(index, state, t, now, pos)
    return out


def _reason(index: EstateIndex, state: State, t: Task, now: int, pos: int | None) -> Reason:
    cr = index.resources.get(t.resource)
    if cr is None:
        return Reason("pending", f"compute resource {t.resource} is not in the estate")
    q = state.queues[t.resource]
    gi = index.groups[cr.group]
    held = gi.user_limit is not None and not user_ok(state, gi, t)
    if cr.strict:
        if gi.user_limit is not None:
            # Tasks its user's limit holds back are passed over (organisation.md): they do
            # not count as being ahead.
            pos = 0
            for ahead in q:
                if ahead is t:
                    break
                if user_ok(state, gi, ahead):
                    pos += 1
        elif pos is None:
            pos = next(i for i, x in enumerate(q) if x is t)
        if pos > 0:
            return Reason("order", f"behind {pos} task{'s' if pos != 1 else ''} in {cr.name}")
    # The check that fails is the one the pass applies (rules.first_failing); this only words it.
    failing = first_failing(index, state, cr, t.size, now, user=t.user)
    if failing == USER_LIMIT or held:
        used = state.user_used.get((gi.name, t.user), 0)
        return Reason(
            "user_limit",
            f"{t.user} at their limit in {gi.name} "
            f"({_gpus(used)}/{_gpus(gi.user_limit or 0)} GPUs)",
        )
    if failing == LIMIT:
        x = failing_limit_level(index, state, gi, t.size) or gi.name
        xi = index.groups[x]
        used = state.used.get(x, 0)
        who = "group" if x == gi.name else x
        if used >= xi.limit:
            return Reason("limit", f"{who} at limit ({_gpus(used)}/{_gpus(xi.limit)} GPUs)")
        return Reason(
            "limit",
            f"{who} near limit ({_gpus(used)}/{_gpus(xi.limit)} GPUs, "
            f"the task needs {_gpus(t.size)})",
        )
    if failing == BUDGET:
        x = failing_budget_level(index, state, cr, now) or gi.name
        b = index.groups[x].budget
        if b is not None:
            m = state.meter(x)
            left = remaining(m, b, now, state.enabled)
            of = "" if x == gi.name else f" of {x}"
            if left <= 0:
                return Reason(
                    "budget",
                    f"budget{of} used up: resets {format_minute(next_period_start(b.period, now))}",
                )
            return Reason(
                "budget",
                f"budget start check{of}: {hours(unit_hours(left))} h "
                f"left at {hours(from_milli(m.rate + cr.weight))} h/h",
            )
    if failing == CAPACITY:
        down = [p for p in cr.pools if p in state.unavailable]
        up = [p for p in cr.pools if p not in state.unavailable]
        # Pools with the GPUs free but not on one machine (or N for a gang): issue 15.
        split = [p for p in up if p in state.node_free and state.free.get(p, -1) >= t.size]
        full = [p for p in up if p not in split]
        parts = []
        if full:
            parts.append(f"no room in pools {', '.join(full)}")
        if split:
            each = milli_str(t.size // max(1, cr.nodes))
            need = (
                f"{cr.nodes} machines with {each} GPUs free each"
                if cr.nodes > 1
                else f"machine with {each} GPUs free"
            )
            rooms = ", ".join(f"{milli_str(state.node_room[p])} in {p}" for p in split)
            parts.append(
                f"no {need} in pools {', '.join(split)} (most free on one machine: {rooms})"
            )
        no_scaler = [p for p in down if p in state.no_autoscaler]
        no_worker = [p for p in down if p not in state.no_autoscaler]
        if no_worker:
            parts.append(no_worker_text(", ".join(no_worker)))
        if no_scaler:
            parts.append(no_autoscaler_text(", ".join(no_scaler)))
        until = protected_until_fits(index, state, cr, t, now) if index.protecting else None
        if until is not None:
            parts.append(f"borrowed work protected until {format_minute(until)}")
        return Reason("capacity", "; ".join(parts))
    if not state.enabled:
        return Reason("pending", "the engine is disabled: no placements until it is enabled")
    return Reason("pending", "waits for the next pass")


def protected_until_fits(
    index: EstateIndex, state: State, cr: CRInfo, t: Task, now: int
) -> int | None:
    """lending.md's reason: when a task whose reclaim is held back only by protection could
    take its room, i.e. the first moment a protection ends at which the reclaim (the same
    ``choose_victims``, judged at that moment) frees a pool for it; None when it triggers no
    reclaim, or protection is not what holds it back."""
    gi = index.groups[cr.group]
    if innermost_within(index, state, gi, t.size) is None or not budget_ok(index, state, cr, now):
        return None
    # Only the task phase 2 takes from its compute resource triggers a reclaim (engine.md:
    # best_effort, its first task within reservation, and only that one); a later one that
    # is within reservation by itself would not get in at that moment either.
    for x in state.queues[t.resource]:
        if gi.user_limit is not None and not user_ok(state, gi, x):
            continue
        if innermost_within(index, state, gi, x.size) is not None:
            if x is not t:
                return None
            break
    ends = sorted(
        {
            e
            for tasks in state.placed_by_group.values()
            for v in tasks.values()
            if v.status == PLACED and (e := protected_until(index, v)) is not None and e > now
        }
    )
    inner = innermost_within(index, state, gi, t.size)
    guarded = gi.levels[inner] if inner is not None else gi.name
    for at in ends:
        for p in cr.pools:
            if (
                p in state.free
                and choose_victims(index, state, p, gi, t.size, guarded, cr.nodes, at) is not None
            ):
                return at
    return None


def budget_status(index: EstateIndex, state: State, policy: str, now: int) -> BudgetStatus | None:
    """A policy's budget in the current period ("seen before it hits")."""
    g = index.group_of_policy.get(policy)
    pol = index.groups.get(g) if g is not None else None
    if pol is None or pol.budget is None:
        return None
    b = pol.budget
    m = state.meter(pol.name)
    used = m.used(b.period, now, state.enabled)
    total = budget_units(b)
    resets = next_period_start(b.period, now)
    rate = m.rate if state.enabled else 0
    runout: int | None = None
    if rate > 0:
        left = total - used
        runout = now + max(0, -(-left // rate))
        if runout >= resets:
            runout = None
    return BudgetStatus(
        policy, pol.name, b.period, period_start(b.period, now), resets, total, used, m.rate, runout
    )
