"""The ledger as a FOCUS 1.2 cost and usage dataset (FinOps Foundation, focus.finops.org).

Finance teams load FOCUS files from every cloud into one tool; this makes Klique's GPU-hours
one more provider there. One row per **charge**: a ledger interval's piece inside one UTC
month (``usage_by_month``), since a FOCUS charge period lies within its billing period and
Klique's billing period is the calendar month. Every column keeps its FOCUS meaning:

- the billing account is the interval's top group (who receives the statement), the
  sub account its team with the path as id (``north/ml/team-a``); the invoice is the
  statement of that team for that month (``2026-11/north/ml/team-a``);
- the charge is ``Usage``, ``Usage-Based``, priced in GPU-hours of its GPU type (the SKU),
  at the price in effect at the piece's start (the SKU price, ``h100@2026-01-01T00:00:00Z``);
- the list price is the estate's list price for the type when it declares one (committed
  cloud capacity bought below list), else the price itself; the contracted price is the
  price the ledger charges; billed and effective cost are the contracted cost;
- the resource is the task; user, project, pool, GPU type, policy and profile are tags
  (``klique/user``..., ``klique/channel``: schedule, pipeline or api), and ``x_``-prefixed
  columns carry the interval id, the group's
  business unit and department.

Times are ``YYYY-MM-DDTHH:MM:SSZ`` (FOCUS's date/time format has no fraction): a charge
period starts at the piece's start truncated to the second and ends at its end rounded up, so
it always covers the charge and stays within the month. Quantities and costs are the ledger's
exact ones (computed from milliseconds), as decimal text.

Columns that FOCUS makes conditional on features Klique does not have are null where FOCUS
1.0 lists them (commitment discounts, regions: "null when not applicable") and left out
where 1.1 or 1.2 added them (a second currency: PricingCurrency...; commitment discount
quantities). PricingCategory is ``Standard``, the 1.1 name of 1.0's ``On-Demand``.
"""

from __future__ import annotations

import re
from datetime import date
from typing import Any, Iterator, Sequence

import duckdb
import psycopg

from klique_util.excerpt import excerpt
from klique_util.units import UNITS_PER_HOUR

from . import scope
from .db import AnyLedgerConn
from .lending import month_pieces
from .schema import _MONTHLY_PIECES

PROVIDER = "Klique"
"""ProviderName, PublisherName and InvoiceIssuerName: the platform that sells the GPU-hours
(inside the company, the IT department that runs Klique)."""

SERVICE = ("Compute", "Other (Compute)", "GPU compute")
"""ServiceCategory, ServiceSubcategory (its FOCUS 1.2 child), ServiceName."""

UNIT = "GPU-Hours"
"""ConsumedUnit and PricingUnit (FOCUS's unit format: ``<singular>-<plural time unit>``)."""

_TS = "'%Y-%m-%dT%H:%M:%SZ'"
_PG_TS = '\'YYYY-MM-DD"T"HH24:MI:SS"Z"\''


def _ts(expr: str, pg: bool = False) -> str:
    return f"to_char({expr}, {_PG_TS})" if pg else f"strftime({expr}, {_TS})"


def _text(expr: str) -> str:
    return f"CAST({expr} AS VARCHAR)"


_ACCOUNT = "string_split(coalesce(u.group_path, u.\"group\"), '/')[1]"
_PG_ACCOUNT = "split_part(coalesce(u.group_path, u.\"group\"), '/', 1)"
_SUB = 'coalesce(u.group_path, u."group")'
_START = "date_trunc('second', u.piece_start)"
_END = (
    "CASE WHEN u.piece_end = date_trunc('second', u.piece_end) THEN u.piece_end "
    "ELSE date_trunc('second', u.piece_end) + INTERVAL '1 second' END"
)
_LIST_COST = "u.list_cost"


def _lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _columns(pg: bool = False) -> list[tuple[str, str, str]]:
    """:data:`COLUMNS` for DuckDB, or for PostgreSQL (``to_char``, ``split_part``)."""
    account = _PG_ACCOUNT if pg else _ACCOUNT
    invoice_month = "to_char(u.month, 'YYYY-MM')" if pg else "strftime(u.month, '%Y-%m')"
    return [
        ("BilledCost", "DECIMAL(18,6)", _text("u.cost")),
        ("BillingAccountId", "VARCHAR", account),
        ("BillingAccountName", "VARCHAR", account),
        ("BillingAccountType", "VARCHAR", "'Top-level group'"),
        ("BillingCurrency", "VARCHAR", "u.currency"),
        ("BillingPeriodEnd", "TIMESTAMP", "'{billing_end}'"),
        ("BillingPeriodStart", "TIMESTAMP", "'{billing_start}'"),
        ("CapacityReservationId", "VARCHAR", "NULL"),
        ("CapacityReservationStatus", "VARCHAR", "NULL"),
        ("ChargeCategory", "VARCHAR", "'Usage'"),
        ("ChargeClass", "VARCHAR", "NULL"),
        (
            "ChargeDescription",
            "VARCHAR",
            "CAST(u.gpus AS VARCHAR) || ' ' || u.gpu_type || ' GPU on ' || u.pool || ' for task ' "
            "|| u.task || ' (' || u.resource || ')'",
        ),
        ("ChargeFrequency", "VARCHAR", "'Usage-Based'"),
        ("ChargePeriodEnd", "TIMESTAMP", _ts(_END, pg)),
        ("ChargePeriodStart", "TIMESTAMP", _ts(_START, pg)),
        ("CommitmentDiscountCategory", "VARCHAR", "NULL"),
        ("CommitmentDiscountId", "VARCHAR", "NULL"),
        ("CommitmentDiscountName", "VARCHAR", "NULL"),
        ("CommitmentDiscountStatus", "VARCHAR", "NULL"),
        ("CommitmentDiscountType", "VARCHAR", "NULL"),
        ("ConsumedQuantity", "DECIMAL(18,6)", _text("u.gpu_hours")),
        ("ConsumedUnit", "VARCHAR", _lit(UNIT)),
        ("ContractedCost", "DECIMAL(18,6)", _text("u.cost")),
        ("ContractedUnitPrice", "DECIMAL(18,6)", _text("u.per_gpu_hour")),
        ("EffectiveCost", "DECIMAL(18,6)", _text("u.cost")),
        ("InvoiceId", "VARCHAR", f"{invoice_month} || '/' || {_SUB}"),
        ("InvoiceIssuerName", "VARCHAR", _lit(PROVIDER)),
        ("ListCost", "DECIMAL(18,6)", _text(_LIST_COST)),
        ("ListUnitPrice", "DECIMAL(18,6)", _text("u.list_per_gpu_hour")),
        ("PricingCategory", "VARCHAR", "'Standard'"),
        ("PricingQuantity", "DECIMAL(18,6)", _text("u.gpu_hours")),
        ("PricingUnit", "VARCHAR", _lit(UNIT)),
        ("ProviderName", "VARCHAR", _lit(PROVIDER)),
        ("PublisherName", "VARCHAR", _lit(PROVIDER)),
        ("RegionId", "VARCHAR", "NULL"),
        ("RegionName", "VARCHAR", "NULL"),
        ("ResourceId", "VARCHAR", "u.task"),
        ("ResourceName", "VARCHAR", "u.task"),
        ("ResourceType", "VARCHAR", "'GPU task'"),
        ("ServiceCategory", "VARCHAR", _lit(SERVICE[0])),
        ("ServiceName", "VARCHAR", _lit(SERVICE[2])),
        ("ServiceSubcategory", "VARCHAR", _lit(SERVICE[1])),
        ("SkuId", "VARCHAR", "u.gpu_type"),
        ("SkuMeter", "VARCHAR", "'GPU Usage'"),
        (
            "SkuPriceDetails",
            "JSON",
            '\'{{"x_GpuType":"\' || u.gpu_type || \'","x_EffectiveFrom":"\' || '
            f"{_ts('u.price_from', pg)} || '\"}}}}'",
        ),
        ("SkuPriceId", "VARCHAR", f"u.gpu_type || '@' || {_ts('u.price_from', pg)}"),
        ("SubAccountId", "VARCHAR", _SUB),
        ("SubAccountName", "VARCHAR", 'u."group"'),
        ("SubAccountType", "VARCHAR", "'Team'"),
        (
            "Tags",
            "JSON",
            '\'{{"klique/user":"\' || u."user" || \'","klique/project":\' || '
            "coalesce('\"' || u.project || '\"', 'null') || ',\"klique/pool\":\"' || u.pool || "
            '\'","klique/gpu_type":"\' || u.gpu_type || \'","klique/policy":"\' || '
            'u.policy || \'","klique/profile":"\' || u.profile || \'","klique/group":"\' '
            '|| u."group" || \'","klique/channel":\' || '
            "coalesce('\"' || u.channel || '\"', 'null') || '}}'",
        ),
        ("x_IntervalId", "VARCHAR", "u.interval_id"),
        ("x_BusinessUnit", "VARCHAR", "u.business_unit"),
        ("x_Department", "VARCHAR", "u.department"),
        ("x_Gpus", "DECIMAL(12,3)", _text("u.gpus")),
        ("x_ChargeMs", "BIGINT", _text("u.ms")),
    ]


COLUMNS = _columns()
"""The FOCUS columns in file order: name, type (the Parquet file's), and the SQL of its value
(text) over a ``usage_by_month`` row ``u`` with its list price."""

COLUMNS_BY_NAME = [(name, expr) for name, _, expr in COLUMNS]

FOCUS_VERSION = "1.2"

MONTH_PATTERN = "^(19[7-9][0-9]|2[0-9]{3})-(0[1-9]|1[0-2])$"
"""A month, YYYY-MM, from 1970 (the ledger's times are epoch milliseconds) to 2999: the
API's ``period`` says it in its schema (issue 32: ``0000-00`` was schema-valid and refused)."""
_PERIOD = re.compile(MONTH_PATTERN)


def parse_period(text: str) -> date:
    """``2026-11`` as the first day of that month; ValueError naming the expected form."""
    m = _PERIOD.match(text)
    if not m:
        raise ValueError(
            f"period {excerpt(text)} is not a month from 1970 to 2999: write it as YYYY-MM "
            "(2026-11)"
        )
    return date(int(m.group(1)), int(m.group(2)), 1)


def next_month(d: date) -> date:
    return date(d.year + d.month // 12, d.month % 12 + 1, 1)


_ROWS = """
SELECT u.*, coalesce(lp.list_per_gpu_hour, u.per_gpu_hour) AS list_per_gpu_hour,
       CASE WHEN lp.list_per_gpu_hour IS NULL THEN u.cost
            ELSE CAST(round(u.gpu_hours * lp.list_per_gpu_hour, 6) AS DECIMAL(18,6))
       END AS list_cost
FROM usage_by_month u
LEFT JOIN prices lp
       ON lp.gpu_type = u.gpu_type AND lp.effective_from = u.price_from
WHERE u.month = {month} {scope}"""
"""The period's month pieces with the list price of the price period they are priced in."""


def _csv_field(expr: str, typ: str) -> str:
    """SQL for one CSV field of ``expr``: '' for NULL; a JSON object quoted (it always holds
    quotes and commas). Every other text is a name Klique validated (groups, pools, GPU
    types, projects and policies are estate names, users identities, tasks and intervals
    ids: no comma, quote or line break), a number or a time, so it needs no quoting; a
    regular expression per field would cost a tenth of the export's time."""
    if typ == "JSON":
        return f"coalesce('\"' || replace(({expr}), '\"', '\"\"') || '\"', '')"
    return f"coalesce(({expr}), '')"


def _half_cost(micro_mms: str) -> str:
    """Half a sum of thousandths of GPU-ms x price millionths, in currency, rounded half up
    to the millionth."""
    return (
        f"CAST(CAST(({micro_mms} + {UNITS_PER_HOUR}) // {2 * UNITS_PER_HOUR} AS "
        "DECIMAL(38,0)) * 0.000001 AS DECIMAL(18,6))"
    )


def _mms_hours(mms: str) -> str:
    """Thousandths of GPU-ms as GPU-hours, rounded half up to the millionth."""
    return f"CAST(CAST(({mms} + 1800) // 3600 AS DECIMAL(38,0)) * 0.000001 AS DECIMAL(18,6))"


_SPLIT_ROWS = f"""
SELECT x.side, x.interval_id, x.task, x."user", x.project, x."group", x.group_path, x.policy,
       x.pool, x.gpu_type, x.per_gpu_hour, x.currency, x.price_from, x.business_unit,
       x.department, l.profile, l.resource, l.channel, {{month}} AS month,
       CAST({{month}} AS TIMESTAMP) AS piece_start,
       CAST({{month}} AS TIMESTAMP) + INTERVAL 1 MONTH AS piece_end,
       {_mms_hours("x.mms")} AS gpu_hours,
       CASE WHEN x.side = 'borrowed' THEN -1 ELSE 1 END
           * {_half_cost("x.price_mms")} AS cost,
       CASE WHEN x.side = 'borrowed' THEN -1 ELSE 1 END
           * {_half_cost("x.list_mms")} AS list_cost,
       NULL AS gpus, NULL AS ms
FROM (SELECT x.side, x.interval_id, x.task, x."user", x.project, x."group", x.group_path,
             x.policy, x.pool, x.gpu_type, x.per_gpu_hour, x.currency, x.price_from,
             string_split(x.group_path, '/')[-3] AS business_unit,
             string_split(x.group_path, '/')[-2] AS department,
             CAST(sum(x.lent_mms) AS HUGEINT) AS mms,
             sum(CAST(x.lent_mms AS HUGEINT) * CAST(x.per_gpu_hour * 1000000 AS HUGEINT))
                 AS price_mms,
             sum(CAST(x.lent_mms AS HUGEINT)
                 * CAST(coalesce(lp.list_per_gpu_hour, x.per_gpu_hour) * 1000000 AS HUGEINT))
                 AS list_mms
      FROM {{pieces}} x
      LEFT JOIN prices lp ON lp.gpu_type = x.gpu_type AND lp.effective_from = x.price_from
      WHERE x.month = {{month}} AND x.lent_mms > 0 {{scope}}
      GROUP BY ALL) x
LEFT JOIN ledger l ON l.interval_id = x.interval_id"""
"""With ``borrowed: split``, the month's lent GPU-hours per borrowing interval and per
lending policy (kliqued.ledger.lending), each with half their cost: a credit to the borrower
(negative) and a charge to the lender, at the same price, so they add up to zero (to far
below a cent: kliqued.ledger.lending)."""

_SPLIT_OVERRIDES = {
    "ChargeCategory": "CASE WHEN u.side = 'borrowed' THEN 'Credit' ELSE 'Adjustment' END",
    "ChargeDescription": "CASE WHEN u.side = 'borrowed' THEN 'Half of the ' || u.gpu_type || ' GPU-hours task ' "
    "|| u.task || ' borrowed from idle reservations (paid by their groups)' ELSE 'Half of "
    "the ' || u.gpu_type || ' GPU-hours other groups borrowed from the idle reservation "
    "of ' || u.policy END",
    "ChargePeriodStart": _ts("u.piece_start"),
    "ChargePeriodEnd": _ts("u.piece_end"),
    "ConsumedQuantity": "NULL",
    "ConsumedUnit": "NULL",
    "ContractedUnitPrice": "NULL",
    "ListUnitPrice": "NULL",
    "ResourceId": "CASE WHEN u.side = 'borrowed' THEN u.task ELSE u.policy END",
    "ResourceName": "CASE WHEN u.side = 'borrowed' THEN u.task ELSE u.policy END",
    "ResourceType": "CASE WHEN u.side = 'borrowed' THEN 'GPU task' ELSE 'GPU reservation' END",
    "Tags": "CASE WHEN u.side = 'borrowed' THEN {borrower} ELSE {lender} END",
}
"""The columns whose meaning differs on a split row (a Credit or an Adjustment: no consumed
quantity, no unit price since the cost is half of quantity x price; the charge period is the
billing period, over which the lending is settled). The descriptions hold no comma: the
CSV quotes only the JSON columns."""


def _split_column(name: str, expr: str) -> str:
    if name == "Tags":
        tags = dict(COLUMNS_BY_NAME)["Tags"]
        lender = (
            '\'{{"klique/policy":"\' || u.policy || \'","klique/group":"\' || '
            'u."group" || \'","klique/gpu_type":"\' || u.gpu_type || \'"}}\''
        )
        return _SPLIT_OVERRIDES["Tags"].format(borrower=tags, lender=lender)
    return _SPLIT_OVERRIDES.get(name, expr)


FOCUS_SQL = f"""
SELECT {" || ',' || ".join(_csv_field(expr, typ) for _, typ, expr in COLUMNS)}
FROM ({_ROWS}) u
ORDER BY u.piece_start, u.interval_id"""
"""One CSV line per charge, made by DuckDB: a month of a ten-million-interval ledger is
about a million charges of sixty columns, and one text value per row crosses into Python
instead of sixty."""

PG_FOCUS_SQL = f"""
SELECT {" || ',' || ".join(_csv_field(expr, typ) for _, typ, expr in _columns(pg=True))}
FROM ({_ROWS}) u
ORDER BY u.piece_start, u.interval_id"""
""":data:`FOCUS_SQL` in PostgreSQL (the whole ledger; docs/ha.md)."""

SPLIT_SQL = f"""
SELECT {
    " || ',' || ".join(_csv_field(_split_column(name, expr), typ) for name, typ, expr in COLUMNS)
}
FROM ({_SPLIT_ROWS}) u
ORDER BY u.side, u."group", u.interval_id, u.policy, u.price_from"""
"""The split rows' CSV lines (``borrowed: split``), after the usage rows."""

UNPRICED_SQL = f"""
WITH m AS ({_MONTHLY_PIECES})
SELECT DISTINCT m.gpu_type FROM m
LEFT JOIN prices p ON p.gpu_type = m.gpu_type AND p.effective_from = m.price_from
WHERE m.month = {{month}} AND p.per_gpu_hour IS NULL {{scope}}
ORDER BY 1"""
"""The GPU types of the period's usage without a price, from the monthly aggregate (the
pre-aggregated closed intervals and the few open and pending ones): thousands of rows, not
the month's pieces."""

PG_UNPRICED_SQL = """
SELECT DISTINCT u.gpu_type FROM usage_by_month u
WHERE u.month = {month} AND u.per_gpu_hour IS NULL
ORDER BY 1"""
""":data:`UNPRICED_SQL` in PostgreSQL, from the month's pieces: the read-only role reads the
documented views only, not the internal monthly aggregate."""


class NoPrice(ValueError):
    """Usage in the period has no price: FOCUS costs may not be null. ``gpu_types`` names
    the GPU types without one."""

    def __init__(self, period: date, gpu_types: list[str]) -> None:
        self.gpu_types = gpu_types
        many = len(gpu_types) > 1
        super().__init__(
            f"no price for GPU type{'s' if many else ''} {', '.join(gpu_types)} in "
            f"{period:%Y-%m}: add {'them' if many else 'it'} to estate/pricing.yaml with an "
            "effective_from at or before the usage (docs/ledger.md)"
        )


def focus_csv(
    conn: AnyLedgerConn,
    period: date,
    groups: Sequence[str] | None = None,
    chunk_rows: int = 5000,
    borrowed: str = "borrower",
    pg: bool = False,
) -> Iterator[str]:
    """The FOCUS rows of one billing period (a UTC month) as CSV text in chunks, the header
    first. Raises :class:`NoPrice` before any row when usage in the period has no price.
    ``groups``: only their subtrees' rows (a group admin's), None for all. One query at a
    time on ``conn`` (a cursor the caller uses for nothing else meanwhile). ``borrowed``:
    ``settings.attribution.borrowed``; with ``split``, a Credit row per borrowing interval
    and an Adjustment row per lending policy follow the usage rows (:data:`SPLIT_SQL`).
    ``pg``: ``conn`` is a psycopg connection on PostgreSQL's ledger (the whole ledger, no
    split, only)."""
    if pg:
        if groups is not None or borrowed == "split":
            raise ValueError("PostgreSQL's FOCUS export is the whole ledger's, unsplit")
        if not isinstance(conn, psycopg.Connection):
            raise TypeError("pg=True reads through a psycopg connection")
        yield from _focus_pg(conn, period, chunk_rows)
        return
    if not isinstance(conn, duckdb.DuckDBPyConnection):
        raise TypeError("the DuckDB ledger is read through a DuckDB connection or cursor")
    where = "" if groups is None else "AND " + scope.visible("u", groups)
    # the month as a literal, not a parameter: DuckDB then prunes the month pieces before
    # pricing them (twice as fast); it is a date object's ISO text, nothing else
    month = f"DATE '{date(period.year, period.month, 1).isoformat()}'"
    where_m = "" if groups is None else "AND " + scope.visible("m", groups)
    missing = [
        r[0] for r in conn.execute(UNPRICED_SQL.format(scope=where_m, month=month)).fetchall()
    ]
    if missing:
        raise NoPrice(period, missing)
    start, end = f"{period:%Y-%m}-01T00:00:00Z", f"{next_month(period):%Y-%m-%d}T00:00:00Z"
    result = conn.execute(
        FOCUS_SQL.format(scope=where, month=month, billing_start=start, billing_end=end)
    )
    yield ",".join(name for name, _, _ in COLUMNS) + "\n"
    while True:
        rows = result.fetchmany(chunk_rows)
        if not rows:
            break
        yield "".join(r[0] + "\n" for r in rows)
    if borrowed != "split":
        return
    where_x = "" if groups is None else "AND " + scope.visible("x", groups)
    with month_pieces(conn, period) as pieces:
        result = conn.execute(
            SPLIT_SQL.format(
                scope=where_x, month=month, billing_start=start, billing_end=end, pieces=pieces
            )
        )
        while True:
            rows = result.fetchmany(chunk_rows)
            if not rows:
                break
            yield "".join(r[0] + "\n" for r in rows)


def _focus_pg(conn: psycopg.Connection[Any], period: date, chunk_rows: int) -> Iterator[str]:
    month = f"DATE '{date(period.year, period.month, 1).isoformat()}'"
    missing = [r[0] for r in conn.execute(PG_UNPRICED_SQL.format(month=month)).fetchall()]
    if missing:
        raise NoPrice(period, missing)
    start, end = f"{period:%Y-%m}-01T00:00:00Z", f"{next_month(period):%Y-%m-%d}T00:00:00Z"
    with conn.cursor(name="ledger_focus") as cur:
        cur.execute(
            PG_FOCUS_SQL.format(scope="", month=month, billing_start=start, billing_end=end)
        )
        yield ",".join(name for name, _, _ in COLUMNS) + "\n"
        while True:
            rows = cur.fetchmany(chunk_rows)
            if not rows:
                break
            yield "".join(r[0] + "\n" for r in rows)


PARQUET_COLUMNS = [(name, "VARCHAR" if typ == "JSON" else typ) for name, typ, _ in COLUMNS]
"""The Parquet file's column types: FOCUS dates as TIMESTAMP, amounts as DECIMAL, the
key-value columns as JSON text."""
