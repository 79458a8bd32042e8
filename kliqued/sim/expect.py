"""Checking a scenario's expectations against the engine's state at one moment.

Read-only: an expectation looks at the state after everything at its time (scenarios.md), and
must never change what happens next.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from compiler.units import milli_str

from kliqued.engine import EstateIndex, State, waiting_reason
from kliqued.engine.periods import HOUR_MS

from .scenario import Expectation

TOLERANCE_HOURS = 0.01


@dataclass(frozen=True)
class Miss:
    at: int
    line: int
    key: str
    expected: Any
    found: Any


def _fmt_gpus(milli: int) -> str:
    return milli_str(milli)


def check(exp: Expectation, index: EstateIndex, state: State, now: int) -> list[Miss]:
    misses: list[Miss] = []

    def miss(kind: str, name: str, expected: Any, found: Any) -> None:
        misses.append(Miss(now, exp.lines.get((kind, name), exp.line), f"{kind}.{name}",
                           expected, found))

    for kind, items in exp.checks.items():
        for name, want in items.items():
            if kind == "running":
                got = state.used.get(name, 0)
                if abs(got - round(want * 1000)) > 0:
                    miss(kind, name, want, _fmt_gpus(got))
            elif kind == "pools":
                got = state.pool_used.get(name, 0)
                if abs(got - round(want * 1000)) > 0:
                    miss(kind, name, want, _fmt_gpus(got))
            elif kind == "tasks":
                t = state.tasks.get(name)
                task_state = t.state if t is not None else "not submitted yet"
                if task_state != want:
                    miss(kind, name, want, task_state)
            elif kind == "placed_on":
                t = state.tasks.get(name)
                where = (t.pool if t is not None and t.pool is not None
                         else (t.state if t is not None else "not submitted yet"))
                if where != want:
                    miss(kind, name, want, where)
            elif kind == "queue":
                ids = [t.id for t in state.queue(name)]
                if ids != want:
                    miss(kind, name, want, ids)
            elif kind == "preempted":
                t = state.tasks.get(name)
                if t is None:
                    miss(kind, name, want, "not submitted yet")
                elif isinstance(want, int):
                    if t.preemptions != want:
                        miss(kind, name, want, t.preemptions)
                elif t.preemptions == 0 or t.last_preempt_kind != want:
                    found = ("never preempted" if t.preemptions == 0 else
                             f"{t.last_preempt_kind} ({t.preemptions}x)")
                    miss(kind, name, want, found)
            elif kind == "budget_used":
                gi = index.groups.get(name)
                if gi is None or gi.budget is None:
                    miss(kind, name, want, "the group has no budget")
                    continue
                units = state.weighted_units(name, gi.budget.period, now)
                hours = units / (1000 * HOUR_MS)
                if abs(hours - want) > TOLERANCE_HOURS + 1e-9:
                    miss(kind, name, want, round(hours, 3))
            elif kind == "gpu_hours":
                hours = state.gpu_units(name, now) / (1000 * HOUR_MS)
                if abs(hours - want) > TOLERANCE_HOURS + 1e-9:
                    miss(kind, name, want, round(hours, 3))
            elif kind == "started":
                t = state.tasks.get(name)
                if t is None or t.state != "placed":
                    miss(kind, name, want, t.state if t is not None else "not submitted yet")
                elif t.started != want:
                    miss(kind, name, want, t.started)
            elif kind == "waiting_reason":
                t = state.tasks.get(name)
                if t is None or t.state != "queued":
                    miss(kind, name, want, t.state if t is not None else "not submitted yet")
                    continue
                r = waiting_reason(index, state, name, now)
                if r is None or r.kind != want:
                    miss(kind, name, want, f"{r.kind}: {r.text}" if r else None)
    return misses
