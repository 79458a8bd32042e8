"""The what-if of a plan as data: real demand replayed on the base and on the head.

``kliqued plan --what-if`` replays a demand file (``kliqued demand export``) on both
estates from the same starting state, on the simulator (kliqued/whatif, which the compiler
may not import: it fills these records and hands them to ``make_plan``). Here: the figures
and the lines every renderer shares, so the four formats cannot disagree on the comparison.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from klique_util.fmt import amount

PREEMPT_KINDS = ("reclaimed", "rebalanced", "budget")
"""Preemptions the what-if counts per group and pool: a reclaim, a rebalance (only with
``settings.lending.order: fair``, lending.md), a used-up budget."""


@dataclass(frozen=True)
class Figures:
    """One group's (or all groups') outcome on one side."""

    tasks: int = 0
    placed: int = 0
    never_placed: int = 0
    wait_p50_s: float | None = None
    wait_p95_s: float | None = None
    wait_max_s: float | None = None
    over_threshold: int = 0
    """Tasks that waited longer than the threshold for their first placement (never placed
    ones included)."""
    gpu_hours: float = 0.0
    preemptions: dict[str, int] = field(default_factory=dict)
    exhaustions: tuple[str, ...] = ()
    """The start of each budget period in which the group's budget ran out (RFC 3339)."""
    cost: float | None = None
    """GPU-hours x the price of each pool's GPU type at the replay's start; None: no price."""
    lost_gpu_hours: float = 0.0
    """GPU-hours of work its tasks' preemptions threw away (size x the placed time since
    the last checkpoint, else since the placement: lending.md's lost work)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "tasks": self.tasks,
            "placed": self.placed,
            "never_placed": self.never_placed,
            "wait_s": {"p50": self.wait_p50_s, "p95": self.wait_p95_s, "max": self.wait_max_s},
            "over_threshold": self.over_threshold,
            "gpu_hours": self.gpu_hours,
            "preemptions": {k: self.preemptions.get(k, 0) for k in PREEMPT_KINDS},
            "budget_exhaustions": list(self.exhaustions),
            "cost": self.cost,
            "lost_gpu_hours": self.lost_gpu_hours,
        }


@dataclass(frozen=True)
class PoolFigures:
    """One pool on one side; waits are of the tasks whose first placement was there."""

    capacity: float
    gpu_hours: float
    utilisation: float | None
    placed: int = 0
    wait_p50_s: float | None = None
    wait_p95_s: float | None = None
    wait_max_s: float | None = None
    over_threshold: int = 0
    preemptions: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity,
            "gpu_hours": self.gpu_hours,
            "utilisation": self.utilisation,
            "placed": self.placed,
            "wait_s": {"p50": self.wait_p50_s, "p95": self.wait_p95_s, "max": self.wait_max_s},
            "over_threshold": self.over_threshold,
            "preemptions": {k: self.preemptions.get(k, 0) for k in PREEMPT_KINDS},
        }


@dataclass(frozen=True)
class Row:
    """A group (``all`` for every group) or a pool, base against head; None: absent there."""

    name: str
    base: Any
    head: Any


@dataclass(frozen=True)
class Refused:
    """A task of the demand one side cannot take, and why (the engine's submission rule)."""

    task: str
    line: int
    resource: str
    user: str
    field: str
    message: str


@dataclass(frozen=True)
class WhatIf:
    source: str
    """The demand file, or the daemon's URL it was read from."""
    tasks: int
    """Rows of the demand."""
    skipped: int
    """Rows left out: cancelled before they ever ran (nothing to replay)."""
    start: str
    end_base: str
    end_head: str
    threshold_s: int
    currency: str
    groups: tuple[Row, ...]
    """Per group, then ``all``."""
    pools: tuple[Row, ...]
    refused_head: tuple[Refused, ...] = ()
    """Demand the head cannot take (a removed compute resource, a size above a limit)."""
    refused_base: tuple[Refused, ...] = ()
    """Demand the base cannot take (the demand ran on another revision)."""
    horizon_base: bool = False
    """A side stopped at its horizon with work left."""
    horizon_head: bool = False
    lending: tuple[str, ...] = ()
    """What the head changes of lending.md's settings (``settings.lending.order``, a
    policy's ``lend_weight``, ...); when any, the tables add each group's lost GPU-hours
    beside its reclaims and rebalances."""

    @property
    def changed_groups(self) -> list[Row]:
        return [r for r in self.groups if r.base != r.head]


# ------------------------------------------------------------------ shared wording


def duration(seconds: float | None) -> str:
    """``-``, ``45s``, ``12m``, ``1h``, ``3h05m``, ``2d04h``: short enough for a table
    cell."""
    if seconds is None:
        return "-"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    m, _ = divmod(s, 60)
    if m < 60:
        return f"{m}m"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h{m:02d}m" if m else f"{h}h"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h" if h else f"{d}d"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.1f}%"


def _cost(x: float | None, currency: str) -> str:
    return "-" if x is None else f"{amount(x, grouped=True)} {currency}"


def pair(before: str, after: str) -> str:
    """``a -> b``, or ``a`` when both sides read the same."""
    return before if before == after else f"{before} -> {after}"


GROUP_COLUMNS = (
    "group",
    "tasks",
    "wait p50",
    "wait p95",
    "wait max",
    "over {t}",
    "GPU-hours",
    "preempted",
    "budget ran out",
    "cost",
)
POOL_COLUMNS = (
    "pool",
    "capacity",
    "wait p50",
    "wait p95",
    "wait max",
    "over {t}",
    "GPU-hours",
    "utilisation",
    "preempted",
)


def _preempted(f: Figures | PoolFigures) -> str:
    return (
        ", ".join(
            f"{f.preemptions.get(k, 0)} {k}" for k in PREEMPT_KINDS if f.preemptions.get(k, 0)
        )
        or "0"
    )


def _exhausted(f: Figures) -> str:
    if not f.exhaustions:
        return "0"
    first = f.exhaustions[0][:10]
    return f"{len(f.exhaustions)} (from {first})" if len(f.exhaustions) > 1 else f"1 ({first})"


LOST_AFTER = GROUP_COLUMNS.index("preempted") + 1
"""Where the ``lost GPU-hours`` column goes when the head changes lending settings."""


def _group_cells(f: Figures | None, w: WhatIf) -> list[str]:
    if f is None:
        return ["-"] * (len(GROUP_COLUMNS) - 1 + bool(w.lending))
    cells = [
        f"{f.tasks:,}",
        duration(f.wait_p50_s),
        duration(f.wait_p95_s),
        duration(f.wait_max_s),
        f"{f.over_threshold:,}",
        amount(f.gpu_hours, grouped=True),
        _preempted(f),
        _exhausted(f),
        _cost(f.cost, w.currency),
    ]
    if w.lending:
        cells.insert(LOST_AFTER - 1, amount(f.lost_gpu_hours, grouped=True))
    return cells


def group_header(w: WhatIf) -> list[str]:
    """The group table's columns; ``lost GPU-hours`` after ``preempted`` when the head
    changes lending settings (lending.md: the plan shows their impact), so the tables of
    other changes stay as narrow as they were."""
    cols = [c.format(t=duration(w.threshold_s)) for c in GROUP_COLUMNS]
    if w.lending:
        cols.insert(LOST_AFTER, "lost GPU-hours")
    return cols


def group_cells(w: WhatIf) -> list[list[str]]:
    """Each group's row: every cell ``base -> head`` where they differ."""
    out = []
    for r in w.groups:
        b, h = _group_cells(r.base, w), _group_cells(r.head, w)
        out.append([r.name, *(pair(x, y) for x, y in zip(b, h))])
    return out


def pool_header(w: WhatIf) -> list[str]:
    return [c.format(t=duration(w.threshold_s)) for c in POOL_COLUMNS]


def _pool_cells(p: PoolFigures | None) -> list[str]:
    if p is None:
        return ["-"] * (len(POOL_COLUMNS) - 1)
    return [
        f"{p.capacity:g}",
        duration(p.wait_p50_s),
        duration(p.wait_p95_s),
        duration(p.wait_max_s),
        f"{p.over_threshold:,}",
        amount(p.gpu_hours, grouped=True),
        _pct(p.utilisation),
        _preempted(p),
    ]


def pool_cells(w: WhatIf) -> list[list[str]]:
    """Each pool's row, cells ``base -> head`` where they differ."""
    return [
        [r.name, *(pair(x, y) for x, y in zip(_pool_cells(r.base), _pool_cells(r.head)))]
        for r in w.pools
    ]


def title(w: WhatIf) -> str:
    skipped = f", {w.skipped:,} cancelled before running left out" if w.skipped else ""
    return (
        f"What if: {w.tasks:,} tasks of real demand ({w.source}, from {w.start}{skipped}) "
        f"replayed on the base and on the head, from the same empty start:"
    )


def _names(items: list[str], limit: int = 3) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit:,} more" if len(items) > limit else "")


def refused_lines(w: WhatIf, limit: int = 20) -> list[str]:
    """Demand a side cannot take, named (never silently dropped): one line per reason
    (compute resource, field, the engine's message) with its tasks and users."""
    lines = []
    for side, refused in (("head", w.refused_head), ("base", w.refused_base)):
        if not refused:
            continue
        both = " (left out of both sides)" if side == "head" else ""
        lines.append(
            f"{len(refused):,} task{'s' if len(refused) != 1 else ''} of the demand "
            f"the {side} cannot take{both}:"
        )
        reasons: dict[tuple[str, str, str], list[Refused]] = {}
        for r in refused:
            reasons.setdefault((r.resource, r.field, r.message), []).append(r)
        for n, ((resource, fld, message), rs) in enumerate(reasons.items()):
            if n == limit:
                lines.append(
                    f"  ... and {len(reasons) - limit:,} more reasons (the JSON plan "
                    "lists every task)"
                )
                break
            users = sorted({r.user for r in rs})
            lines.append(
                f"  {len(rs):,} on {resource} ({_names([r.task for r in rs])}; "
                f"{_names(users)}): {fld}: {message}"
            )
    return lines


def lending_lines(w: WhatIf) -> list[str]:
    """The lending settings the head changes, said once above the tables' reading."""
    if not w.lending:
        return []
    return [
        f"The head changes lending ({', '.join(w.lending)}): each group's reclaims, "
        "rebalances and lost GPU-hours are in its row."
    ]


def horizon_lines(w: WhatIf) -> list[str]:
    sides = [s for s, h in (("base", w.horizon_base), ("head", w.horizon_head)) if h]
    if not sides:
        return []
    return [
        f"The {' and '.join(sides)} replay stopped at its horizon with work left "
        "(tasks that never finish there)."
    ]


def whatif_json(w: WhatIf) -> dict[str, Any]:
    def side(r: Row, which: str) -> Any:
        v = getattr(r, which)
        return None if v is None else v.to_json()

    def refused(rs: tuple[Refused, ...]) -> list[dict[str, Any]]:
        return [
            {
                "task": r.task,
                "line": r.line,
                "resource": r.resource,
                "user": r.user,
                "field": r.field,
                "message": r.message,
            }
            for r in rs
        ]

    return {
        "source": w.source,
        "tasks": w.tasks,
        "skipped": w.skipped,
        "start": w.start,
        "end": {"base": w.end_base, "head": w.end_head},
        "stopped_at_horizon": {"base": w.horizon_base, "head": w.horizon_head},
        "wait_threshold_s": w.threshold_s,
        "currency": w.currency,
        "lending_changes": list(w.lending),
        "groups": {r.name: {"base": side(r, "base"), "head": side(r, "head")} for r in w.groups},
        "pools": {r.name: {"base": side(r, "base"), "head": side(r, "head")} for r in w.pools},
        "refused": {"head": refused(w.refused_head), "base": refused(w.refused_base)},
    }
