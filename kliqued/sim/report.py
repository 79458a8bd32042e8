"""What a trace replay reports, per group and overall (scenarios.md, "A trace ...").

- **Utilisation per pool**: the time-weighted GPUs placed on the pool divided by its capacity,
  over the replay (from its start to the last moment anything happened). Per group: the
  group's share of each pool's capacity over the same window.
- **Wait**: from submission to the first placement (a preempted task's later waits are not
  counted again), p50, p95 (nearest rank) and max, over the tasks that were placed.
- **Preemptions** by reason kind (``reclaimed``, ``rebalanced``, ``budget``), counted on the
  preempted task's group.
- **Lost GPU-hours**: size x lost work of the group's preemptions (lending.md: placed time
  since the last checkpoint of the placement it lost), the measure the ledger keeps.
- **GPU-hours**: GPUs held x hours placed (the ledger's measure).
- **Budget hours**: time weight x hours placed (what budgets are charged).
- **Budget exhaustions**: how many times a policy's budget ran out: the periods in which it
  was used up.

The collector is fed by the replay's hooks, a constant amount of work per decision, so
reporting does not slow a replay down; the report is a plain JSON-able dict, the same for the
same trace and estate (no wall-clock times in it).
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from klique_util.fmt import amount
from klique_util.units import HOUR_S, SECOND_MS, UNITS_PER_HOUR, milli_str, ms_to_hours, unit_hours
from kliqued.engine import EstateIndex, Placement, Preemption, State
from kliqued.engine.budget import remaining
from kliqued.engine.periods import format_time, period_start

if TYPE_CHECKING:
    from .records import Trace

PREEMPT_KINDS = ("reclaimed", "rebalanced", "budget")
"""The kinds a replay can produce (``unstarted`` needs pools without live workers, which a
trace does not have), in the what-if's order."""


class Collector:
    def __init__(self, index: EstateIndex, state: State, start: int) -> None:
        self.index = index
        self.state = state
        self.start = start
        self.last_activity = start
        self.submit_at: dict[str, int] = {}
        """Tasks not placed yet: their submission time."""
        self.group_of: dict[str, str] = {}
        self.tasks: dict[str, int] = {}
        self.finished: dict[str, int] = {}
        self.waits: dict[str, list[int]] = {}
        self.open: dict[str, tuple[str, str, int, int, int]] = {}
        """Placed tasks: (pool, group, size milli, weight milli, placed at)."""
        self.gpu_area: dict[tuple[str, str], int] = {}
        """(pool, group): milli-GPU x ms."""
        self.weighted: dict[str, int] = {}
        self.preemptions: dict[str, dict[str, int]] = {}
        self.lost_units: dict[str, int] = {}
        """group: milli-GPU x ms of work its preemptions threw away."""
        self.exhausted: set[tuple[str, int]] = set()

    # ------------------------------------------------------------------ events
    def submitted(self, tid: str, group: str, now: int) -> None:
        self.submit_at[tid] = now
        self.group_of[tid] = group
        self.tasks[group] = self.tasks.get(group, 0) + 1
        self.last_activity = now

    def placed(self, d: Placement, now: int) -> None:
        tid = d.task
        at = self.submit_at.pop(tid, None)
        if at is not None:
            w = self.waits.get(d.group)
            if w is None:
                w = self.waits[d.group] = []
            w.append(now - at)
        t = self.state.tasks[tid]
        self.open[tid] = (d.pool, d.group, d.size_milli, t.weight, now)
        self.last_activity = now

    def _close(self, tid: str, now: int) -> None:
        rec = self.open.pop(tid, None)
        if rec is None:
            return
        pool, group, size, weight, since = rec
        dt = now - since
        key = (pool, group)
        self.gpu_area[key] = self.gpu_area.get(key, 0) + size * dt
        self.weighted[group] = self.weighted.get(group, 0) + weight * dt
        self.last_activity = now

    def preempted(self, d: Preemption, now: int) -> None:
        self._close(d.task, now)
        p = self.preemptions.get(d.group)
        if p is None:
            p = self.preemptions[d.group] = {}
        p[d.kind] = p.get(d.kind, 0) + 1
        self.lost_units[d.group] = self.lost_units.get(d.group, 0) + d.size_milli * d.lost_ms
        if d.kind == "budget":
            gi = self.index.groups.get(d.group)
            if gi is not None and gi.budget is not None:
                self.exhausted.add((d.group, period_start(gi.budget.period, now)))

    def ended(self, tid: str, now: int) -> None:
        rec = self.open.get(tid)
        self._close(tid, now)
        group = self.group_of.get(tid)
        if group is None:
            return
        self.finished[group] = self.finished.get(group, 0) + 1
        # A budget can also run out exactly when its last weighted task ends: no preemption
        # then, but it ran out all the same.
        gi = self.index.groups.get(group)
        if rec is not None and rec[3] > 0 and gi is not None and gi.budget is not None:
            m = self.state.meters.get(group)
            if m is not None and remaining(m, gi.budget, now, self.state.enabled) <= 0:
                self.exhausted.add((group, period_start(gi.budget.period, now)))

    # ------------------------------------------------------------------ the report
    def report(
        self, trace: "Trace", end: int, passes: int, moments: int, horizon: int | None = None
    ) -> "Report":
        """``horizon``: set when the replay stopped there with work left."""
        for tid in list(self.open):
            self._close(tid, end)
        index = self.index
        window = max(0, end - self.start)
        groups = sorted(self.tasks)
        pools = {name: p.capacity for name, p in sorted(index.pools.items())}
        never: dict[str, int] = {}
        for tid in self.submit_at:
            g = self.group_of[tid]
            never[g] = never.get(g, 0) + 1
        unfinished: dict[str, int] = {}
        for tid, g in self.group_of.items():
            t = self.state.tasks.get(tid)
            if t is not None and t.state != "ended":
                unfinished[g] = unfinished.get(g, 0) + 1
        exhaust: dict[str, int] = {}
        for g, _ in self.exhausted:
            exhaust[g] = exhaust.get(g, 0) + 1

        def util(area: int, cap: int) -> float | None:
            if cap <= 0 or window <= 0:
                return None
            return round(area / (cap * window), 4)

        def stats(gs: list[str]) -> dict[str, Any]:
            waits = sorted(w for g in gs for w in self.waits.get(g, ()))
            pre = {k: sum(self.preemptions.get(g, {}).get(k, 0) for g in gs) for k in PREEMPT_KINDS}
            area_by_pool: dict[str, int] = {}
            for (pool, g), a in self.gpu_area.items():
                if g in gs and a:
                    area_by_pool[pool] = area_by_pool.get(pool, 0) + a
            return {
                "tasks": sum(self.tasks.get(g, 0) for g in gs),
                "placed": len(waits),
                "never_placed": sum(never.get(g, 0) for g in gs),
                "unfinished": sum(unfinished.get(g, 0) for g in gs),
                "wait_s": {
                    "p50": _pct(waits, 0.50),
                    "p95": _pct(waits, 0.95),
                    "max": waits[-1] / SECOND_MS if waits else None,
                },
                "preemptions": pre,
                "lost_gpu_hours": round(unit_hours(sum(self.lost_units.get(g, 0) for g in gs)), 3),
                "gpu_hours": round(sum(area_by_pool.values()) / UNITS_PER_HOUR, 3),
                "budget_hours": round(sum(self.weighted.get(g, 0) for g in gs) / UNITS_PER_HOUR, 3),
                "budget_exhaustions": sum(exhaust.get(g, 0) for g in gs),
                "utilisation": {
                    p: util(area_by_pool[p], pools.get(p, 0)) for p in sorted(area_by_pool)
                },
            }

        overall = stats(groups)
        pool_area: dict[str, int] = {p: 0 for p in pools}
        for (pool, _), a in self.gpu_area.items():
            pool_area[pool] = pool_area.get(pool, 0) + a
        overall["utilisation"] = {p: util(pool_area.get(p, 0), c) or 0.0 for p, c in pools.items()}
        total_cap = sum(pools.values())
        overall["utilisation_all_pools"] = util(sum(pool_area.values()), total_cap)
        per_group: dict[str, Any] = {}
        for g in groups:
            s = stats([g])
            gi = index.groups.get(g)
            b = gi.budget if gi is not None else None
            s["budget"] = (
                {"hours": float(milli_str(b.hours_milli)), "period": b.period}
                if b is not None
                else None
            )
            per_group[g] = s
        data = {
            "trace": trace.file,
            "estate_revision": index.revision,
            "start": format_time(self.start),
            "end": format_time(end),
            "duration_h": round(ms_to_hours(window), 4),
            "stopped_at_horizon": horizon is not None,
            "moments": moments,
            "passes": passes,
            "pools": {
                p: {
                    "capacity": float(milli_str(c)),
                    "gpu_hours": round(pool_area.get(p, 0) / UNITS_PER_HOUR, 3),
                    "utilisation": overall["utilisation"][p],
                }
                for p, c in pools.items()
            },
            "overall": overall,
            "groups": per_group,
        }
        return Report(data)


def _pct(sorted_ms: list[int], q: float) -> float | None:
    """Nearest-rank percentile, in seconds."""
    if not sorted_ms:
        return None
    k = max(0, math.ceil(q * len(sorted_ms)) - 1)
    return sorted_ms[k] / SECOND_MS


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:g}s" if seconds == int(seconds) else f"{seconds:.1f}s"
    s = int(round(seconds))
    h, rest = divmod(s, HOUR_S)
    m, sec = divmod(rest, 60)
    if h >= 24:
        d, h = divmod(h, 24)
        return f"{d}d{h:02d}h{m:02d}m"
    if h:
        return f"{h}h{m:02d}m{sec:02d}s"
    return f"{m}m{sec:02d}s"


def _pctf(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.1f}%"


def _num(x: float) -> str:
    """GPU-hours and budget hours: the one rule for hours (kliqued/fmt.py), grouped."""
    return amount(x, grouped=True)


class Report:
    """A replay's report: ``data`` (what ``--json`` prints) and its text rendering."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def to_json(self) -> str:
        return json.dumps(self.data, indent=2, sort_keys=False) + "\n"

    def render_text(self) -> str:
        d = self.data
        ov = d["overall"]
        lines = [
            f"Replay of {d['trace']}: {ov['tasks']:,} tasks, estate {d['estate_revision'][:19]}",
            f"{d['start']} .. {d['end']} ({fmt_duration(d['duration_h'] * HOUR_S)} simulated), "
            f"{d['moments']:,} moments, {d['passes']:,} passes",
        ]
        if d["stopped_at_horizon"]:
            lines.append(
                f"stopped at the horizon with {ov['unfinished']:,} tasks unfinished "
                f"(--until; default: last submission + longest runtime + 31 days)"
            )
        lines += [
            "",
            f"{'pool':<24} {'capacity':>9} {'GPU-hours':>11} {'utilisation':>12}",
        ]
        cap_total = 0.0
        for name, p in d["pools"].items():
            cap_total += p["capacity"]
            lines.append(
                f"{name:<24} {p['capacity']:>9g} {_num(p['gpu_hours']):>11} "
                f"{_pctf(p['utilisation']):>12}"
            )
        lines.append(
            f"{'all pools':<24} {cap_total:>9g} {_num(ov['gpu_hours']):>11} "
            f"{_pctf(ov['utilisation_all_pools']):>12}"
        )
        lines.append("")
        head = (
            f"{'group':<24} {'tasks':>7} {'placed':>7} {'unfin.':>6} {'wait p50':>9} "
            f"{'p95':>9} {'max':>9} {'reclaimed':>9} {'rebal.':>6} {'budget':>7} "
            f"{'lost GPU-h':>10} {'GPU-hours':>10} "
            f"{'budget h':>10} {'ran out':>7}  budget"
        )
        lines.append(head)

        def row(name: str, s: dict[str, Any], budget: str) -> str:
            w = s["wait_s"]
            pre = s["preemptions"]
            return (
                f"{name:<24} {s['tasks']:>7,} {s['placed']:>7,} {s['unfinished']:>6,} "
                f"{fmt_duration(w['p50']):>9} {fmt_duration(w['p95']):>9} "
                f"{fmt_duration(w['max']):>9} {pre['reclaimed']:>9,} {pre['rebalanced']:>6,} "
                f"{pre['budget']:>7,} {_num(s['lost_gpu_hours']):>10} "
                f"{_num(s['gpu_hours']):>10} {_num(s['budget_hours']):>10} "
                f"{s['budget_exhaustions']:>7,}  {budget}"
            ).rstrip()

        for name, s in d["groups"].items():
            b = s["budget"]
            lines.append(row(name, s, f"{b['hours']:g} h/{b['period']}" if b else "none"))
        lines.append(row("all", ov, ""))
        lines.append("")
        lines.append("utilisation by group (its share of each pool's capacity):")
        for name, s in d["groups"].items():
            parts = [f"{p} {_pctf(u)}" for p, u in s["utilisation"].items()]
            lines.append(f"  {name:<22} {', '.join(parts) if parts else '-'}")
        return "\n".join(lines) + "\n"
