"""Checking a scenario's expectations against the engine's state at one moment.

Read-only: an expectation looks at the state after everything at its time (scenarios.md), and
must never change what happens next. What each kind compares is its entry in kinds.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kliqued.engine import EstateIndex, State

from .kinds import HOLDS, KINDS, Moment
from .scenario import Expectation


@dataclass(frozen=True)
class Miss:
    at: int
    line: int
    key: str
    expected: Any
    found: Any


def check(exp: Expectation, index: EstateIndex, state: State, now: int) -> list[Miss]:
    """The expectations of ``exp`` that do not hold at ``now``, each with its line."""
    moment = Moment(index, state, now)
    misses: list[Miss] = []
    for kind, items in exp.checks.items():
        for name, want in items.items():
            found = KINDS[kind].check(moment, name, want)
            if found is not HOLDS:
                misses.append(
                    Miss(now, exp.lines.get((kind, name), exp.line), f"{kind}.{name}", want, found)
                )
    return misses
