"""What a pass would do with one more task, and the earliest start the estate can know
(issue 31): the engine's answer before anyone asks it to act.

**Why read-only, not a copied state.** A copy of the XL state (100,000 tasks) costs seconds
(pickle, deepcopy) and a forked copy tens of milliseconds, while a dry run is asked for at
hundreds a second. So :func:`dry_run` asks the pass's own rule functions (``rules``,
``reclaim.choose_victims``, ``rebalance.rebalance_victims``, ``reasons``) the questions the
pass would ask about the new task, in the order the phases ask them, against the live state
as the last pass left it, and changes nothing it decides with: it may add the empty queue
of a compute resource that never had a task (as a submission would), and asking a strict
queue for its head drops the entries of tasks that left it (as every pass does). A settled state (the last pass ran to its
fixed point, so every task that could be placed was) is what makes that exact: the task
added is the only new candidate, so whether it is placed, where, in which phase and whom it
takes from follow from the same checks. ``tests/engine/test_dryrun.py`` holds it to that:
dry run, then submit and a pass at the same moment, on the differential tests' worlds.

A pass due that has not run yet (the state ``dirty``, or a time trigger reached) may change
the answer: the caller says so (``DryRun.settled``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Mapping

from .budget import budget_units, remaining, start_ok
from .decisions import Phase, Reason
from .errors import SubmissionError
from .index import CRInfo, EstateIndex, GroupInfo
from .periods import format_minute, next_period_start, period_start
from .protection import protected_until
from .queues import CRQueue
from .reasons import _reason, protected_until_fits
from .rebalance import rebalance_victims
from .reclaim import choose_victims
from .rules import (
    CAPACITY,
    budget_ok,
    failing_budget_level,
    first_failing,
    first_fit,
    headroom,
    innermost_within,
    limit_room,
    reservation_room,
    user_ok,
)
from .state import PLACED, QUEUED, State, Task, check_submission
from .victims import lost_work

PROBE_ID = "(dry run)"
"""The id the task added is known by while its answer is worked out: never a real id."""

Basis = Literal["now", "budget-reset", "protection-end", "task-end", "unknown"]


@dataclass(frozen=True, slots=True)
class Victim:
    """A placed task the dry-run task would take GPUs from (reclaim or rebalance)."""

    task: str
    resource: str
    group: str
    user: str
    pool: str
    size_milli: int
    kind: Literal["reclaimed", "rebalanced"]
    lost_ms: int
    """lending.md's lost work if it were preempted now."""
    protected_until: int | None
    """When its protection ended (always at or before now: protected work is no victim), or
    None when its policy protects nothing."""


@dataclass(frozen=True, slots=True)
class LevelBudget:
    """One budgeted level of the task: its budget now and with the task running."""

    group: str
    policy: str
    period: str
    period_start: int
    resets_at: int
    budget_units: int
    used_units: int
    rate_milli: int
    """Budget hours per hour now, in milli."""
    rate_with_milli: int
    """The same with the task running (its time weight added)."""
    runout_at: int | None
    """At the rate now, when it runs out if before the reset."""
    runout_with_at: int | None
    """With the task running."""
    start_ok: bool
    """Whether the start check at this level lets the task start now."""


@dataclass(frozen=True, slots=True)
class Forecast:
    """The earliest time a waiting task could start that the estate can know, or None."""

    start_at: int | None
    basis: Basis
    text: str


@dataclass(frozen=True, slots=True)
class DryRun:
    """The answer: placed now (pool, phase, victims) or waiting (reason, place in line)."""

    resource: str
    group: str
    user: str
    size_milli: int
    weight_milli: int
    placed: bool
    pool: str | None
    phase: Phase | None
    victims: tuple[Victim, ...]
    reason: Reason | None
    position: int
    """Tasks ahead of it in its compute resource's queue order."""
    budgets: tuple[LevelBudget, ...]
    forecast: Forecast


def dry_run(
    index: EstateIndex,
    state: State,
    resource: str,
    user: str,
    project: str | None,
    gpus_milli: int | None,
    now: int,
    *,
    ends: Mapping[str, int] | None = None,
) -> DryRun:
    """What a pass at ``now`` would decide for a task submitted now, the state unchanged.
    Raises :class:`SubmissionError` as ``State.submit`` would. ``ends``: known end times of
    placed tasks (a scenario's runtimes), for the forecast; None: none is known."""
    size = check_submission(index, resource, user, project, gpus_milli)
    cr = index.resources[resource]
    gi = index.groups[cr.group]
    t = Task(
        PROBE_ID, resource, cr.group, user, project, gpus_milli, size, cr.weight,
        state.submit_seq + 1, now,
    )  # fmt: skip
    t.nodes = cr.nodes
    q = state.queues.get(resource)
    if q is None:
        # The one write: the empty queue ``State.submit`` would make, which the reasons read
        # (no task, no version change; a later submission finds it as its own).
        q = state.queues[resource] = CRQueue(gi.project_rank)
    position = q.position(t)
    ahead = _ahead(state, gi, q, t) if gi.user_limit is not None else position
    pool: str | None = None
    phase: Phase | None = None
    victims: tuple[Victim, ...] = ()
    if state.enabled and (ahead == 0 or not cr.strict) and user_ok(state, gi, t):
        placed = _decide(index, state, cr, gi, t, q, now)
        if placed is not None:
            pool, phase, victims = placed
    reason = None if pool is not None else _reason(index, state, t, now, ahead)
    budgets = tuple(_budgets(index, state, gi, cr.weight, now))
    forecast = (
        Forecast(now, "now", "starts now")
        if pool is not None
        else _forecast(index, state, cr, t, reason, now, ends)
    )
    return DryRun(
        resource=resource,
        group=cr.group,
        user=user,
        size_milli=size,
        weight_milli=cr.weight,
        placed=pool is not None,
        pool=pool,
        phase=phase,
        victims=victims,
        reason=reason,
        position=position,
        budgets=budgets,
        forecast=forecast,
    )


def forecast(
    index: EstateIndex,
    state: State,
    task_id: str,
    now: int,
    ends: Mapping[str, int] | None = None,
) -> Forecast | None:
    """The forecast of queued task ``task_id`` (None: not queued): as for a dry run."""
    t = state.tasks.get(task_id)
    if t is None or t.status != QUEUED:
        return None
    cr = index.resources.get(t.resource)
    if cr is None:
        return Forecast(None, "unknown", f"unknown: {t.resource} is not in the estate")
    q = state.queues[t.resource]
    return _forecast(index, state, cr, t, _reason(index, state, t, now, q.position(t)), now, ends)


# ------------------------------------------------------------------------ the phases


def _ahead(state: State, gi: GroupInfo, q: CRQueue, t: Task) -> int:
    """With a user limit: the tasks ahead that the rules do not pass over (organisation.md:
    a task its user's limit holds back keeps its place but is not ahead)."""
    if not q.live:
        return 0
    mine = q.position(t)
    n = 0
    for i, x in enumerate(q):
        if i >= mine:
            break
        if user_ok(state, gi, x):
            n += 1
    return n


def _first_within_is(state: State, gi: GroupInfo, cr: CRInfo, q: CRQueue, room: int) -> bool:
    """Whether the new task would be the one of its queue that ``room`` GPUs take (phase 2's
    and phase 4's candidate): no task queued before it is."""
    if cr.strict or not q.live:
        return True  # strict: it is the head, or it was not asked
    smallest = q.min_size()
    if smallest is None or smallest > room:
        return True
    limited = gi.user_limit is not None
    return not any(x.size <= room and (not limited or user_ok(state, gi, x)) for x in q)


def _decide(
    index: EstateIndex,
    state: State,
    cr: CRInfo,
    gi: GroupInfo,
    t: Task,
    q: CRQueue,
    now: int,
) -> tuple[str, Phase, tuple[Victim, ...]] | None:
    """The phases' questions about ``t``, in their order (passes._run_pass)."""
    size = t.size
    budget = budget_ok(index, state, cr, now)
    # Phase 1: within reservation (at some level), under every limit, first fit.
    if budget and size <= headroom(index, state, cr, False):
        pool = first_fit(state, cr, size)
        if pool is not None:
            return pool, "reserve", ()
    # Phase 2: the first task within reservation of its queue reclaims borrowed room.
    room = (
        headroom(index, state, cr, False)
        if len(gi.levels) == 1
        else reservation_room(index, state, gi)
    )
    if budget and size <= room and _first_within_is(state, gi, cr, q, room):
        pool = first_fit(state, cr, size) if limit_room(index, state, gi) >= size else None
        if pool is not None:
            return pool, "reclaim", ()
        inner = innermost_within(index, state, gi, size)
        guarded = gi.levels[inner] if inner is not None else gi.name
        for p in cr.pools:
            if p not in state.free:
                continue
            chosen = choose_victims(index, state, p, gi, size, guarded, cr.nodes, now)
            if chosen is not None:
                return p, "reclaim", _victims(index, chosen, p, "reclaimed", now)
    # Phase 3: lend idle capacity up to the limit.
    failing = first_failing(index, state, cr, size, now, lend=True, user=t.user)
    if failing is None:
        pool = first_fit(state, cr, size)
        if pool is not None:
            return pool, "lend", ()
    # Phase 4 (order: fair): room taken from borrowers with a higher share.
    if (
        index.fair
        and failing == CAPACITY
        and _first_within_is(state, gi, cr, q, headroom(index, state, cr, True))
    ):
        for p in cr.pools:
            if p not in state.free:
                continue
            chosen = rebalance_victims(index, state, p, gi, size, cr.nodes, now)
            if chosen is not None:
                return p, "rebalance", _victims(index, chosen, p, "rebalanced", now)
    return None


def _victims(
    index: EstateIndex,
    chosen: list[Task],
    pool: str,
    kind: Literal["reclaimed", "rebalanced"],
    now: int,
) -> tuple[Victim, ...]:
    return tuple(
        Victim(
            task=v.id,
            resource=v.resource,
            group=v.group,
            user=v.user,
            pool=v.pool or pool,
            size_milli=v.size,
            kind=kind,
            lost_ms=lost_work(v, now),
            protected_until=protected_until(index, v),
        )
        for v in chosen
    )


# ------------------------------------------------------------------------ budgets


def _budgets(
    index: EstateIndex, state: State, gi: GroupInfo, weight: int, now: int
) -> list[LevelBudget]:
    out = []
    for x, b, _ in gi.budgeted:
        xi = index.groups[x]
        m = state.meter(x)
        total = budget_units(b)
        left = remaining(m, b, now, state.enabled)
        resets = next_period_start(b.period, now)
        rate = m.rate if state.enabled else 0
        out.append(
            LevelBudget(
                group=x,
                policy=xi.policy,
                period=b.period,
                period_start=period_start(b.period, now),
                resets_at=resets,
                budget_units=total,
                used_units=total - left,
                rate_milli=rate,
                rate_with_milli=rate + weight,
                runout_at=_runout(left, rate, now, resets),
                runout_with_at=_runout(left, rate + weight, now, resets),
                start_ok=weight <= 0 or start_ok(m, b, weight, now, state.enabled),
            )
        )
    return out


def _runout(left: int, rate: int, now: int, resets: int) -> int | None:
    """budget_status's run-out: at ``rate``, when ``left`` is used up, if before the reset."""
    if rate <= 0:
        return None
    at = now + max(0, -(-left // rate))
    return at if at < resets else None


# ------------------------------------------------------------------------ the forecast


def _forecast(
    index: EstateIndex,
    state: State,
    cr: CRInfo,
    t: Task,
    reason: Reason | None,
    now: int,
    ends: Mapping[str, int] | None,
) -> Forecast:
    """The earliest start the estate can know from why ``t`` waits: its budget level's
    period reset, a protection's end (the reason's own moment), a placed task's known end;
    else unknown, saying what it waits for."""
    kind = reason.kind if reason is not None else "pending"
    if kind == "budget":
        x = failing_budget_level(index, state, cr, now) or cr.group
        b = index.groups[x].budget
        if b is not None:
            at = next_period_start(b.period, now)
            of = "" if x == cr.group else f" of {x}"
            return Forecast(
                at, "budget-reset", f"not before {format_minute(at)}: the budget{of} resets"
            )
    if kind == "capacity":
        until = protected_until_fits(index, state, cr, t, now) if index.protecting else None
        if until is not None:
            return Forecast(
                until,
                "protection-end",
                f"not before {format_minute(until)}: borrowed work's protection ends",
            )
        end = _known_end(state, cr, t.size, now, ends) if ends else None
        if end is not None:
            return Forecast(
                end, "task-end", f"not before {format_minute(end)}: placed work ends, room frees"
            )
        return Forecast(None, "unknown", "unknown: waits for capacity")
    if kind == "order":
        # Not before the head of its queue can start: the head's own forecast.
        gi = index.groups[cr.group]
        q = state.queues[cr.name]
        # Without a user limit the head is the queue's own (``head`` drops the entries of
        # tasks that left, as every pass does: no decision changes); walking the queue from
        # its start would step over every one of them on each call.
        head = (
            q.head()
            if gi.user_limit is None
            else next((x for x in q if user_ok(state, gi, x)), None)
        )
        if head is not None and head is not t:
            first = _forecast(
                index, state, cr, head, _reason(index, state, head, now, 0), now, ends
            )
            if first.start_at is not None:
                return Forecast(
                    first.start_at,
                    first.basis,
                    f"{first.text.split(':', 1)[0]}: the head of its queue waits until then",
                )
        return Forecast(None, "unknown", "unknown: waits for the tasks ahead of it")
    texts = {
        "limit": "unknown: waits for its group's running work to end (limit)",
        "user_limit": "unknown: waits for its user's running work to end (user limit)",
        "pending": "unknown: waits for the engine",
    }
    return Forecast(None, "unknown", texts.get(kind, f"unknown: waits ({kind})"))


def _known_end(
    state: State, cr: CRInfo, size: int, now: int, ends: Mapping[str, int]
) -> int | None:
    """The first known end of placed work after which one of the profile's pools has room
    for ``size`` (counting capacity only: the pool's machines and other waiting work may
    still hold it back, so it is a lower bound of what the estate knows)."""
    best: int | None = None
    for p in cr.pools:
        if p not in state.free:
            continue
        free = state.free[p]
        for v in sorted(
            (v for v in state.placed_on(p) if v.status == PLACED and v.id in ends),
            key=lambda v: ends[v.id],
        ):
            free += v.size
            if free >= size:
                at = max(now, ends[v.id])
                best = at if best is None else min(best, at)
                break
    return best


__all__ = [
    "PROBE_ID",
    "DryRun",
    "Forecast",
    "LevelBudget",
    "SubmissionError",
    "Victim",
    "dry_run",
    "forecast",
]
