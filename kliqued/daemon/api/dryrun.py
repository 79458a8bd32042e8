"""A dry run: ``POST /v1/tasks`` with ``dry_run: true``, the SDK's ``dry_run``, MCP's
``dry_run_task`` and ``kliqued submit --dry-run`` (issue 31).

The body goes through every check a submission goes through (``submission.from_body``:
shape, sizes, on whose behalf, the estate's ``check_submission``), so a dry run is refused
exactly where the submission would be and answers only what its caller could send. Then the
engine answers (``kliqued.engine.dryrun``) on the live state as it stands, between two
sequencer cycles, and nothing is stored: no event, no id, no idempotency key. The view adds
what the engine does not know: the pool's price (cost per hour) and, for the tasks it would
take GPUs from, only what the caller may see of them (a task id of another user's is not
disclosed, as ``GET /v1/tasks/{id}`` would not).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from compiler.compiled import CompiledEstate
from klique_util.units import from_milli, unit_hours, unit_hours_micro
from kliqued.engine import SubmissionError
from kliqued.engine.dryrun import DryRun, dry_run

from kliqued.daemon.api.inputs import check_tree
from kliqued.daemon.api.openapi import submission_surely_valid
from kliqued.daemon.api.request import Context, valid
from kliqued.daemon.api.views import forecast_json
from kliqued.daemon.auth import Principal
from kliqued.daemon.errors import ApiError
from kliqued.daemon.state.channels import Channel
from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.state.submission import from_body
from kliqued.daemon.units import gpus, iso, parse_iso


def dry_run_as(
    c: Context, p: Principal, body: Any, channel: Channel, *, checked: bool = False
) -> dict[str, Any]:
    """The ``DryRun`` answer for ``body`` (a ``TaskSubmission``) sent by ``p`` through
    ``channel``; an ``ApiError`` where the submission would be refused (400, 403, 413,
    422). ``checked``: the HTTP edge validated the body's shape already."""
    if not checked:
        check_tree(body, "TaskSubmission")
        body = valid(body, "TaskSubmission", submission_surely_valid)
    d = c.daemon
    idx = d.idx()
    sub = from_body(idx, p, body, channel)
    st = d.st()
    now = max(d.clock.now(), st.clock)
    try:
        answer = dry_run(idx, st, sub.resource, sub.user, sub.project, sub.gpus_milli, now)
    except SubmissionError as exc:  # the estate changed since from_body: as a submission
        raise ApiError(422, "submission-refused", str(exc), {"field": exc.field}) from None
    return view(d, p, answer, now)


def settled(d: Daemon, now: int) -> bool:
    """No pass is due that could change the answer: nothing changed since the last pass
    and no time trigger (a run-out, a period, a protection's end) has come."""
    st = d.st()
    res = d.last_result
    due = res.next_pass_at if res is not None else None
    return not st.dirty and (due is None or due > now)


@dataclass(frozen=True)
class _Prices:
    """One estate's prices by pool, times as ms: a dry run looks one up per answer, and
    formatting ``now`` to compare it with the estates' texts was a third of the view."""

    estate: CompiledEstate
    by_pool: dict[str, list[tuple[int, Decimal]]]
    """The pool's GPU type's prices, oldest first: (effective from, per GPU-hour)."""


_PRICES: _Prices | None = None


def _prices(estate: CompiledEstate) -> _Prices:
    global _PRICES
    if _PRICES is None or _PRICES.estate is not estate:
        by_type: dict[str, list[tuple[int, Decimal]]] = {}
        for pr in estate.pricing:
            by_type.setdefault(pr.gpu_type, []).append(
                (parse_iso(pr.effective_from), Decimal(pr.per_gpu_hour))
            )
        for rows in by_type.values():
            rows.sort(key=lambda r: r[0])
        _PRICES = _Prices(estate, {p.name: by_type.get(p.gpu_type, []) for p in estate.pools})
    return _PRICES


def price_per_gpu_hour(estate: CompiledEstate, pool: str, at: int) -> Decimal | None:
    """The price in force at ``at`` for ``pool``'s GPU type (``pricing``), or None."""
    rows = _prices(estate).by_pool.get(pool, [])
    i = bisect_right(rows, at, key=lambda r: r[0])
    return rows[i - 1][1] if i else None


def view(d: Daemon, p: Principal, a: DryRun, now: int) -> dict[str, Any]:
    """The answer as the API shows it (``models.responses.DryRun``)."""
    idx = d.idx()
    estate = idx.estate
    acc = d.acc()
    cr = idx.resources[a.resource]
    pool = a.pool or (cr.pools[0] if cr.pools else None)
    price = price_per_gpu_hour(estate, pool, now) if pool is not None else None
    cost = None if price is None else float(price * Decimal(a.size_milli) / 1000)
    victims = []
    for v in a.victims:
        seen = acc.sees_task(p, v.user, v.group)
        victims.append(
            {
                "task": v.task if seen else None,
                "user": v.user if seen else None,
                "group": v.group,
                "resource": v.resource,
                "pool": v.pool,
                "gpus": gpus(v.size_milli),
                "kind": v.kind,
                "lost_work_s": round(v.lost_ms / 1000, 3),
                "protected_until": iso(v.protected_until),
            }
        )
    return {
        "dry_run": True,
        "resource": a.resource,
        "group": a.group,
        "user": a.user,
        "gpus": gpus(a.size_milli),
        "at": iso(now),
        "settled": settled(d, now),
        "outcome": "placed" if a.placed else "waiting",
        "pool": a.pool,
        "phase": a.phase,
        "victims": victims,
        "waiting_reason": None
        if a.reason is None
        else {"kind": a.reason.kind, "text": a.reason.text},
        "position": a.position + 1,
        "budgets": [
            {
                "group": b.group,
                "policy": b.policy,
                "period": b.period,
                "resets_at": iso(b.resets_at),
                "hours": unit_hours(b.budget_units),
                "used_hours": unit_hours_micro(b.used_units),
                "left_hours": unit_hours_micro(b.budget_units - b.used_units),
                "burn_rate": from_milli(b.rate_milli),
                "burn_rate_with": from_milli(b.rate_with_milli),
                "runout_at": iso(b.runout_at),
                "runout_with_at": iso(b.runout_with_at),
                "start_check": "passes" if b.start_ok else "fails",
            }
            for b in a.budgets
        ],
        "cost_per_hour": None if cost is None else round(cost, 6),
        "currency": estate.settings.currency,
        "price_pool": pool if price is not None else None,
        "forecast": forecast_json(a.forecast),
    }
