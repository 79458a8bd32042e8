"""The CIO's figures for one month, for the dashboards: use of the estate, GPU-hours and
spend by business unit, idle capacity and who pays for it, and cloud capacity and spend in
use now. Each is one query on the ledger's views (docs/ledger.md), run through the same
read-only sandbox as finance's SQL, so a group admin gets their subtree's figures only and
the answer is what ``kliqued ledger sql`` would show."""

from __future__ import annotations

from datetime import date
from typing import Any, Sequence

import duckdb

from .focus import next_month
from .lending import month_pieces
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
    "unreserved_idle_cost, borrowed_hours, lent_hours, lent_cost FROM idle_cost "
    "WHERE month = {month}",
    "lending": 'WITH b AS (SELECT "group", group_path, sum(borrowed_hours) AS borrowed_hours, '
    "sum(lent_hours) AS borrowed_lent_hours, sum(lent_cost) AS borrowed_lent_cost "
    "FROM borrowed_usage WHERE month = {month} GROUP BY ALL), "
    'l AS (SELECT "group", group_path, sum(lent_hours) AS lent_hours, '
    "sum(lent_cost) AS lent_cost FROM reserved_idle WHERE month = {month} "
    "GROUP BY ALL) "
    'SELECT coalesce(b."group", l."group") AS "group", '
    "coalesce(b.group_path, l.group_path) AS group_path, "
    "coalesce(b.borrowed_hours, 0) AS borrowed_hours, "
    "coalesce(b.borrowed_lent_hours, 0) AS borrowed_lent_hours, "
    "coalesce(b.borrowed_lent_cost, 0) AS borrowed_lent_cost, "
    "coalesce(l.lent_hours, 0) AS lent_hours, coalesce(l.lent_cost, 0) AS lent_cost "
    'FROM b FULL OUTER JOIN l ON b."group" = l."group" '
    "WHERE coalesce(b.borrowed_hours, 0) + coalesce(l.lent_hours, 0) > 0 "
    "ORDER BY 2, 1",
    "in_use_now": "SELECT pool, kind, gpu_type, capacity, gpus_in_use, tasks, cost_per_hour, "
    "currency FROM in_use_now ORDER BY pool",
}
"""Each part of the answer and its query (``{month}``: the month as a DATE literal)."""


def figures(
    conn: duckdb.DuckDBPyConnection,
    period: date,
    groups: Sequence[str] | None = None,
    timeout_s: float = 10.0,
    parts: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The month's figures: each part as a list of rows (objects with the columns' names),
    ``idle`` as one object (or null before any capacity was recorded). Amounts are exact
    decimal text, as ledger SQL answers them. ``lending``: per group that borrowed or lent,
    its borrowed GPU-hours, those of them on other groups' idle reservations
    (``borrowed_lent_*``) and what its own idle reservation lent (``lent_*``). ``parts``:
    only those of :data:`QUERIES` (a page that shows two of them need not derive the
    month's lending for five)."""
    unknown = sorted(set(parts or ()) - set(QUERIES))
    if unknown:
        raise ValueError(f"no CIO figure {', '.join(unknown)}: one of {', '.join(QUERIES)}")
    month = f"DATE '{period.isoformat()}'"
    out: dict[str, Any] = {
        "period": f"{period:%Y-%m}",
        "period_start": f"{period:%Y-%m-%d}T00:00:00Z",
        "period_end": f"{next_month(period):%Y-%m-%d}T00:00:00Z",
    }
    with month_pieces(conn, period) as pieces:  # lending derived from the month alone
        for name, sql in QUERIES.items():
            if parts is not None and name not in parts:
                continue
            res = run_readonly(
                conn,
                sql.format(month=month),
                limit=10_000,
                timeout_s=timeout_s,
                groups=groups,
                pieces=pieces,
            )
            rows = [dict(zip(res.columns, r)) for r in res.rows]
            out[name] = (rows[0] if rows else None) if name == "idle" else rows
    return out
