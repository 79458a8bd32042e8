"""The ledger's views, each written once against a :class:`~.dialect.Dialect` and rendered for
DuckDB (:mod:`.schema`) and PostgreSQL (:mod:`.pgschema`): usage and its month pieces, the
monthly aggregate's reads, cloud spend, capacity and the CIO's views, lending
(:mod:`.lending`) and lost work (:mod:`.lost`). :mod:`.schema`'s docstring explains the layout
and the arithmetic."""

from __future__ import annotations

from klique_util.units import UNITS_PER_HOUR

from . import lending, lost
from .dialect import (
    FAR_FUTURE,
    NO_PRICE,
    SNAPSHOTS,
    SUM_PRECISION,
    UNITS_PER_MICRO_HOUR,
    Dialect,
    amount_hours,
    cost,
    dec,
    hours,
    levels,
    micro,
    q,
    round_div,
    until,
)
from .tables import LEDGER, MONTHLY_KEY

DIMENSIONS = [
    "group",
    "group_path",
    "project",
    "user",
    "channel",
    "policy",
    "profile",
    "resource",
    "pool",
    "gpu_type",
]
"""What ``ledger_monthly`` and ``usage_monthly`` are broken down by, besides the month."""

_DIMS = ", ".join(q(d) for d in DIMENSIONS)


def cols(alias: str) -> str:
    """The ledger's columns of ``alias``, in table order."""
    return ", ".join(f"{alias}.{q(n)}" for n in LEDGER.column_names)


def pieces_sql(d: Dialect, source: str) -> str:
    """The month pieces of the ledger rows of ``source`` (a table or a parenthesised query
    with the ledger's columns, aliased ``l``): one row per interval and UTC month it touches.
    Most intervals sit in one month and are kept whole (the first branch); the few that cross
    a month end are cut at each boundary (the second)."""
    end = until(d)
    return f"""
    SELECT {cols("l")}, date_trunc('month', l.start_at) AS month_start,
           l.start_at AS piece_start, {end} AS piece_end
    FROM {source} l
    WHERE {d.same_month("l.start_at", end)}
    UNION ALL
    SELECT {cols("l")}, m.month_start,
           greatest(l.start_at, m.month_start) AS piece_start,
           least({end}, m.month_start + {d.month}) AS piece_end
    FROM {source} l{d.months_of("l.start_at", end)}
    WHERE {d.other_month("l.start_at", end)}"""


def _price_at(start: str) -> str:
    """The join of the price in force at ``start`` for the row's GPU type (``p``)."""
    return f"""LEFT JOIN price_periods pp
       ON p.gpu_type = pp.gpu_type
      AND {start} >= pp.effective_from AND {start} < pp.effective_to"""


def monthly_rows_sql(d: Dialect, source: str) -> str:
    """``ledger_monthly`` rows (not yet merged with existing ones) for the rows of
    ``source``."""
    ms = d.ms("p.piece_start", "p.piece_end")
    ms_sum = f"CAST(sum({ms}) AS BIGINT)" if d.pg else f"sum({ms})"
    return f"""
SELECT CAST(p.month_start AS DATE) AS month, p."group",
       coalesce(p.group_path, '') AS group_path, coalesce(p.project, '') AS project,
       p."user", coalesce(p.channel, 'api') AS channel, p.policy, p.profile, p.resource,
       p.pool, p.gpu_type, coalesce(pp.effective_from, {NO_PRICE}) AS price_from,
       count(*) AS pieces, {ms_sum} AS ms,
       sum(p.gpus * {ms}) AS gpu_ms, sum(p.time_weight * {ms}) AS budget_ms
FROM ({pieces_sql(d, source)}) p
{_price_at("p.piece_start")}
{d.group_by("1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12")}"""


def merge_monthly(d: Dialect) -> str:
    """Adds rows (``{rows}``: a query) to ``ledger_monthly``, summing into existing keys."""
    if d.pg:
        key = ", ".join(q(k) for k in MONTHLY_KEY)
        return (
            "\nINSERT INTO ledger_monthly {rows}\n"
            f"ON CONFLICT ({key}) DO UPDATE SET "
            "pieces = ledger_monthly.pieces + excluded.pieces,\n"
            "    ms = ledger_monthly.ms + excluded.ms, "
            "gpu_ms = ledger_monthly.gpu_ms + excluded.gpu_ms,\n"
            "    budget_ms = ledger_monthly.budget_ms + excluded.budget_ms"
        )
    return """
INSERT INTO ledger_monthly ({rows})
ON CONFLICT DO UPDATE SET pieces = pieces + excluded.pieces, ms = ms + excluded.ms,
    gpu_ms = gpu_ms + excluded.gpu_ms, budget_ms = budget_ms + excluded.budget_ms"""


def monthly_pieces(d: Dialect) -> str:
    """Every month piece as ``ledger_monthly`` rows (``m``): the aggregate of the closed
    intervals, the open intervals computed live and the pending closed ones."""
    return f"""
    SELECT month, {_DIMS}, price_from, pieces, ms, gpu_ms, budget_ms FROM ledger_monthly
    UNION ALL
    {monthly_rows_sql(d, "(SELECT * FROM ledger WHERE end_at IS NULL)")}
    UNION ALL
    {monthly_rows_sql(d, "ledger_monthly_pending")}
"""


def _monthly_sums(d: Dialect, a: str) -> str:
    """The measures of ``a`` rows joined to their price ``p``, each rounded once from the
    exact sums."""
    s = SUM_PRECISION
    return f"""sum({a}.pieces) AS pieces, sum({a}.ms) AS ms,
       {dec(d, round_div(d, f"{d.huge(f'sum({a}.ms)')} * 10", 36), s)} AS hours,
       {dec(d, round_div(d, d.huge(f"sum({a}.gpu_ms) * 1000"), UNITS_PER_MICRO_HOUR), s)}
           AS gpu_hours,
       {dec(d, round_div(d, d.huge(f"sum({a}.budget_ms) * 1000"), UNITS_PER_MICRO_HOUR), s)}
           AS budget_hours,
       {d.any_value("p.currency")} AS currency,
       {
        dec(
            d,
            round_div(
                d,
                f"sum({d.huge(f'{a}.gpu_ms * 1000')} * {d.huge('p.per_gpu_hour * 1000000')})",
                UNITS_PER_HOUR,
            ),
            s,
        )
    }
           AS cost"""


def _month_split(d: Dialect, source: str, start: str, end: str) -> str:
    """The rows of ``source`` (alias ``x``) cut at UTC month starts: ``month_start``,
    ``piece_start``, ``piece_end`` for [``start``, ``end``), empty ranges dropped."""
    return f"""
    SELECT x.*, m.month_start, greatest({start}, m.month_start) AS piece_start,
           least({end}, m.month_start + {d.month}) AS piece_end
    FROM {source} x{d.months_of(start, end)}
    WHERE {end} > {start}"""


def _usage_views(d: Dialect) -> dict[str, str]:
    now = d.now
    end = until(d)
    mp = monthly_pieces(d)
    return {
        # Each price with the time it stops applying: the next price's effective_from for
        # the same GPU type, or the far future.
        "price_periods": f"""
SELECT gpu_type, per_gpu_hour, currency, effective_from,
       coalesce(lead(effective_from) OVER (PARTITION BY gpu_type ORDER BY effective_from),
                {FAR_FUTURE}) AS effective_to
FROM prices""",
        "usage": f"""
SELECT u.*, {levels(d, "u")},
       {hours(d, "u.ms")} AS hours,
       {amount_hours(d, "u.ms", "u.gpus")} AS gpu_hours,
       {amount_hours(d, "u.ms", "u.time_weight")} AS budget_hours
FROM (SELECT {cols("l")}, {end} AS until_at,
             {d.ms("l.start_at", end)} AS ms FROM ledger l) u""",
        # the price whose period holds the interval's start: DuckDB's ASOF join, a range
        # join on price_periods in PostgreSQL
        "usage_priced": f"""
SELECT u.*, p.per_gpu_hour, p.currency, p.effective_from AS price_from,
       {cost(d, "u.ms", "u.gpus", "p.per_gpu_hour")} AS cost
FROM usage u
"""
        + (
            """LEFT JOIN price_periods p ON u.gpu_type = p.gpu_type
      AND u.start_at >= p.effective_from AND u.start_at < p.effective_to"""
            if d.pg
            else "ASOF LEFT JOIN prices p ON u.gpu_type = p.gpu_type AND u.start_at >= p.effective_from"
        ),
        # Each piece priced by the price in effect at the piece's start: a hash join on
        # gpu_type and a range test on price_periods, the same answer as an ASOF join and
        # about 7x faster over 10 million rows.
        "usage_by_month": f"""
SELECT p.*, pp.per_gpu_hour, pp.currency, pp.effective_from AS price_from,
       {cost(d, "p.ms", "p.gpus", "pp.per_gpu_hour")} AS cost
FROM (SELECT q.*, {levels(d, "q")},
             {hours(d, "q.ms")} AS hours,
             {amount_hours(d, "q.ms", "q.gpus")} AS gpu_hours,
             {amount_hours(d, "q.ms", "q.time_weight")} AS budget_hours
      FROM (SELECT {cols("l")}, CAST(l.month_start AS DATE) AS month, l.piece_start,
                   l.piece_end, {d.ms("l.piece_start", "l.piece_end")} AS ms
            FROM ({pieces_sql(d, "ledger")}) l) q) p
{_price_at("p.piece_start")}""",
        # usage_by_month summed per month and dimension: the closed intervals from
        # ledger_monthly, the open ones computed live (they are few, and the zonemaps find
        # them).
        "usage_monthly": f"""
WITH m AS ({mp})
SELECT m.month, m."group", nullif(m.group_path, '') AS group_path, {levels(d, "m")},
       nullif(m.project, '') AS project, m."user", m.channel, m.policy, m.profile,
       m.resource, m.pool, m.gpu_type,
       {_monthly_sums(d, "m")}
FROM m
LEFT JOIN prices p ON p.gpu_type = m.gpu_type AND p.effective_from = m.price_from
{d.group_by(", ".join("m." + q(k) for k in MONTHLY_KEY[:-1]))}""",
        # usage_monthly rolled up to every level of the group path: one row per month and
        # group of any level (a business unit, a department, a team), summing its whole
        # subtree as the paths recorded it, exact from the integer milliseconds like
        # usage_monthly. Rows with no recorded path are in no level.
        "usage_by_level": f"""
WITH m AS ({mp}),
x AS (SELECT m.*, {d.split_path("m.group_path")} AS parts FROM m WHERE m.group_path <> ''),
"""
        + (
            """e AS (SELECT x.*, lv.level FROM x CROSS JOIN LATERAL
      generate_series(1, cardinality(x.parts)) AS lv(level))"""
            if d.pg
            else "e AS (SELECT x.*, unnest(generate_series(1, len(x.parts))) AS level FROM x)"
        )
        + f"""
SELECT e.month, CAST(e.level AS INTEGER) AS level, e.parts[e.level] AS name,
       array_to_string(e.parts[1:e.level], '/') AS path,
       {_monthly_sums(d, "e")}
FROM e
LEFT JOIN prices p ON p.gpu_type = e.gpu_type AND p.effective_from = e.price_from
{d.group_by("1, 2, 3, 4")}""",
        # usage_monthly rolled up by business unit (and department) as levels() names them,
        # exact like usage_by_level.
        "usage_by_business_unit": f"""
WITH m AS ({mp}),
e AS (SELECT m.*, {d.path_part("m", 3)} AS business_unit FROM m WHERE m.group_path <> '')
SELECT e.month, e.business_unit, {_monthly_sums(d, "e")}
FROM e
LEFT JOIN prices p ON p.gpu_type = e.gpu_type AND p.effective_from = e.price_from
WHERE e.business_unit IS NOT NULL
{d.group_by("1, 2")}""",
        "usage_by_department": f"""
WITH m AS ({mp}),
e AS (SELECT m.*, {d.path_part("m", 3)} AS business_unit,
             {d.path_part("m", 2)} AS department FROM m WHERE m.group_path <> '')
SELECT e.month, e.business_unit, e.department, {_monthly_sums(d, "e")}
FROM e
LEFT JOIN prices p ON p.gpu_type = e.gpu_type AND p.effective_from = e.price_from
WHERE e.department IS NOT NULL
{d.group_by("1, 2, 3")}""",
        "cloud_node_usage": _cloud_node_usage(d, now),
        # cloud spend per month, pool, lifecycle and instance type
        "cloud_spend_monthly": f"""
SELECT month, pool, lifecycle, instance_type, {d.any_value("currency")} AS currency,
       count(*) AS nodes, sum(ms) AS ms, CAST(sum(hours) AS {d.decimal(SUM_PRECISION, 6)})
           AS node_hours,
       CAST(sum(gpu_hours) AS {d.decimal(SUM_PRECISION, 6)}) AS gpu_hours,
       CAST(sum(cost) AS {d.decimal(SUM_PRECISION, 6)}) AS cost
FROM cloud_node_usage
{d.group_by("1, 2, 3, 4")}""",
    }


def _cloud_node_usage(d: Dialect, now: str) -> str:
    """One row per cloud node and UTC month it ran in (a running node up to now): its hours,
    GPU-hours and cost (hours x ``per_hour``, rounded half up to the millionth)."""
    end = until(d, "c")
    return f"""
SELECT n.*, {hours(d, "n.ms")} AS hours, {amount_hours(d, "n.ms", "n.gpus")} AS gpu_hours,
       {dec(d, round_div(d, f"{d.huge('n.ms')} * {micro('n.per_hour')}", 3_600_000))} AS cost
FROM (
    SELECT c.node, c.pool, c.provider, c.instance_type, c.lifecycle, c.gpus, c.per_hour,
           c.currency, c.start_at, c.end_at, c.end_reason, c.revision,
           CAST(m.month_start AS DATE) AS month,
           {
        d.ms("greatest(c.start_at, m.month_start)", f"least({end}, m.month_start + {d.month})")
    } AS ms
    FROM cloud_nodes c{d.months_of("c.start_at", end)}
) n"""


def _capacity_views(d: Dialect) -> dict[str, str]:
    """Capacity, idle and the CIO's views (:mod:`.capacity`)."""
    now = d.now
    av = d.any_value
    return {
        # each pool's declared capacity with the time range of the revision that declared it
        "capacity_periods": f"""
SELECT c.effective_from, s.effective_to, c.revision, c.pool, c.kind, c.gpu_type, c.gpus
FROM capacity c JOIN ({SNAPSHOTS}) s ON s.effective_from = c.effective_from""",
        # capacity-hours per month and pool, until now, priced like usage (the price in
        # force at each piece's start)
        "capacity_by_month": f"""
SELECT CAST(p.month_start AS DATE) AS month, p.pool, p.kind, p.gpu_type, p.gpus, p.revision,
       p.piece_start, p.piece_end, p.ms, {amount_hours(d, "p.ms", "p.gpus")} AS gpu_hours,
       pp.per_gpu_hour, pp.currency, {cost(d, "p.ms", "p.gpus", "pp.per_gpu_hour")} AS cost
FROM (SELECT q.*, {d.ms("q.piece_start", "q.piece_end")} AS ms
      FROM ({
            _month_split(
                d,
                "(SELECT *, least(effective_to, " + now + ") AS until_at FROM capacity_periods)",
                "x.effective_from",
                "x.until_at",
            )
        }) q) p
{_price_at("p.piece_start")}""",
        # the CIO's use of the estate: per month and pool, capacity, use and idle, hours and
        # cost
        "estate_use": f"""
WITH c AS (SELECT month, pool, {av("kind")} AS kind, {av("gpu_type")} AS gpu_type,
                  sum(gpu_hours) AS capacity_hours, sum(cost) AS capacity_cost,
                  {av("currency")} AS currency
           FROM capacity_by_month {d.group_by("1, 2")}),
u AS (SELECT month, pool, {av("gpu_type")} AS gpu_type, sum(gpu_hours) AS gpu_hours,
             sum(cost) AS cost, {av("currency")} AS currency
      FROM usage_monthly {d.group_by("1, 2")})
SELECT coalesce(c.month, u.month) AS month, coalesce(c.pool, u.pool) AS pool, c.kind,
       coalesce(c.gpu_type, u.gpu_type) AS gpu_type, c.capacity_hours,
       coalesce(u.gpu_hours, 0) AS gpu_hours,
       c.capacity_hours - coalesce(u.gpu_hours, 0) AS idle_hours,
       CAST(round(100 * coalesce(u.gpu_hours, 0) / nullif(c.capacity_hours, 0), 1)
            AS {d.decimal(9, 1)}) AS used_pct,
       coalesce(c.currency, u.currency) AS currency, c.capacity_cost,
       coalesce(u.cost, 0) AS cost, c.capacity_cost - coalesce(u.cost, 0) AS idle_cost
FROM c FULL OUTER JOIN u ON c.month = u.month AND c.pool = u.pool""",
        # who pays for idle capacity, per month: the reserving groups for the reserved GPUs
        # nobody used, overhead for the rest; reserved idle + used + unreserved idle =
        # capacity
        "idle_cost": f"""
WITH e AS (SELECT month, {av("currency")} AS currency, sum(capacity_cost) AS capacity_cost,
                  sum(cost) AS used_cost, sum(capacity_hours) AS capacity_hours,
                  sum(gpu_hours) AS used_hours
           FROM estate_use WHERE capacity_hours IS NOT NULL {d.group_by("1")}),
r AS (SELECT month, sum(idle_hours) AS reserved_idle_hours, sum(idle_cost) AS reserved_idle_cost,
             sum(lent_hours) AS lent_hours, sum(lent_cost) AS lent_cost
      FROM reserved_idle {d.group_by("1")}),
b AS (SELECT month, sum(borrowed_hours) AS borrowed_hours FROM borrowed_usage
      {d.group_by("1")})
SELECT e.month, e.currency, e.capacity_hours, e.used_hours,
       coalesce(r.reserved_idle_hours, 0) AS reserved_idle_hours,
       e.capacity_hours - e.used_hours - coalesce(r.reserved_idle_hours, 0)
           AS unreserved_idle_hours,
       e.capacity_cost, e.used_cost, coalesce(r.reserved_idle_cost, 0) AS reserved_idle_cost,
       e.capacity_cost - e.used_cost - coalesce(r.reserved_idle_cost, 0)
           AS unreserved_idle_cost,
       coalesce(b.borrowed_hours, 0) AS borrowed_hours, coalesce(r.lent_hours, 0) AS lent_hours,
       coalesce(r.lent_cost, 0) AS lent_cost
FROM e LEFT JOIN r ON r.month = e.month LEFT JOIN b ON b.month = e.month""",
        # cloud capacity and spend in use now: per pool, declared capacity, GPUs held,
        # cost/hour
        "in_use_now": f"""
WITH cap AS (SELECT pool, kind, gpu_type, gpus FROM capacity_periods
             WHERE effective_from <= {now} AND effective_to > {now}),
u AS (SELECT pool, {av("gpu_type")} AS gpu_type, count(*) AS tasks, sum(gpus) AS gpus,
             sum(gpus * per_gpu_hour) AS cost_per_hour, {av("currency")} AS currency
      FROM usage_priced WHERE end_at IS NULL GROUP BY pool)
SELECT coalesce(cap.pool, u.pool) AS pool, cap.kind, coalesce(cap.gpu_type, u.gpu_type)
           AS gpu_type, cap.gpus AS capacity, coalesce(u.gpus, 0) AS gpus_in_use,
       coalesce(u.tasks, 0) AS tasks, coalesce(u.cost_per_hour, 0) AS cost_per_hour,
       -- an idle pool's currency: its GPU type's price in force, else the estate's
       coalesce(u.currency,
                (SELECT p.currency FROM prices p WHERE p.gpu_type = cap.gpu_type
                   AND p.effective_from <= {now} ORDER BY p.effective_from DESC LIMIT 1),
                (SELECT min(p.currency) FROM prices p)) AS currency
FROM cap FULL OUTER JOIN u ON cap.pool = u.pool""",
    }


LOST_WORK_VIEW = "lost_work"
"""The view PostgreSQL's migration 5 adds with its table (``preemptions``)."""

VIEW_ORDER: tuple[str, ...] = (
    "price_periods",
    "usage",
    "usage_priced",
    "usage_by_month",
    "usage_monthly",
    "usage_by_level",
    "usage_by_business_unit",
    "usage_by_department",
    "cloud_node_usage",
    "cloud_spend_monthly",
    "capacity_periods",
    "capacity_by_month",
    *lending.ORDER,
    "estate_use",
    "idle_cost",
    "in_use_now",
    LOST_WORK_VIEW,
)
"""The views in an order where each reads only tables and views before it."""


def views(d: Dialect) -> dict[str, str]:
    """Every view's SELECT in dialect ``d``, by name."""
    out = {**_usage_views(d), **_capacity_views(d), **lending.views(d)}
    out[LOST_WORK_VIEW] = lost.view_sql(
        cost(d, "p.lost_ms", "p.gpus", "pp.per_gpu_hour"),
        "CAST(date_trunc('month', p.preempted_at) AS DATE)",
    )
    assert set(out) == set(VIEW_ORDER), "every view has its place in VIEW_ORDER"
    return out
