"""The candidate changes: where the replayed weeks show a group waiting on its own limit or
budget while the GPUs it may use sat idle.

Evidence, per group whose p95 wait (first placement) is above the threshold:

- its **budget** ran out in the replay (``Figures.exhaustions``): the budget's hours x1.5
  and x2;
- its **limit** is below what its profiles' pools hold, and those pools were mostly idle
  (utilisation under ``IDLE``): the limit x1.5 and x2 (never above the pools' GPUs); the
  same for the nearest envelope above it (a department's limit), for a department head.

Capacity is never proposed (a pool is bought, not written): when the pools are busy the
wait is capacity's, and no change here is offered. Every candidate is then replayed
(check.py); this only decides what is worth a replay.
"""

from __future__ import annotations

from compiler.compiled import CompiledEstate
from compiler.plan.whatif import Figures, PoolFigures, WhatIf
from compiler.source import SourceMap
from klique_util.units import from_milli
from kliqued.sim.report import fmt_duration as duration

from .model import Change

IDLE = 0.8
"""Pools used less than this on average over the replay count as having room."""

FACTORS = (1.5, 2.0)

ADJECTIVE = {"day": "daily", "week": "weekly", "month": "monthly"}


def _reach(estate: CompiledEstate, group: str) -> list[str]:
    """The pools a group's compute resources may use, in the estate's order."""
    profiles = {p.name: p for p in estate.profiles}
    out: list[str] = []
    for cr in estate.compute_resources:
        if cr.group == group:
            for pool in profiles[cr.profile].pools:
                if pool not in out:
                    out.append(pool)
    return out


def _capacity(estate: CompiledEstate, pools: list[str]) -> int:
    by = {p.name: p for p in estate.pools}
    total = 0
    for name in pools:
        p = by.get(name)
        if p is not None:
            total += p.autoscale.max_milli if p.autoscale is not None else p.capacity_milli
    return total


def _utilisation(baseline: WhatIf, pools: list[str]) -> float | None:
    """The capacity-weighted utilisation of ``pools`` over the replay."""
    rows = {r.name: r.base for r in baseline.pools}
    used = cap = 0.0
    for name in pools:
        f = rows.get(name)
        if isinstance(f, PoolFigures) and f.capacity and f.utilisation is not None:
            used += f.utilisation * f.capacity
            cap += f.capacity
    return used / cap if cap else None


def _value(v: float) -> float:
    """A proposed amount as the estate writes it: whole GPUs or hours."""
    return float(round(v))


def propose(
    estate: CompiledEstate,
    sources: SourceMap,
    baseline: WhatIf,
    threshold_s: int,
    groups: set[str] | None = None,
    max_groups: int = 3,
) -> list[tuple[str, Change]]:
    """(the group it is for, the change) of every candidate, worst-waiting groups first;
    ``groups``: only these (a subtree); at most ``max_groups`` groups."""
    waiting: list[tuple[float, str, Figures]] = []
    for row in baseline.groups:
        f = row.base
        if row.name == "all" or not isinstance(f, Figures) or f.wait_p95_s is None:
            continue
        if groups is not None and row.name not in groups:
            continue
        if f.wait_p95_s > threshold_s:
            waiting.append((f.wait_p95_s, row.name, f))
    waiting.sort(reverse=True)
    out: list[tuple[str, Change]] = []
    seen: set[tuple[str, str, float]] = set()
    for p95, name, f in waiting[:max_groups]:
        g = estate.group(name)
        pol = estate.policy(g.policy) if g is not None and g.policy else None
        if pol is None:
            continue
        pools = _reach(estate, name)
        util = _utilisation(baseline, pools)
        cap = _capacity(estate, pools)
        if pol.budget is not None and f.exhaustions:
            pos = sources.position("policy", pol.name, "budget", "hours")
            hours = from_milli(pol.budget.hours_milli)
            for k in FACTORS:
                after = _value(hours * k)
                key = (pol.name, "budget", after)
                if pos is not None and pos.line and after > hours and key not in seen:
                    seen.add(key)
                    why = (
                        f"{name}'s p95 wait was {duration(p95)}; its {ADJECTIVE[pol.budget.period]} "
                        f"budget of {hours:g} h ran out {len(f.exhaustions)} time(s)"
                    )
                    out.append(
                        (
                            name,
                            Change(pol.name, name, "budget", hours, after, pos.file, pos.line, why),
                        )
                    )
        if util is None or util >= IDLE:
            continue  # the pools were busy: the wait is capacity's
        levels = [pol.name] + [x for x in pol.levels[1:]]
        for level in levels[:2]:  # its own limit, and the nearest envelope's
            lp = estate.policy(level)
            if lp is None or lp.limit_milli >= cap:
                continue
            pos = sources.position("policy", lp.name, "limit")
            limit = from_milli(lp.limit_milli)
            for k in FACTORS:
                after = _value(min(from_milli(cap), limit * k))
                key = (lp.name, "limit", after)
                if pos is None or not pos.line or after <= limit or key in seen:
                    continue
                seen.add(key)
                why = (
                    f"{name}'s p95 wait was {duration(p95)} while the pools it may use "
                    f"({', '.join(pools)}) were {util:.0%} used"
                    + ("" if lp.name == pol.name else f"; {lp.name} is the envelope above it")
                )
                out.append(
                    (
                        name,
                        Change(lp.name, lp.group, "limit", limit, after, pos.file, pos.line, why),
                    )
                )
    return out
