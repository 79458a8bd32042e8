"""The CIO's figures for one month, for the dashboards: use of the estate, GPU-hours and
spend by business unit, idle capacity and who pays for it, and cloud capacity and spend in
use now. Each is one query on the ledger's views (docs/ledger.md), run through the same
read-only sandbox as finance's SQL, so a group admin gets their subtree's figures only and
the answer is what ``kliqued ledger sql`` would show."""

from __future__ import annotations

from datetime import date
from typing import Any, Sequence

from .focus import next_month
from .sql import run_readonly

QUERIES = {
    "estate_use": "SELECT pool, kind, gpu_type, capacity_hours, gpu_hours, idle_hours, "
                  "used_pct, currency, capacity_cost, cost, idle_cost FROM estate_use "
                  "WHERE month = {month} ORDER BY pool",
    "business_units": "SELECT business_unit, gpu_hours, currency, cost "
                      "FROM usage_by_business_unit WHERE month = {month} "
                      "ORDER BY cost DESC NULLS LAST, business_unit",
    "idle": "SELECT currency, capacity_hours, used_hours, reserved_idle_hours, "
            "unreserved_idle_hours, capacity_cost, used_cost, reserved_idle_cost, "
            "unreserved_idle_cost FROM idle_cost WHERE month = {month}",
    "in_use_now": "SELECT pool, kind, gpu_type, capacity, gpus_in_use, tasks, cost_per_hour, "
                  "currency FROM in_use_now ORDER BY pool",
}
"""Each part of the answer and its query (``{month}``: the month as a DATE literal)."""


def figures(conn, period: date, groups: Sequence[str] | None = None,
            timeout_s: float = 10.0) -> dict[str, Any]:
    """The month's figures: each part as a list of rows (objects with the columns' names),
    ``idle`` as one object (or null before any capacity was recorded). Amounts are exact
    decimal text, as ledger SQL answers them."""
    month = f"DATE '{period.isoformat()}'"
    out: dict[str, Any] = {"period": f"{period:%Y-%m}",
                           "period_start": f"{period:%Y-%m-%d}T00:00:00Z",
                           "period_end": f"{next_month(period):%Y-%m-%d}T00:00:00Z"}
    for name, sql in QUERIES.items():
        res = run_readonly(conn, sql.format(month=month), limit=10_000, timeout_s=timeout_s,
                           groups=groups)
        rows = [dict(zip(res.columns, r)) for r in res.rows]
        out[name] = (rows[0] if rows else None) if name == "idle" else rows
    return out
