"""The registry of expectation kinds (scenarios.md ``expect``): one entry per kind.

Each kind says what it names (a group, a pool, a compute resource or a task), how its value is
checked and normalised when the scenario is loaded, and how it is compared with the engine's
state when the scenario runs. Loading (scenario.py) and checking (expect.py) both read
:data:`KINDS`, so a new kind is one entry here and cannot be accepted by one and unknown to the
other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from klique_util.units import gpus_to_milli, milli_str, unit_hours
from kliqued.engine import EstateIndex, State, waiting_reason
from kliqued.engine.fair import share

TASK_STATES = ("placed", "queued", "ended")
REASON_KINDS = ("order", "user_limit", "limit", "budget", "capacity", "pending")
PREEMPT_KINDS = ("reclaimed", "budget", "unstarted", "rebalanced")
TOLERANCE_HOURS = 0.01
TOLERANCE_SHARE = 0.001

HOLDS = object()
"""What a kind's check returns when the expectation holds (else: what it found)."""


@dataclass(frozen=True)
class Known:
    """The names a scenario defines, against which an expectation's names are checked: the
    groups, pools and compute resources of the estate and of every ``set``, and the task ids
    submitted."""

    groups: set[str]
    pools: set[str]
    resources: set[str]
    tasks: set[str]
    policies: set[str] = field(default_factory=set)

    def of(self, subject: str) -> set[str]:
        return {
            "group": self.groups,
            "pool": self.pools,
            "compute resource": self.resources,
            "task id": self.tasks,
            "policy": self.policies,
        }[subject]


@dataclass(frozen=True)
class Moment:
    """What a check reads: the estate in force, the engine's state, and the time."""

    index: EstateIndex
    state: State
    now: int


class BadValue(ValueError):
    """An expectation's value a kind does not accept; the message names ``kind.name``."""


Parse = Callable[[Known, str, Any, Callable[[str], None]], Any]
"""``(known, "kind.name", value, report)``: the value as checks compare it; raises BadValue
when it cannot be used, and calls ``report`` for problems that still leave one."""
Check = Callable[[Moment, str, Any], Any]
"""``(moment, name, wanted)``: HOLDS, or what was found instead."""


@dataclass(frozen=True)
class Kind:
    name: str
    subject: str
    """What each key names: group | pool | compute resource | task id."""
    parse: Parse
    check: Check


# ----------------------------------------------------------------------- values at load time
def _number(known: Known, label: str, val: Any, report: Callable[[str], None]) -> float:
    if isinstance(val, bool) or not isinstance(val, (int, float)):
        raise BadValue(f"{label}: expected a number, found {val!r}")
    return float(val)


def _task_state(known: Known, label: str, val: Any, report: Callable[[str], None]) -> Any:
    if val not in TASK_STATES:
        report(f"{label}: expected one of {', '.join(TASK_STATES)}")
    return val


def _pool(known: Known, label: str, val: Any, report: Callable[[str], None]) -> Any:
    if str(val) not in known.pools:
        report(f"{label}: unknown pool {val!r}")
    return val


def _reason(known: Known, label: str, val: Any, report: Callable[[str], None]) -> Any:
    if val not in REASON_KINDS:  # "pending" is accepted but not advertised
        report(f"{label}: expected one of {', '.join(REASON_KINDS[:-1])}")
    return val


def _preempt(known: Known, label: str, val: Any, report: Callable[[str], None]) -> Any:
    count = isinstance(val, int) and not isinstance(val, bool) and val >= 0
    if not (val in PREEMPT_KINDS or count):
        report(f"{label}: expected reclaimed, budget, unstarted, rebalanced or a count")
    return val


def _bool(known: Known, label: str, val: Any, report: Callable[[str], None]) -> Any:
    if not isinstance(val, bool):
        report(f"{label}: expected true or false, found {val!r}")
    return val


def _task_list(known: Known, label: str, val: Any, report: Callable[[str], None]) -> list[str]:
    if not isinstance(val, list):
        raise BadValue(f"{label}: expected a list of task ids")
    for tid in val:
        if str(tid) not in known.tasks:
            report(f"{label}: unknown task id {tid!r}")
    return [str(x) for x in val]


# ------------------------------------------------------------------------- checks at run time
def _gpus(used: Callable[[State], dict[str, int]]) -> Check:
    def check(m: Moment, name: str, want: float) -> Any:
        got = used(m.state).get(name, 0)
        return HOLDS if got == gpus_to_milli(want) else milli_str(got)

    return check


def _check_running(m: Moment, name: str, want: float) -> Any:
    """GPUs placed in the group's subtree (organisation.md: a group with groups below it
    counts them)."""
    got = m.state.used_by(name)
    return HOLDS if got == gpus_to_milli(want) else milli_str(got)


def _task_or(m: Moment, name: str) -> Any:
    t = m.state.tasks.get(name)
    return t.state if t is not None else "not submitted yet"


def _check_state(m: Moment, name: str, want: Any) -> Any:
    got = _task_or(m, name)
    return HOLDS if got == want else got


def _check_placed_on(m: Moment, name: str, want: Any) -> Any:
    t = m.state.tasks.get(name)
    got = t.pool if t is not None and t.pool is not None else _task_or(m, name)
    return HOLDS if got == want else got


def _check_queue(m: Moment, name: str, want: list[str]) -> Any:
    got = [t.id for t in m.state.queue(name)]
    return HOLDS if got == want else got


def _check_preempted(m: Moment, name: str, want: Any) -> Any:
    t = m.state.tasks.get(name)
    if t is None:
        return "not submitted yet"
    if isinstance(want, int):
        return HOLDS if t.preemptions == want else t.preemptions
    if t.preemptions == 0:
        return "never preempted"
    if t.last_preempt_kind != want:
        return f"{t.last_preempt_kind} ({t.preemptions}x)"
    return HOLDS


def _hours(got: float, want: float) -> Any:
    return HOLDS if abs(got - want) <= TOLERANCE_HOURS + 1e-9 else round(got, 3)


def _check_budget_used(m: Moment, name: str, want: float) -> Any:
    gi = m.index.groups.get(name)
    if gi is None or gi.budget is None:
        return "the group has no budget"
    units = m.state.weighted_units(name, gi.budget.period, m.now)
    return _hours(unit_hours(units), want)


def _check_gpu_hours(m: Moment, name: str, want: float) -> Any:
    return _hours(unit_hours(m.state.gpu_units(name, m.now)), want)


def _check_lost_gpu_hours(m: Moment, name: str, want: float) -> Any:
    """lending.md: GPU-hours lost by the preemptions of the level's tasks so far (a group
    with groups below it counts its subtree)."""
    return _hours(unit_hours(m.state.lost_gpu_units(name)), want)


def _check_share(m: Moment, name: str, want: float) -> Any:
    """lending.md: the policy's level's current share, borrowed GPUs / lend_weight."""
    g = m.index.group_of_policy.get(name)
    if g is None or g not in m.index.groups:
        return "no such policy in the estate now"
    got = float(share(m.index, m.state, g))
    return HOLDS if abs(got - want) <= TOLERANCE_SHARE + 1e-9 else round(got, 4)


def _check_started(m: Moment, name: str, want: bool) -> Any:
    t = m.state.tasks.get(name)
    if t is None or t.state != "placed":
        return _task_or(m, name)
    return HOLDS if t.started == want else t.started


def _check_waiting_reason(m: Moment, name: str, want: str) -> Any:
    t = m.state.tasks.get(name)
    if t is None or t.state != "queued":
        return _task_or(m, name)
    r = waiting_reason(m.index, m.state, name, m.now)
    if r is not None and r.kind == want:
        return HOLDS
    return f"{r.kind}: {r.text}" if r else None


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind("running", "group", _number, _check_running),
        Kind("pools", "pool", _number, _gpus(lambda s: s.pool_used)),
        Kind("tasks", "task id", _task_state, _check_state),
        Kind("placed_on", "task id", _pool, _check_placed_on),
        Kind("queue", "compute resource", _task_list, _check_queue),
        Kind("preempted", "task id", _preempt, _check_preempted),
        Kind("budget_used", "group", _number, _check_budget_used),
        Kind("gpu_hours", "group", _number, _check_gpu_hours),
        Kind("waiting_reason", "task id", _reason, _check_waiting_reason),
        Kind("started", "task id", _bool, _check_started),
        Kind("lost_gpu_hours", "group", _number, _check_lost_gpu_hours),
        Kind("shares", "policy", _number, _check_share),
    )
}
"""Every expectation kind, in the order scenarios.md lists them (error hints use it)."""
