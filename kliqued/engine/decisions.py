"""What a pass decides: plain frozen records, so the daemon can persist them and the simulator
can print and check them without knowing the engine's internals."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from klique_util.units import SECOND_MS, duration_str, from_milli, unit_hours

Phase = Literal["reserve", "reclaim", "lend", "rebalance"]
PreemptKind = Literal["reclaimed", "budget", "unstarted", "rebalanced"]
ReasonKind = Literal["order", "user_limit", "limit", "budget", "capacity", "pending", "worker"]
"""Why a task waits; ``worker`` is the daemon's (placed, no worker has taken it yet)."""

UNSTARTED: Final = "unstarted"
"""Preemption kind of a placed task no worker took within its pool's start timeout."""


def unstarted_text(pool: str, timeout_ms: int) -> str:
    """``requeued: not started within 5m on onprem``."""
    return f"requeued: not started within {duration_str(timeout_ms // SECOND_MS)} on {pool}"


def no_worker_text(pool: str) -> str:
    return f"no live worker in {pool}"


def no_autoscaler_text(pool: str) -> str:
    """An autoscaled pool with no live worker and no autoscaler heartbeating: nothing would
    start what it is given (docs/decisions.md N7)."""
    return f"no autoscaler running for {pool}"


def recalled_text(pool: str) -> str:
    """``requeued: onprem has a live worker again`` (an earlier pool of the profile)."""
    return f"requeued: {pool} has a live worker again"


def no_autoscaler_requeue_text(pool: str) -> str:
    """``requeued: no autoscaler running for aws-eu-burst``."""
    return f"requeued: {no_autoscaler_text(pool)}"


@dataclass(frozen=True, slots=True)
class Placement:
    task: str
    resource: str
    group: str
    pool: str
    size_milli: int
    phase: Phase
    """Which phase placed it: reservations filled, a reclaim made room, or idle capacity lent."""


@dataclass(frozen=True, slots=True)
class Preemption:
    task: str
    resource: str
    group: str
    pool: str
    kind: PreemptKind
    text: str
    """As a person reads it: ``reclaimed by team-a`` or ``budget used up``."""
    by: str | None = None
    """The group whose reclaim (or rebalance) took it, or None for a budget."""
    size_milli: int = 0
    """The task's size, for its lost GPU-hours."""
    lost_ms: int = 0
    """lending.md's lost work at that moment: placed time since its last checkpoint in the
    placement it lost (else since it was placed)."""

    @property
    def lost_gpu_hours(self) -> float:
        """size x lost work, in GPU-hours: what the ledger keeps per preemption."""
        return unit_hours(self.size_milli * self.lost_ms)


@dataclass(frozen=True, slots=True)
class Cancellation:
    task: str
    resource: str
    group: str
    text: str
    """e.g. ``compute resource team-a/standard was removed from the estate``."""


@dataclass(frozen=True, slots=True)
class Reason:
    kind: ReasonKind
    text: str


@dataclass(frozen=True, slots=True)
class Alert:
    policy: str
    group: str
    threshold_milli: int
    """The ``alert_at`` fraction crossed, in thousandths (800 = 0.8)."""
    period_start: int
    used_units: int
    budget_units: int
    text: str


@dataclass(frozen=True, slots=True)
class BudgetStatus:
    """One policy's budget as the policy view shows it ("seen before it hits")."""

    policy: str
    group: str
    period: str
    period_start: int
    resets_at: int
    budget_units: int
    """``hours_milli * HOUR_MS``: the same units as charges (weight milli x ms)."""
    used_units: int
    burn_rate_milli: int
    """Budget hours per hour, in milli: the sum of the weights of the group's placed tasks."""
    runout_at: int | None
    """When the budget runs out at the current rate, if before the reset; None otherwise."""

    @property
    def left_units(self) -> int:
        return self.budget_units - self.used_units

    @property
    def used_hours(self) -> float:
        return unit_hours(self.used_units)

    @property
    def left_hours(self) -> float:
        return unit_hours(self.left_units)

    @property
    def burn_rate(self) -> float:
        return from_milli(self.burn_rate_milli)
