"""Why a queued task waits, as a person reads it (engine.md "Reasons").

A reason is a pure function of the estate, the state and the time, so it is computed when
someone asks rather than stored for each of 100,000 queued tasks at every pass. Where several
hold, the first kind in engine.md's list is given: order, limit, budget, capacity.
"""

from __future__ import annotations

from klique_util.fmt import hours
from klique_util.units import from_milli, milli_str, unit_hours

from .budget import budget_units, remaining
from .decisions import BudgetStatus, Reason, no_worker_text
from .index import EstateIndex
from .periods import format_minute, next_period_start, period_start
from .rules import BUDGET, CAPACITY, LIMIT, first_failing
from .state import QUEUED, State, Task


def _gpus(milli: int) -> str:
    return milli_str(milli)


def waiting_reason(index: EstateIndex, state: State, task_id: str, now: int,
                   position: int | None = None) -> Reason | None:
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
    if cr.strict:
        if pos is None:
            pos = next(i for i, x in enumerate(q) if x is t)
        if pos > 0:
            return Reason("order", f"behind {pos} task{'s' if pos != 1 else ''} in {cr.name}")
    # The check that fails is the one the pass applies (rules.first_failing); this only words it.
    failing = first_failing(index, state, cr, t.size, now)
    gi = index.groups[cr.group]
    used = state.used.get(cr.group, 0)
    if failing == LIMIT:
        if used >= gi.limit:
            return Reason("limit", f"group at limit ({_gpus(used)}/{_gpus(gi.limit)} GPUs)")
        return Reason("limit", f"group near limit ({_gpus(used)}/{_gpus(gi.limit)} GPUs, "
                               f"the task needs {_gpus(t.size)})")
    b = gi.budget
    if failing == BUDGET and b is not None:
        m = state.meter(cr.group)
        left = remaining(m, b, now, state.enabled)
        if left <= 0:
            return Reason("budget", f"budget used up: resets "
                                    f"{format_minute(next_period_start(b.period, now))}")
        return Reason("budget", f"budget start check: {hours(unit_hours(left))} h left at "
                                f"{hours(from_milli(m.rate + cr.weight))} h/h")
    if failing == CAPACITY:
        down = [p for p in cr.pools if p in state.unavailable]
        if not down:
            return Reason("capacity", f"no room in pools {', '.join(cr.pools)}")
        text = no_worker_text(", ".join(down))
        full = [p for p in cr.pools if p not in state.unavailable]
        if full:
            text = f"no room in pools {', '.join(full)}; {text}"
        return Reason("capacity", text)
    if not state.enabled:
        return Reason("pending", "the engine is disabled: no placements until it is enabled")
    return Reason("pending", "waits for the next pass")


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
    return BudgetStatus(policy, pol.name, b.period, period_start(b.period, now), resets,
                        total, used, m.rate, runout)
