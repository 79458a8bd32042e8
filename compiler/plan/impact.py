"""What a change does to work, as opposed to what it changes in the YAML.

A reviewer of an estate change rarely asks "did capacity go from 64 to 32?" (the diff says
so) but "does every guarantee still fit, whose queue disappears, who burns budget faster?".
Each rule here answers one such question from the two compiled estates alone, so the answer
is the same whatever the files look like, and it is graded: ``error`` (the change cannot
work), ``warn`` (work will wait, stop or be cancelled because of it), ``info`` (good to know).

What the engine does on such changes is engine.md's "Changes of the estate while work
runs": a lowered limit or capacity preempts nothing, a lowered reservation makes a group a
borrower, a removed compute resource cancels its queue and lets placed tasks finish.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from klique_util.units import from_milli

from ..compiled import CBudget, CompiledEstate, CPolicy, CSettings
from ..models import Settings
from ..diagnostics import plural
from ..hierarchy import compiled_demands
from ..reservations import Headroom, check_reservations, headroom_by_pool_set
from ..units import duration_str, milli_str
from .destinations import alert_destinations
from .diff import NO_RENAMES, Renames
from .live import LiveState
from .model import Impact, Severity
from .prices import price_impacts


def empty_estate() -> CompiledEstate:
    """The estate of a revision where the estate path does not exist yet: nothing but the
    default settings, so adding the first estate is a plan like any other."""
    s = Settings()
    return CompiledEstate(
        settings=CSettings(
            pass_interval_s=s.pass_interval, low_watermark_s=s.low_watermark, currency=s.currency
        ),
        pools=[],
        profiles=[],
        policies=[],
        groups=[],
        pricing=[],
        compute_resources=[],
    ).with_revision()


def gpus(milli: int) -> str:
    n = milli_str(milli)
    return f"{n} GPU" if n == "1" else f"{n} GPUs"


def hours(milli: int) -> str:
    return f"{milli_str(milli)} h"


def pool_list(pools: tuple[str, ...] | list[str]) -> str:
    return "[" + ", ".join(pools) + "]"


def impacts(
    base: CompiledEstate | None,
    head: CompiledEstate | None,
    renames: Renames = NO_RENAMES,
    now_ms: int | None = None,
    live: LiveState | None = None,
) -> list[Impact]:
    """Every impact of going from ``base`` to ``head``, most severe first. Base names are
    read through ``renames``, so a renamed pool or policy is the same one on both sides.
    ``now_ms`` is the plan's time (prices before it reprice recorded usage); ``live``, the
    running system's counts (``--against``), turns "if" into "how many"."""
    b = base if base is not None else empty_estate()
    h = head if head is not None else empty_estate()
    found: list[Impact] = []
    for rule in (
        _headroom,
        _compute_resources,
        _budgets,
        _weights,
        _capacity,
        _guarantees,
        alert_destinations,
    ):
        found.extend(rule(b, h, renames, live))
    if now_ms is not None:
        found.extend(price_impacts(b, h, now_ms, live))
    return sorted(found, key=Impact.sort_key)


# --- reservation headroom per policy ---------------------------------------------------------


def _headroom_of(est: CompiledEstate, rn: Renames) -> dict[str, Headroom]:
    """Per policy with a reservation: the headroom of the set of pools it reaches."""
    demand, where = compiled_demands(est)
    reservations = {rn.new("policy", p): r for p, r in demand.items()}
    reach: dict[str, list[str]] = {}
    for pol, qs in where.items():
        pools: list[str] = []
        for q in qs:
            if rn.new("pool", q) not in pools:
                pools.append(rn.new("pool", q))
        reach[rn.new("policy", pol)] = pools
    capacity = {rn.new("pool", q.name): q.capacity_milli for q in est.pools}
    by_set = {h.pools: h for h in headroom_by_pool_set(reservations, reach, capacity)}
    out = {}
    for name, r in reservations.items():
        key = tuple(sorted(set(q for q in reach.get(name, []) if q in capacity)))
        if r > 0 and key in by_set:
            out[name] = by_set[key]
    return out


def _headroom(
    base: CompiledEstate, head: CompiledEstate, rn: Renames, live: LiveState | None = None
) -> Iterator[Impact]:
    """One line per policy whose reserved pools' headroom changed, before and after: a
    reviewer asks "does my guarantee still fit, and how much is left to lend around it",
    and pool sets that appear and vanish when a pool is added do not answer that."""
    before = _headroom_of(base, rn)
    after = _headroom_of(head, NO_RENAMES)
    old_capacity = {rn.new("pool", q.name): q.capacity_milli for q in base.pools}
    old_reserved = {rn.new("policy", p.name): p.reservation_milli for p in base.policies}
    changed_pools = [q.name for q in head.pools if old_capacity.get(q.name) != q.capacity_milli]
    changed_policies = [
        p.name for p in head.policies if old_reserved.get(p.name) != p.reservation_milli
    ]
    for name in sorted(after):
        a, b = after[name], before.get(name)
        if b is not None and (b.pools, b.capacity_milli, b.reserved_milli) == (
            a.pools,
            a.capacity_milli,
            a.reserved_milli,
        ):
            continue
        details: dict[str, Any] = {
            "policy": name,
            "pools": list(a.pools),
            "after": _headroom_json(a),
        }
        if b is not None:
            details["before"] = _headroom_json(b)
        # Cite what changed, so an annotation lands on the line that moved the headroom.
        subject = next(
            (("pool", q) for q in changed_pools if q in a.pools),
            next((("policy", p) for p in changed_policies if p in a.policies), ("policy", name)),
        )
        where = f"reservation headroom for {name}"
        who = _names(a.policies, "policy")
        if b is None:
            text = (
                f"{where}: {gpus(a.headroom_milli)} to lend (capacity "
                f"{gpus(a.capacity_milli)} in {_names(a.pools, 'pool')}, reserved "
                f"{gpus(a.reserved_milli)} by {who})"
            )
        else:
            text = (
                f"{where}: {milli_str(b.headroom_milli)} -> {gpus(a.headroom_milli)} "
                f"to lend (capacity {_arrow(b.capacity_milli, a.capacity_milli)} in "
                f"{_pools_change(b.pools, a.pools)}, reserved "
                f"{_arrow(b.reserved_milli, a.reserved_milli)} by {who})"
            )
        severity: Severity
        if a.headroom_milli < 0:
            severity = "error"
            text += f": the reservations exceed the capacity by {gpus(-a.headroom_milli)}"
        elif b is not None and a.headroom_milli < b.headroom_milli:
            # A drop is worth a warning only where it leaves the pool set tight; elsewhere
            # one capacity change would raise a warning for every policy that reaches it.
            tight = a.headroom_milli * 100 < TIGHT_HEADROOM_PERCENT * a.capacity_milli
            severity = "warn" if tight else "info"
            text += (
                "; under 25% of the capacity is left to lend"
                if tight
                else "; less capacity is left to lend"
            )
        else:
            severity = "info"
        yield Impact(
            severity, "reservation-headroom", text, details, subject, rank=a.headroom_milli
        )


SHOW_NAMES = 3
"""Up to this many pool or policy names are written out in a headroom line; more are
counted (the JSON details list them all): long name lists made the lines unreadable."""


def _names(names: tuple[str, ...], word: str) -> str:
    return pool_list(names) if len(names) <= SHOW_NAMES else plural(len(names), word)


def _pools_change(before: tuple[str, ...], after: tuple[str, ...]) -> str:
    if before == after:
        return _names(after, "pool")
    if len(before) <= SHOW_NAMES and len(after) <= SHOW_NAMES:
        return f"{pool_list(before)} -> {pool_list(after)}"
    delta = [f"+{q}" for q in after if q not in before] + [
        f"-{q}" for q in before if q not in after
    ]
    return f"{len(before)} -> {plural(len(after), 'pool')} ({', '.join(delta)})"


TIGHT_HEADROOM_PERCENT = 25
"""Below this share of a pool set's capacity unreserved, a lowered headroom is a warning."""


def _headroom_json(h: Headroom) -> dict[str, Any]:
    return {
        "policies": list(h.policies),
        "capacity_milli": h.capacity_milli,
        "reserved_milli": h.reserved_milli,
        "headroom_milli": h.headroom_milli,
    }


def _arrow(before: int, after: int) -> str:
    if before == after:
        return milli_str(after)
    return f"{milli_str(before)} -> {milli_str(after)}"


# --- compute resources ----------------------------------------------------------------------


def _compute_resources(
    base: CompiledEstate, head: CompiledEstate, rn: Renames, live: LiveState | None = None
) -> Iterator[Impact]:
    old = {
        f"{rn.new('policy', c.policy)}/{rn.new('profile', c.profile)}": c
        for c in base.compute_resources
    }
    new = {c.name: c for c in head.compute_resources}
    for name in sorted(set(old) | set(new)):
        o, n = old.get(name), new.get(name)
        if o is None and n is not None:
            yield Impact(
                "info",
                "compute-resource-created",
                f"compute resource {name} is created: group {n.group} can send work "
                f"to profile {n.profile}",
                {"compute_resource": name, "group": n.group},
                ("profile", n.profile),
            )
        elif n is None and o is not None:
            details: dict[str, Any] = {"compute_resource": o.name, "group": o.group}
            yield Impact(
                "warn",
                "compute-resource-removed",
                f"compute resource {o.name} is removed: " + _cancels(o.name, live, details),
                details,
                ("profile", o.profile),
                "base",
            )
        elif o is not None and n is not None and o.name != n.name:
            details = {"compute_resource": n.name, "before": o.name, "group": n.group}
            yield Impact(
                "warn",
                "compute-resource-renamed",
                f"compute resource {o.name} becomes {n.name}: to the engine that is a "
                f"new compute resource, so of {o.name}: " + _cancels(o.name, live, details),
                details,
                ("profile", n.profile),
            )


def _cancels(running_name: str, live: LiveState | None, details: dict[str, Any]) -> str:
    """What removing a compute resource does to its tasks, counted when the plan has the
    running system's state."""
    if live is None:
        return "its queued tasks are cancelled, placed tasks run to their end"
    r = live.resource(running_name)
    details["live"] = {
        "queued": r.queued,
        "placed": r.placed,
        "placed_gpus": from_milli(r.placed_gpus_milli),
    }
    return (
        f"it cancels {plural(r.queued, 'queued task')} now; "
        f"{plural(r.placed, 'placed task')} ({gpus(r.placed_gpus_milli)}) "
        f"{'runs to its end' if r.placed == 1 else 'run to their end'}"
    )


# --- budgets, weights -----------------------------------------------------------------------


def _pairs(
    base: CompiledEstate, head: CompiledEstate, rn: Renames
) -> Iterator[tuple[CPolicy, CPolicy]]:
    old = {rn.new("policy", p.name): p for p in base.policies}
    for p in head.policies:
        if p.name in old:
            yield old[p.name], p


def _budget_text(b: CBudget) -> str:
    return f"{hours(b.hours_milli)} per {b.period}"


def _budgets(
    base: CompiledEstate, head: CompiledEstate, rn: Renames, live: LiveState | None = None
) -> Iterator[Impact]:
    for o, n in _pairs(base, head, rn):
        s = ("policy", n.name)
        name = n.name
        ob, nb = o.budget, n.budget
        if ob is None and nb is None:
            continue
        if ob is None and nb is not None:
            details: dict[str, Any] = {"policy": name, "after": nb.model_dump()}
            yield Impact(
                "warn",
                "budget-added",
                f"{name} now has a budget of {_budget_text(nb)}: the group's work "
                f"can now wait for budget, and is requeued when it is used up"
                + _spent(o.name, nb, live, details),
                details,
                s,
            )
            continue
        if nb is None and ob is not None:
            yield Impact(
                "info",
                "budget-removed",
                f"{name} no longer has a budget (was {_budget_text(ob)}): its work "
                f"never waits for budget",
                {"policy": name, "before": ob.model_dump()},
                s,
            )
            continue
        assert ob is not None and nb is not None
        if nb.period != ob.period:
            details = {"policy": name, "before": ob.period, "after": nb.period}
            yield Impact(
                "warn",
                "budget-period",
                f"budget period of {name}: {ob.period} -> {nb.period} "
                f"({_budget_text(ob)} -> {_budget_text(nb)}); the new period starts "
                f"with the next UTC {nb.period}" + _spent(o.name, nb, live, details),
                details,
                s,
            )
        elif nb.hours_milli < ob.hours_milli:
            details = {
                "policy": name,
                "before_milli": ob.hours_milli,
                "after_milli": nb.hours_milli,
                "period": nb.period,
            }
            text = (
                f"budget of {name} lowered: {milli_str(ob.hours_milli)} -> "
                f"{hours(nb.hours_milli)} per {nb.period}"
            )
            text += (
                _spent(o.name, nb, live, details)
                if live is not None
                else "; if more is already spent this period, its budgeted work stops until "
                "the reset"
            )
            yield Impact("warn", "budget-lowered", text, details, s)
        elif nb.hours_milli > ob.hours_milli:
            yield Impact(
                "info",
                "budget-raised",
                f"budget of {name} raised: {milli_str(ob.hours_milli)} -> "
                f"{hours(nb.hours_milli)} per {nb.period}; work waiting for budget "
                f"can start at once",
                {
                    "policy": name,
                    "before_milli": ob.hours_milli,
                    "after_milli": nb.hours_milli,
                    "period": nb.period,
                },
                s,
            )
        if nb.low_watermark_s != ob.low_watermark_s:
            yield Impact(
                "info",
                "budget-low-watermark",
                f"start check of {name}: new work starts only if the budget lasts "
                f"{duration_str(nb.low_watermark_s)} (was "
                f"{duration_str(ob.low_watermark_s)})",
                {"policy": name, "before_s": ob.low_watermark_s, "after_s": nb.low_watermark_s},
                s,
            )


def _spent(running_name: str, nb: CBudget, live: LiveState | None, details: dict[str, Any]) -> str:
    """Against the running system: what the group has spent this period, and whether the
    new budget is already used up (then phase 0 preempts its weighted running tasks at the
    next pass: engine.md, "Changes of the estate while work runs")."""
    if live is None:
        return ""
    pol = live.policy(running_name)
    used = pol.budget_used_milli.get(nb.period, 0)
    details["live"] = {"spent_hours": from_milli(used), "weighted_placed": pol.weighted_placed}
    if used >= nb.hours_milli:
        return (
            f"; {hours(used)} are already spent this {nb.period}, so it preempts "
            f"{plural(pol.weighted_placed, 'running budgeted task')} at once and "
            f"nothing budgeted starts until the reset"
        )
    return (
        f"; {hours(used)} spent this {nb.period}, {hours(nb.hours_milli - used)} left: "
        "nothing is preempted now"
    )


def _weights(
    base: CompiledEstate, head: CompiledEstate, rn: Renames, live: LiveState | None = None
) -> Iterator[Impact]:
    old = {rn.new("profile", p.name): p for p in base.profiles}
    policies = {p.name: p for p in head.policies}
    for prof in head.profiles:
        before = old.get(prof.name)
        if before is None or before.time_weight_milli == prof.time_weight_milli:
            continue
        w0, w1 = before.time_weight_milli, prof.time_weight_milli
        for pol_name in prof.policies:
            pol = policies.get(pol_name)
            budgeted = pol is not None and pol.budget is not None
            text = (
                f"each task of {pol_name} on {prof.name} now burns {milli_str(w1)} "
                f"instead of {milli_str(w0)} budget hours per hour ({_percent(w0, w1)})"
            )
            if not budgeted:
                text += f"; {pol_name} has no budget, so nothing is charged"
            details: dict[str, Any] = {
                "profile": prof.name,
                "policy": pol_name,
                "before_milli": w0,
                "after_milli": w1,
                "budgeted": budgeted,
            }
            if live is not None:
                running = f"{rn.old('policy', pol_name)}/{rn.old('profile', prof.name)}"
                r = live.resource(running)
                details["live"] = {"placed": r.placed}
                text += f"; {plural(r.placed, 'task')} of it running now"
            severity: Severity = "warn" if (w1 > w0 and budgeted) else "info"
            yield Impact(severity, "time-weight", text, details, ("profile", prof.name))


def _percent(before: int, after: int) -> str:
    if before == 0:
        return "was exempt"
    if after == 0:
        return "now exempt"
    change = (after - before) * 100 / before
    text = f"{change:+.1f}".removesuffix(".0")
    return f"{text}%"


# --- capacity, reservations and limits ------------------------------------------------------


def _capacity(
    base: CompiledEstate, head: CompiledEstate, rn: Renames, live: LiveState | None = None
) -> Iterator[Impact]:
    old = {rn.new("pool", p.name): p for p in base.pools}
    new = {p.name: p for p in head.pools}
    short_pools = _short_pools(head)
    for name in sorted(set(old) | set(new)):
        o, n = old.get(name), new.get(name)
        if n is None and o is not None:
            details: dict[str, Any] = {
                "pool": o.name,
                "before_milli": o.capacity_milli,
                "after_milli": 0,
            }
            text = (
                f"pool {o.name} is removed: {gpus(o.capacity_milli)} leave the estate; "
                f"its profiles fall back to their other pools"
            )
            if live is not None:
                q = live.pool(o.name)
                details["live"] = {"placed": q.placed, "used_gpus": from_milli(q.used_milli)}
                text += (
                    f"; {plural(q.placed, 'task')} ({gpus(q.used_milli)}) "
                    f"{'is' if q.placed == 1 else 'are'} placed on it now"
                )
            yield Impact("warn", "capacity-removed", text, details, ("pool", o.name), "base")
        elif o is None and n is not None:
            yield Impact(
                "info",
                "capacity-added",
                f"pool {n.name} adds {gpus(n.capacity_milli)}",
                {"pool": n.name, "before_milli": 0, "after_milli": n.capacity_milli},
                ("pool", n.name),
            )
        elif o is not None and n is not None and o.capacity_milli != n.capacity_milli:
            details = {
                "pool": n.name,
                "before_milli": o.capacity_milli,
                "after_milli": n.capacity_milli,
            }
            if n.capacity_milli > o.capacity_milli:
                yield Impact(
                    "info",
                    "capacity-added",
                    f"capacity of {n.name} raised: {milli_str(o.capacity_milli)} -> "
                    f"{gpus(n.capacity_milli)}",
                    details,
                    ("pool", n.name),
                )
                continue
            text = (
                f"capacity of {n.name} lowered: {milli_str(o.capacity_milli)} -> "
                f"{gpus(n.capacity_milli)}; nothing is preempted, new work waits until "
                f"use falls below it"
            )
            if live is not None:
                used = live.pool(o.name).used_milli
                details["live"] = {"used_gpus": from_milli(used)}
                text += f"; {gpus(used)} in use now, " + (
                    f"{gpus(used - n.capacity_milli)} over"
                    if used > n.capacity_milli
                    else "within it"
                )
            if name in short_pools:
                yield Impact(
                    "error",
                    "capacity-removed",
                    text + "; the reservations that depend on it no longer fit",
                    details,
                    ("pool", n.name),
                )
            else:
                yield Impact("warn", "capacity-removed", text, details, ("pool", n.name))


def _short_pools(est: CompiledEstate) -> set[str]:
    """Pools in a set whose reservations do not fit. A valid head never has one (the
    compiler rejects it), but the plan must not rely on that to grade the change."""
    demand, reach = compiled_demands(est)
    shortfalls = check_reservations(demand, reach, {q.name: q.capacity_milli for q in est.pools})
    return {q for s in shortfalls for q in s.pools}


_GUARANTEES: tuple[tuple[str, tuple[Severity, str, str], tuple[Severity, str, str]], ...] = (
    # field, (severity, kind, what follows) when lowered, the same when raised
    (
        "reservation",
        ("warn", "reservation-lowered", "; its work above that is borrowed and can be reclaimed"),
        ("info", "reservation-raised", " guaranteed"),
    ),
    (
        "limit",
        (
            "info",
            "limit-lowered",
            "; nothing is preempted, new work waits while the group uses that much",
        ),
        ("info", "limit-raised", ""),
    ),
)
"""How a change of a policy's reservation or limit reads, by direction (engine.md, "Changes
of the estate while work runs")."""


def _guarantees(
    base: CompiledEstate, head: CompiledEstate, rn: Renames, live: LiveState | None = None
) -> Iterator[Impact]:
    for o, n in _pairs(base, head, rn):
        for field, lowered, raised in _GUARANTEES:
            before, after = getattr(o, f"{field}_milli"), getattr(n, f"{field}_milli")
            if before == after:
                continue
            severity, kind, tail = lowered if after < before else raised
            verb = "lowered" if after < before else "raised"
            details: dict[str, Any] = {
                "policy": n.name,
                "before_milli": before,
                "after_milli": after,
            }
            if live is not None and after < before:
                used = live.policy(o.name).used_milli
                details["live"] = {"used_gpus": from_milli(used)}
                if field == "limit":
                    tail += f"; the group uses {gpus(used)} now" + (
                        f", {gpus(used - after)} over the new limit" if used > after else ""
                    )
                else:
                    newly = max(0, used - after) - max(0, used - before)
                    tail += (
                        f"; {gpus(newly)} of its running work become borrowed now"
                        if newly
                        else "; none of its running work becomes borrowed"
                    )
            yield Impact(
                severity,
                kind,
                f"{field} of {n.name} {verb}: {milli_str(before)} -> {gpus(after)}{tail}",
                details,
                ("policy", n.name),
            )
