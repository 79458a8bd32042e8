"""lending.md "Protection": borrowed work younger than its policy's ``protect_for`` is not
taken back by a reclaim or a rebalance.

A task is protected while ``now - placed_at < protect_for`` of its group's policy (the
policy's own value, else the settings'); at exactly ``placed_at + protect_for`` it is no
longer. Kept as two small pure functions so the reclaim, the rebalance and the reason ask
the same question; the moments protections end are kept by the state (a heap), because the
engine must run a pass at each (scenarios.md "the engine must act on its own").
"""

from __future__ import annotations

from .index import EstateIndex
from .task import Task


def protect_ms(index: EstateIndex, t: Task) -> int:
    """How long ``t``'s placements are protected under ``index`` (0: not at all)."""
    gi = index.groups.get(t.group)
    return gi.protect_ms if gi is not None else 0


def protected(index: EstateIndex, t: Task, now: int) -> bool:
    """Whether ``t`` may not be a victim of a reclaim or rebalance at ``now``."""
    if not index.protecting or t.placed_at is None:
        return False
    return now - t.placed_at < protect_ms(index, t)


def protected_until(index: EstateIndex, t: Task) -> int | None:
    """When ``t``'s current protection ends, or None when it has none."""
    ms = protect_ms(index, t)
    if ms <= 0 or t.placed_at is None:
        return None
    return t.placed_at + ms
