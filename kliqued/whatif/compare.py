"""Replays one demand on the base and the head estate and compares the two runs.

Both runs start from the same state: empty, at the first submission of the demand, every
budget unspent, so a difference between them is the estate's and nothing else. A task a
side cannot take (its compute resource is gone, its size is above a limit or a profile's
maximum, its user left the group) is named for that side; a task the head cannot take is
left out of both runs, so the two compare the same work. The replays are the simulator's
(kliqued/sim/trace.py: the daemon's engine in simulated time): no wall clock enters them,
so the same demand and estates give the same figures.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from decimal import Decimal
from typing import Sequence

from compiler.compiled import CompiledEstate
from compiler.plan.whatif import Figures, PoolFigures, Refused, Row, WhatIf
from compiler.units import parse_time
from klique_util.units import SECOND_MS, UNITS_PER_HOUR, to_ms
from kliqued.engine import EstateIndex, Placement, Preemption, SubmissionError, check_submission
from kliqued.engine.periods import format_time
from kliqued.sim.report import Report
from kliqued.sim.trace import Replay, Trace, TraceTask

from .demand import DemandTask

DEFAULT_THRESHOLD_S = 3600
"""A task that waited longer than this for its first placement counts as waiting long."""
PARALLEL_MIN_TASKS = 2000
"""From this many tasks the head's replay runs in a child process beside the base's (on a
machine with two CPUs or more): below it a replay takes well under a second, less than
what starting a process costs to pay back."""


def _accepted(
    rows: Sequence[DemandTask], index: EstateIndex
) -> tuple[list[DemandTask], list[Refused]]:
    """The rows ``index`` takes (the engine's submission rule), and the others, named."""
    ok: list[DemandTask] = []
    refused: list[Refused] = []
    for r in rows:
        try:
            check_submission(index, r.resource, r.user, r.project, r.gpus_milli)
        except SubmissionError as exc:
            refused.append(Refused(r.id, r.line, r.resource, r.user, exc.field, str(exc)))
            continue
        ok.append(r)
    return ok, refused


def _prices(estate: CompiledEstate, at: int) -> dict[str, Decimal]:
    """Per GPU type, the price in effect at ``at`` (the replay's start)."""
    best: dict[str, tuple[int, Decimal]] = {}
    for p in estate.pricing:
        since = to_ms(parse_time(p.effective_from))
        if since <= at and (p.gpu_type not in best or since >= best[p.gpu_type][0]):
            best[p.gpu_type] = (since, Decimal(p.per_gpu_hour))
    return {g: price for g, (_, price) in best.items()}


def _pct(sorted_ms: list[int], q: float) -> float | None:
    """Nearest rank, in seconds: the trace report's rule (kliqued/sim/report.py)."""
    if not sorted_ms:
        return None
    return sorted_ms[max(0, math.ceil(q * len(sorted_ms)) - 1)] / SECOND_MS


class _Replay(Replay):
    """The trace replay, also noting per pool the waits of the tasks first placed there
    and the preemptions there (the trace report has them per group only), and per group
    its preemptions of every kind (rebalances too) and the work they lost (lending.md)."""

    def __init__(self, trace: Trace, estate: CompiledEstate) -> None:
        super().__init__(trace, estate)
        self.pool_waits: dict[str, list[int]] = {}
        self.pool_preempted: dict[str, dict[str, int]] = {}
        self.group_preempted: dict[str, dict[str, int]] = {}
        self.lost_units: dict[str, int] = {}
        """Per group: milli-GPU x ms its tasks' preemptions lost."""

    def on_decision(self, now: int, d: object) -> None:
        if isinstance(d, Placement):
            at = self.collector.submit_at.get(d.task)
            if at is not None:
                self.pool_waits.setdefault(d.pool, []).append(now - at)
        elif isinstance(d, Preemption):
            for kinds in (
                self.pool_preempted.setdefault(d.pool, {}),
                self.group_preempted.setdefault(d.group, {}),
            ):
                kinds[d.kind] = kinds.get(d.kind, 0) + 1
            self.lost_units[d.group] = self.lost_units.get(d.group, 0) + d.size_milli * d.lost_ms
        super().on_decision(now, d)


class _Run:
    """One side's replay and the figures read from it."""

    def __init__(
        self,
        rows: Sequence[DemandTask],
        estate: CompiledEstate,
        index: EstateIndex,
        start: int,
        source: str,
        threshold_s: int,
    ) -> None:
        tasks = [
            TraceTask(
                r.line,
                r.id,
                r.at,
                r.resource,
                r.user,
                r.project,
                r.gpus_milli,
                r.runtime_ms,
                None,
                index.resources[r.resource].group,
            )
            for r in rows
        ]
        self.replay = _Replay(Trace(source, start, tasks), estate)
        self.report: Report = self.replay.run()
        self.estate = estate
        self.threshold_ms = threshold_s * SECOND_MS
        self.prices = _prices(estate, start)
        self.gpu_type = {p.name: p.gpu_type for p in estate.pools}

    @property
    def end(self) -> str:
        return str(self.report.data["end"])

    @property
    def at_horizon(self) -> bool:
        return bool(self.report.data["stopped_at_horizon"])

    def figures(self, groups: Sequence[str], stats: dict) -> Figures:
        col = self.replay.collector
        waits = [w for g in groups for w in col.waits.get(g, ())]
        over = sum(w > self.threshold_ms for w in waits) + stats["never_placed"]
        cost: Decimal | None = None
        for (pool, g), area in sorted(col.gpu_area.items()):
            price = self.prices.get(self.gpu_type.get(pool, ""))
            if g in groups and area and price is not None:
                cost = (cost or Decimal(0)) + price * Decimal(area) / UNITS_PER_HOUR
        exhausted = tuple(sorted(format_time(at) for g, at in col.exhausted if g in groups))
        w = stats["wait_s"]
        kinds: dict[str, int] = {}
        for g in groups:
            for k, n in self.replay.group_preempted.get(g, {}).items():
                kinds[k] = kinds.get(k, 0) + n
        lost = sum(self.replay.lost_units.get(g, 0) for g in groups)
        return Figures(
            stats["tasks"],
            stats["placed"],
            stats["never_placed"],
            w["p50"],
            w["p95"],
            w["max"],
            over,
            stats["gpu_hours"],
            kinds,
            exhausted,
            None if cost is None else round(float(cost), 2),
            round(lost / UNITS_PER_HOUR, 3),
        )

    def group_figures(self) -> dict[str, Figures]:
        data = self.report.data
        out = {g: self.figures([g], s) for g, s in data["groups"].items()}
        out["all"] = self.figures(list(data["groups"]), data["overall"])
        return out

    def pool_figures(self) -> dict[str, PoolFigures]:
        out = {}
        for name, p in self.report.data["pools"].items():
            waits = sorted(self.replay.pool_waits.get(name, ()))
            out[name] = PoolFigures(
                p["capacity"],
                p["gpu_hours"],
                p["utilisation"],
                len(waits),
                _pct(waits, 0.50),
                _pct(waits, 0.95),
                _pct(waits, 1.0),
                sum(w > self.threshold_ms for w in waits),
                dict(self.replay.pool_preempted.get(name, {})),
            )
        return out


@dataclass(frozen=True)
class Side:
    """What the comparison reads of one side's replay: its figures per group and per pool,
    when it ended and whether at the horizon. Plain records, so that a side replayed in a
    child process comes back whole (the replay's state stays in the child)."""

    groups: dict[str, Figures]
    pools: dict[str, PoolFigures]
    end: str
    at_horizon: bool


def replay_side(
    rows: Sequence[DemandTask], estate: CompiledEstate, start: int, source: str, threshold_s: int
) -> Side:
    """One side replayed and read: the function a child process runs for the head."""
    run = _Run(rows, estate, EstateIndex.build(estate), start, source, threshold_s)
    return Side(run.group_figures(), run.pool_figures(), run.end, run.at_horizon)


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _two_sides(
    rows: Sequence[DemandTask],
    base: CompiledEstate,
    head: CompiledEstate,
    start: int,
    source: str,
    threshold_s: int,
    parallel: bool | None,
) -> tuple[Side, Side]:
    """Both sides' replays: the head's in a forked child while this process replays the
    base, when ``parallel`` (None: on Linux with two CPUs or more, and at least
    ``PARALLEL_MIN_TASKS`` tasks). The replays are deterministic and share nothing, so the
    figures are the same either way (tests/whatif/test_parallel.py); a child that dies
    (killed, out of memory) costs only time: its side is replayed here."""
    if parallel is None:
        parallel = (
            len(rows) >= PARALLEL_MIN_TASKS
            and _cpus() > 1
            and sys.platform == "linux"  # fork is safe here; macOS's frameworks are not
        )
    if not parallel:
        first = replay_side(rows, base, start, source, threshold_s)
        return first, replay_side(rows, head, start, source, threshold_s)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as pool:
        future = pool.submit(replay_side, rows, head, start, source, threshold_s)
        first = replay_side(rows, base, start, source, threshold_s)
        try:
            return first, future.result()
        except BrokenProcessPool:
            return first, replay_side(rows, head, start, source, threshold_s)


def lending_changes(base: CompiledEstate, head: CompiledEstate) -> tuple[str, ...]:
    """What the head changes of lending.md's settings, named as the estate writes them
    (``settings.lending.order``, ``lend_weight of team-a``): the plan then shows each
    group's reclaims, rebalances and lost GPU-hours."""
    out = [
        f"settings.lending.{k}"
        for k in ("order", "protect_for_s", "victims")
        if getattr(base.settings.lending, k) != getattr(head.settings.lending, k)
    ]
    out = [x.removesuffix("_s") for x in out]
    old = {p.name: p for p in base.policies}
    for p in head.policies:
        was = old.get(p.name)
        if was is None:
            continue
        for k, shown in (("lend_weight_milli", "lend_weight"), ("protect_for_s", "protect_for")):
            if getattr(was, k) != getattr(p, k):
                out.append(f"{shown} of {p.name}")
    return tuple(out)


def what_if(
    rows: Sequence[DemandTask],
    base: CompiledEstate,
    head: CompiledEstate,
    source: str,
    threshold_s: int = DEFAULT_THRESHOLD_S,
    skipped: int = 0,
    parallel: bool | None = None,
    cache: dict[tuple[str, int], Side] | None = None,
) -> WhatIf:
    """The comparison of ``rows`` replayed on ``base`` and on ``head`` (the two replays
    side by side in two processes: ``_two_sides``).

    Rows cancelled before they ever ran are not replayed (nothing ran, so nothing is asked
    of the estate); ``skipped`` counts those the caller left out already. ``cache``: the
    sides replayed, kept by (estate revision, rows replayed) across calls with the same
    ``rows``, so a caller comparing several heads with one base (``kliqued advise``)
    replays the base once."""
    live = [r for r in rows if not (r.status == "cancelled" and r.runtime_ms == 0)]
    skipped += len(rows) - len(live)
    base_idx, head_idx = EstateIndex.build(base), EstateIndex.build(head)
    head_ok, refused_head = _accepted(live, head_idx)
    both, refused_base = _accepted(head_ok, base_idx)
    start = live[0].at if live else 0
    kb, kh = (base.revision, len(both)), (head.revision, len(both))
    kept_b = cache.get(kb) if cache is not None else None
    kept_h = cache.get(kh) if cache is not None else None
    if head.revision == base.revision:  # a plan without changes: one replay is both
        first = second = kept_b or replay_side(both, base, start, source, threshold_s)
    elif kept_b is not None:
        first = kept_b
        second = kept_h or replay_side(both, head, start, source, threshold_s)
    else:
        first, second = _two_sides(both, base, head, start, source, threshold_s, parallel)
    if cache is not None:
        cache[kb], cache[kh] = first, second
    gb, gh = first.groups, second.groups
    names = sorted((set(gb) | set(gh)) - {"all"}) + ["all"]
    groups = tuple(Row(n, gb.get(n), gh.get(n)) for n in names)
    pb, ph = first.pools, second.pools
    pools = tuple(Row(n, pb.get(n), ph.get(n)) for n in sorted(set(pb) | set(ph)))
    return WhatIf(
        source,
        len(rows),
        skipped,
        format_time(start) if live else "-",
        first.end,
        second.end,
        threshold_s,
        head.settings.currency,
        groups,
        pools,
        tuple(refused_head),
        tuple(refused_base),
        first.at_horizon,
        second.at_horizon,
        lending_changes(base, head),
    )
