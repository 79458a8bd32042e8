"""The ledger's tables and views (DuckDB). ``ensure_schema`` is idempotent: tables are created
when missing, views are replaced so that their definition always follows this code.

Layout, for "GPU-hours by group and month over 10 million ledger rows within 1 s" on 2 cores:

- ``ledger`` (one row per placement interval) has exactly one index, the primary key on
  ``interval_id`` (an ART index), which closing an interval uses for its point update and the
  batch close for an index join. Aggregations never use an ART index and each extra index
  slows every insert, so there is no other. Rows are appended as placements happen, so the
  table is ordered by ``start_at`` and DuckDB's per-row-group min/max (zonemaps) prune time
  ranges and find the open intervals (``end_at IS NULL``) without reading the rest.
- ``usage_by_month`` computes month pieces from ``ledger`` at query time: exact and always
  current, about 1 s of CPU per 10 million rows (calendar arithmetic, a price join).
- ``ledger_monthly`` is the same pieces of the closed intervals, aggregated per month, user,
  project, group, policy, profile, resource, pool, GPU type and price period, in exact integer
  milliseconds and thousandths. The writer copies each interval it closes to
  ``ledger_monthly_pending`` in the same transaction (a point insert, about as cheap as the
  close itself), and folds the pending rows into ``ledger_monthly`` once there are
  ``FLUSH_AT`` of them (and at start): one aggregate per ten thousand closes instead of one
  per close. A GPU type's rows are rebuilt when it gains or loses a price period.
  ``usage_monthly`` = ``ledger_monthly`` + the pending and the open intervals' pieces computed
  live, priced by a join on (gpu_type, price_from): it answers "by group and month" from
  thousands of rows instead of millions, and always agrees with ``usage_by_month``.
- Derived hours and costs are DECIMAL(18,6) (sums DECIMAL(38,6)), computed exactly from
  integer milliseconds, thousandths of a GPU or weight and millionths of a price, and rounded
  half up to the millionth once: a query's ``round()`` and ``sum()`` then act on exact values,
  as finance expects of money. ``ms`` is the exact duration in integer milliseconds.
"""

from __future__ import annotations

from klique_util.units import UNITS_PER_HOUR

from .capacity import TABLES as CAPACITY_TABLES

LEDGER_COLUMNS = [
    ("interval_id", "VARCHAR"), ("task", "VARCHAR"), ("user", "VARCHAR"),
    ("project", "VARCHAR"), ("group", "VARCHAR"), ("policy", "VARCHAR"),
    ("profile", "VARCHAR"), ("resource", "VARCHAR"), ("pool", "VARCHAR"),
    ("gpu_type", "VARCHAR"), ("gpus", "DECIMAL(12,3)"), ("time_weight", "DECIMAL(12,3)"),
    ("start_at", "TIMESTAMP"), ("end_at", "TIMESTAMP"), ("end_reason", "VARCHAR"),
    ("revision", "VARCHAR"), ("group_path", "VARCHAR"), ("channel", "VARCHAR"),
]
"""The ledger's columns in table order (``user`` and ``group`` are quoted in SQL).
``group_path`` is the interval's group and its ancestors, top first, joined by ``/``
(``northwind/research/team-a``), as the estate in force at the interval's open had them; it
is after the others because databases from before it get it by ``ALTER TABLE ... ADD
COLUMN``; so is ``channel``: how the task was sent (``cli``, ``sdk``, ``api``, ``mcp``,
``schedule``, ``pipeline``, ``session``: kliqued/daemon/state/channels.py), NULL on rows from before
it (``usage_monthly`` and ``ledger_monthly`` count those as ``api``)."""

DIMENSIONS = ["group", "group_path", "project", "user", "channel", "policy", "profile",
              "resource", "pool", "gpu_type"]
"""What ``ledger_monthly`` and ``usage_monthly`` are broken down by, besides the month."""

_RESERVED = {"user", "group"}


def q(name: str) -> str:
    """A column name as SQL: ``user`` and ``group`` are reserved words."""
    return f'"{name}"' if name in _RESERVED else name


def _cols(alias: str) -> str:
    return ", ".join(f"{alias}.{q(n)}" for n, _ in LEDGER_COLUMNS)


NOW = "make_timestamp(epoch_us(current_timestamp))"
"""Now as a UTC TIMESTAMP, whatever the session's TimeZone: the start of the current
transaction, so every row of one query sees the same now."""

FAR_FUTURE = "TIMESTAMP '9999-12-31 23:59:59'"
NO_PRICE = "TIMESTAMP '-infinity'"
"""``ledger_monthly.price_from`` of pieces that have no price (a key column cannot be NULL)."""

_UNTIL = f"greatest(l.start_at, coalesce(l.end_at, {NOW}))"
"""End of an interval, or now for an open one; never before its start."""

_MS = "date_diff('millisecond', {a}, {b})"


def _milli(amount: str) -> str:
    """A DECIMAL amount (GPUs, a time weight: 3 decimals) as exact integer thousandths."""
    return f"CAST({amount} * 1000 AS BIGINT)"


def _micro(amount: str) -> str:
    """A DECIMAL(18,6) price as exact integer millionths."""
    return f"CAST({amount} * 1000000 AS BIGINT)"


def _round_div(numerator: str, denominator: int) -> str:
    """Integer division rounded half up, for a non-negative numerator."""
    return f"(({numerator}) + {denominator // 2}) // {denominator}"


def _dec(micro: str, typ: str = "DECIMAL(18,6)") -> str:
    """Integer millionths as a DECIMAL with 6 decimals (exact)."""
    width = 38 if "38" in typ else 18
    return f"CAST(CAST({micro} AS DECIMAL({width},0)) * 0.000001 AS {typ})"


def _hours(ms: str) -> str:
    """Milliseconds as hours, rounded half up to the millionth."""
    return _dec(_round_div(f"{ms} * 10", 36))


_UNITS_PER_MICRO_HOUR = UNITS_PER_HOUR // 1_000_000
"""milli x ms in a millionth of an hour (3600): units (klique_util.units) to 6-decimal hours."""


def _amount_micro(ms: str, amount: str) -> str:
    """Milliseconds times a 3-decimal amount (GPUs, a weight) in millionths of an hour,
    rounded half up: ms * milli / 3600."""
    return _round_div(f"{ms} * {_milli(amount)}", _UNITS_PER_MICRO_HOUR)


def _amount_hours(ms: str, amount: str) -> str:
    """Milliseconds times a 3-decimal amount as hours, rounded half up to the millionth."""
    return _dec(_amount_micro(ms, amount))


_MAX_BIGINT = 9_000_000_000_000_000_000


def _cost(ms: str, gpus: str, price: str) -> str:
    """A row's GPU-hours (as shown, from ``ms`` and ``gpus``) times its price, rounded half up
    to the millionth, in BIGINT (HUGEINT only for a product that would not fit): exactly what
    a reader recomputes from the row's gpu_hours and per_gpu_hour."""
    gh, pm = _amount_micro(ms, gpus), _micro(price)
    small = _round_div(f"({gh}) * {pm}", 10**6)
    large = f"CAST({_round_div(f'CAST({gh} AS HUGEINT) * {pm}', 10**6)} AS BIGINT)"
    return _dec(f"CASE WHEN {gh} <= {_MAX_BIGINT} // greatest({pm}, 1) THEN {small} "
                f"ELSE {large} END")


_SUM = "DECIMAL(38,6)"
"""The type of usage_monthly's sums."""

TABLES = """
CREATE TABLE IF NOT EXISTS ledger (
    interval_id  VARCHAR PRIMARY KEY,
    task         VARCHAR NOT NULL,
    "user"       VARCHAR NOT NULL,
    project      VARCHAR,
    "group"      VARCHAR NOT NULL,
    policy       VARCHAR NOT NULL,
    profile      VARCHAR NOT NULL,
    resource     VARCHAR NOT NULL,
    pool         VARCHAR NOT NULL,
    gpu_type     VARCHAR NOT NULL,
    gpus         DECIMAL(12,3) NOT NULL,
    time_weight  DECIMAL(12,3) NOT NULL,
    start_at     TIMESTAMP NOT NULL,
    end_at       TIMESTAMP,
    end_reason   VARCHAR,
    revision     VARCHAR,
    group_path   VARCHAR,
    channel      VARCHAR
);
CREATE TABLE IF NOT EXISTS prices (
    gpu_type       VARCHAR NOT NULL,
    per_gpu_hour   DECIMAL(18,6) NOT NULL,
    currency       VARCHAR NOT NULL,
    effective_from TIMESTAMP NOT NULL,
    list_per_gpu_hour DECIMAL(18,6)  -- NULL: the list price is per_gpu_hour
);
"""

CLOUD_TABLE = """
CREATE TABLE IF NOT EXISTS cloud_nodes (
    node           VARCHAR PRIMARY KEY,
    pool           VARCHAR NOT NULL,
    provider       VARCHAR NOT NULL,
    instance_type  VARCHAR NOT NULL,
    lifecycle      VARCHAR NOT NULL,          -- spot | on-demand
    gpus           INTEGER NOT NULL,
    per_hour       DECIMAL(18,6) NOT NULL,    -- the node's price an hour, fixed at its start
    currency       VARCHAR NOT NULL,
    start_at       TIMESTAMP NOT NULL,
    end_at         TIMESTAMP,
    end_reason     VARCHAR,
    revision       VARCHAR
);
"""
"""One row per cloud node an autoscaler started (docs/ledger.md, "Cloud spend"): the node's
interval, its instance type and lifecycle, and the price an hour the estate gave it at its
start (``autoscale.node_prices``, else its GPUs x the gpu_type's price)."""

FLUSH_AT = 10_000
"""Pending closed intervals folded into ``ledger_monthly`` at once."""

MONTHLY_TABLE = """
CREATE TABLE IF NOT EXISTS ledger_monthly (
    month       DATE NOT NULL,
    "group"     VARCHAR NOT NULL,
    group_path  VARCHAR NOT NULL,   -- '' for none (see ensure_schema)
    project     VARCHAR NOT NULL,   -- '' for none
    "user"      VARCHAR NOT NULL,
    channel     VARCHAR NOT NULL,
    policy      VARCHAR NOT NULL,
    profile     VARCHAR NOT NULL,
    resource    VARCHAR NOT NULL,
    pool        VARCHAR NOT NULL,
    gpu_type    VARCHAR NOT NULL,
    price_from  TIMESTAMP NOT NULL, -- effective_from of the price at the piece's start
    pieces      BIGINT NOT NULL,
    ms          BIGINT NOT NULL,
    gpu_ms      DECIMAL(38,3) NOT NULL,
    budget_ms   DECIMAL(38,3) NOT NULL,
    PRIMARY KEY (month, "group", group_path, project, "user", channel, policy, profile,
                 resource, pool, gpu_type, price_from)
);
"""

PENDING_TABLE = """
CREATE TABLE IF NOT EXISTS ledger_monthly_pending AS SELECT * FROM ledger WITH NO DATA;
"""

FEED_TABLE = """
CREATE TABLE IF NOT EXISTS ledger_feed (
    seq          BIGINT PRIMARY KEY,  -- the order in which intervals were closed (committed)
    interval_id  VARCHAR NOT NULL
);
"""
"""The billing feed: every closed interval with a number given when it closed, in the same
transaction. The daemon's one writer commits closes in order, so a reader that has seen
number n has seen every number below it: ``seq > cursor`` never skips a row and never repeats
one, across restarts (the numbers are in the database, not in memory)."""

FEED_SEQUENCE = "ledger_feed_seq"


def _ensure_feed(conn) -> None:
    """Creates the feed; a database from before it gets its closed intervals numbered in the
    order they ended (then by id), and the sequence continues after them."""
    if _columns(conn, "ledger_feed") is not None:
        conn.execute(f"CREATE SEQUENCE IF NOT EXISTS {FEED_SEQUENCE} START 1")
        return
    conn.execute(FEED_TABLE)
    conn.execute("INSERT INTO ledger_feed SELECT row_number() OVER (ORDER BY end_at, "
                 "interval_id), interval_id FROM ledger WHERE end_at IS NOT NULL")
    n = conn.execute("SELECT count(*) FROM ledger_feed").fetchone()[0]
    conn.execute(f"DROP SEQUENCE IF EXISTS {FEED_SEQUENCE}")
    conn.execute(f"CREATE SEQUENCE {FEED_SEQUENCE} START {int(n) + 1}")


def pieces_sql(source: str) -> str:
    """The month pieces of the ledger rows of ``source`` (a table or a parenthesised query
    with the ledger's columns, aliased ``l``): one row per interval and UTC month it touches.
    Most intervals sit in one month and are kept whole (the first branch); the few that cross
    a month end are cut at each boundary (the second)."""
    return f"""
    SELECT {_cols("l")}, date_trunc('month', l.start_at) AS month_start,
           l.start_at AS piece_start, {_UNTIL} AS piece_end
    FROM {source} l
    WHERE date_diff('month', l.start_at, {_UNTIL}) = 0
    UNION ALL
    SELECT {_cols("l")}, m.month_start,
           greatest(l.start_at, m.month_start) AS piece_start,
           least({_UNTIL}, m.month_start + INTERVAL 1 MONTH) AS piece_end
    FROM {source} l, LATERAL (
        SELECT unnest(generate_series(date_trunc('month', l.start_at),
                                      greatest(l.start_at, {_UNTIL} - INTERVAL 1 MICROSECOND),
                                      INTERVAL 1 MONTH)) AS month_start) m
    WHERE date_diff('month', l.start_at, {_UNTIL}) <> 0"""


def monthly_rows_sql(source: str) -> str:
    """``ledger_monthly`` rows (not yet merged with existing ones) for the rows of
    ``source``."""
    return f"""
SELECT CAST(p.month_start AS DATE) AS month, p."group",
       coalesce(p.group_path, '') AS group_path, coalesce(p.project, '') AS project,
       p."user", coalesce(p.channel, 'api') AS channel, p.policy, p.profile, p.resource,
       p.pool, p.gpu_type, coalesce(pp.effective_from, {NO_PRICE}) AS price_from,
       count(*) AS pieces,
       sum(date_diff('millisecond', p.piece_start, p.piece_end)) AS ms,
       sum(p.gpus * date_diff('millisecond', p.piece_start, p.piece_end)) AS gpu_ms,
       sum(p.time_weight * date_diff('millisecond', p.piece_start, p.piece_end)) AS budget_ms
FROM ({pieces_sql(source)}) p
LEFT JOIN price_periods pp
       ON p.gpu_type = pp.gpu_type
      AND p.piece_start >= pp.effective_from AND p.piece_start < pp.effective_to
GROUP BY ALL"""


MERGE_MONTHLY = """
INSERT INTO ledger_monthly ({rows})
ON CONFLICT DO UPDATE SET pieces = pieces + excluded.pieces, ms = ms + excluded.ms,
    gpu_ms = gpu_ms + excluded.gpu_ms, budget_ms = budget_ms + excluded.budget_ms"""

_DIMS = ", ".join(q(d) for d in DIMENSIONS)


def _levels(alias: str) -> str:
    """The convenience columns of a row with ``group_path``, counted up from its group (a
    team: work is always sent to a team): ``department`` is the group above it and
    ``business_unit`` the group above that, so an estate with or without a company group at
    the top reads the same. NULL where the path is shorter or unknown."""
    return (f"string_split({alias}.group_path, '/')[-3] AS business_unit, "
            f"string_split({alias}.group_path, '/')[-2] AS department")


_MONTHLY_PIECES = f"""
    SELECT month, {_DIMS}, price_from, pieces, ms, gpu_ms, budget_ms FROM ledger_monthly
    UNION ALL
    {monthly_rows_sql("(SELECT * FROM ledger WHERE end_at IS NULL)")}
    UNION ALL
    {monthly_rows_sql("ledger_monthly_pending")}
"""
"""Every month piece as ``ledger_monthly`` rows (``m``): the aggregate of the closed
intervals, the open intervals computed live and the pending closed ones."""

_MONTHLY_SUMS = f"""sum(m.pieces) AS pieces, sum(m.ms) AS ms,
       {_dec(_round_div("CAST(sum(m.ms) AS HUGEINT) * 10", 36), _SUM)} AS hours,
       {_dec(_round_div("CAST(sum(m.gpu_ms) * 1000 AS HUGEINT)", _UNITS_PER_MICRO_HOUR), _SUM)}
           AS gpu_hours,
       {_dec(_round_div("CAST(sum(m.budget_ms) * 1000 AS HUGEINT)", _UNITS_PER_MICRO_HOUR),
             _SUM)}
           AS budget_hours,
       any_value(p.currency) AS currency,
       {_dec(_round_div("sum(CAST(m.gpu_ms * 1000 AS HUGEINT) * CAST(p.per_gpu_hour * 1000000 "
                        "AS HUGEINT))", UNITS_PER_HOUR), _SUM)} AS cost"""
"""The measures of ``m`` rows joined to their price ``p``, each rounded once from the exact
sums."""


VIEWS = {
    # Each price with the time it stops applying: the next price's effective_from for the
    # same GPU type, or the far future.
    "price_periods": f"""
SELECT gpu_type, per_gpu_hour, currency, effective_from,
       coalesce(lead(effective_from) OVER (PARTITION BY gpu_type ORDER BY effective_from),
                {FAR_FUTURE}) AS effective_to
FROM prices""",

    "usage": f"""
SELECT u.*, {_levels("u")},
       {_hours("u.ms")} AS hours,
       {_amount_hours("u.ms", "u.gpus")} AS gpu_hours,
       {_amount_hours("u.ms", "u.time_weight")} AS budget_hours
FROM (SELECT {_cols("l")}, {_UNTIL} AS until_at,
             {_MS.format(a="l.start_at", b=_UNTIL)} AS ms FROM ledger l) u""",

    "usage_priced": f"""
SELECT u.*, p.per_gpu_hour, p.currency, p.effective_from AS price_from,
       {_cost("u.ms", "u.gpus", "p.per_gpu_hour")} AS cost
FROM usage u
ASOF LEFT JOIN prices p ON u.gpu_type = p.gpu_type AND u.start_at >= p.effective_from""",

    # Each piece priced by the price in effect at the piece's start: a hash join on gpu_type
    # and a range test on price_periods, the same answer as an ASOF join and about 7x faster
    # over 10 million rows.
    "usage_by_month": f"""
SELECT p.*, pp.per_gpu_hour, pp.currency, pp.effective_from AS price_from,
       {_cost("p.ms", "p.gpus", "pp.per_gpu_hour")} AS cost
FROM (SELECT q.*, {_levels("q")},
             {_hours("q.ms")} AS hours,
             {_amount_hours("q.ms", "q.gpus")} AS gpu_hours,
             {_amount_hours("q.ms", "q.time_weight")} AS budget_hours
      FROM (SELECT {_cols("l")}, CAST(l.month_start AS DATE) AS month, l.piece_start,
                   l.piece_end, {_MS.format(a="l.piece_start", b="l.piece_end")} AS ms
            FROM ({pieces_sql("ledger")}) l) q) p
LEFT JOIN price_periods pp
       ON p.gpu_type = pp.gpu_type
      AND p.piece_start >= pp.effective_from AND p.piece_start < pp.effective_to""",

    # usage_by_month summed per month and dimension: the closed intervals from ledger_monthly,
    # the open ones computed live (they are few, and the zonemaps find them).
    "usage_monthly": f"""
WITH m AS ({_MONTHLY_PIECES})
SELECT m.month, m."group", nullif(m.group_path, '') AS group_path, {_levels("m")},
       nullif(m.project, '') AS project, m."user", m.channel, m.policy, m.profile,
       m.resource, m.pool, m.gpu_type,
       {_MONTHLY_SUMS}
FROM m
LEFT JOIN prices p ON p.gpu_type = m.gpu_type AND p.effective_from = m.price_from
GROUP BY ALL""",

    # usage_monthly rolled up to every level of the group path: one row per month and group
    # of any level (a business unit, a department, a team), summing its whole subtree as the
    # paths recorded it, exact from the integer milliseconds like usage_monthly. Rows with no
    # recorded path are in no level.
    "usage_by_level": f"""
WITH m AS ({_MONTHLY_PIECES}),
x AS (SELECT m.*, string_split(m.group_path, '/') AS parts FROM m WHERE m.group_path <> ''),
e AS (SELECT x.*, unnest(generate_series(1, len(x.parts))) AS level FROM x)
SELECT e.month, CAST(e.level AS INTEGER) AS level, e.parts[e.level] AS name,
       array_to_string(e.parts[1:e.level], '/') AS path,
       {_MONTHLY_SUMS.replace("m.", "e.")}
FROM e
LEFT JOIN prices p ON p.gpu_type = e.gpu_type AND p.effective_from = e.price_from
GROUP BY ALL""",

    # usage_monthly rolled up by business unit (and department) as _levels names them, exact
    # like usage_by_level.
    "usage_by_business_unit": f"""
WITH m AS ({_MONTHLY_PIECES}),
e AS (SELECT m.*, string_split(m.group_path, '/')[-3] AS business_unit FROM m
      WHERE m.group_path <> '')
SELECT e.month, e.business_unit, {_MONTHLY_SUMS.replace("m.", "e.")}
FROM e
LEFT JOIN prices p ON p.gpu_type = e.gpu_type AND p.effective_from = e.price_from
WHERE e.business_unit IS NOT NULL
GROUP BY ALL""",

    "usage_by_department": f"""
WITH m AS ({_MONTHLY_PIECES}),
e AS (SELECT m.*, string_split(m.group_path, '/')[-3] AS business_unit,
             string_split(m.group_path, '/')[-2] AS department FROM m WHERE m.group_path <> '')
SELECT e.month, e.business_unit, e.department, {_MONTHLY_SUMS.replace("m.", "e.")}
FROM e
LEFT JOIN prices p ON p.gpu_type = e.gpu_type AND p.effective_from = e.price_from
WHERE e.department IS NOT NULL
GROUP BY ALL""",
}


# --- capacity, idle and the CIO's views (kliqued.ledger.capacity) ---------------------------

_SNAPSHOTS = f"""
SELECT effective_from,
       coalesce(lead(effective_from) OVER (ORDER BY effective_from), {FAR_FUTURE}) AS effective_to
FROM (SELECT DISTINCT effective_from FROM capacity)"""
"""Each applied revision's time and the next one's: the estate's history as ranges."""


def _month_split(source: str, start: str, end: str) -> str:
    """The rows of ``source`` (alias ``x``) cut at UTC month starts: ``month_start``,
    ``piece_start``, ``piece_end`` for [``start``, ``end``), empty ranges dropped."""
    return f"""
    SELECT x.*, m.month_start, greatest({start}, m.month_start) AS piece_start,
           least({end}, m.month_start + INTERVAL 1 MONTH) AS piece_end
    FROM {source} x, LATERAL (
        SELECT unnest(generate_series(date_trunc('month', {start}),
                                      greatest({start}, {end} - INTERVAL 1 MICROSECOND),
                                      INTERVAL 1 MONTH)) AS month_start) m
    WHERE {end} > {start}"""


CAPACITY_VIEWS = {
    # each pool's declared capacity with the time range of the revision that declared it
    "capacity_periods": f"""
SELECT c.effective_from, s.effective_to, c.revision, c.pool, c.kind, c.gpu_type, c.gpus
FROM capacity c JOIN ({_SNAPSHOTS}) s ON s.effective_from = c.effective_from""",

    # capacity-hours per month and pool, until now, priced like usage (the price in force at
    # each piece's start)
    "capacity_by_month": f"""
SELECT CAST(p.month_start AS DATE) AS month, p.pool, p.kind, p.gpu_type, p.gpus, p.revision,
       p.piece_start, p.piece_end, p.ms, {_amount_hours("p.ms", "p.gpus")} AS gpu_hours,
       pp.per_gpu_hour, pp.currency, {_cost("p.ms", "p.gpus", "pp.per_gpu_hour")} AS cost
FROM (SELECT q.*, {_MS.format(a="q.piece_start", b="q.piece_end")} AS ms
      FROM ({_month_split("(SELECT *, least(effective_to, " + NOW + ") AS until_at "
                          "FROM capacity_periods)", "x.effective_from", "x.until_at")}) q) p
LEFT JOIN price_periods pp
       ON p.gpu_type = pp.gpu_type
      AND p.piece_start >= pp.effective_from AND p.piece_start < pp.effective_to""",

    # the CIO's use of the estate: per month and pool, capacity, use and idle, hours and cost
    "estate_use": """
WITH c AS (SELECT month, pool, any_value(kind) AS kind, any_value(gpu_type) AS gpu_type,
                  sum(gpu_hours) AS capacity_hours, sum(cost) AS capacity_cost,
                  any_value(currency) AS currency
           FROM capacity_by_month GROUP BY ALL),
u AS (SELECT month, pool, any_value(gpu_type) AS gpu_type, sum(gpu_hours) AS gpu_hours,
             sum(cost) AS cost, any_value(currency) AS currency
      FROM usage_monthly GROUP BY ALL)
SELECT coalesce(c.month, u.month) AS month, coalesce(c.pool, u.pool) AS pool, c.kind,
       coalesce(c.gpu_type, u.gpu_type) AS gpu_type, c.capacity_hours,
       coalesce(u.gpu_hours, 0) AS gpu_hours,
       c.capacity_hours - coalesce(u.gpu_hours, 0) AS idle_hours,
       CAST(round(100 * coalesce(u.gpu_hours, 0) / nullif(c.capacity_hours, 0), 1)
            AS DECIMAL(9,1)) AS used_pct,
       coalesce(c.currency, u.currency) AS currency, c.capacity_cost,
       coalesce(u.cost, 0) AS cost, c.capacity_cost - coalesce(u.cost, 0) AS idle_cost
FROM c FULL OUTER JOIN u ON c.month = u.month AND c.pool = u.pool""",

    # who pays for idle capacity, per month: the reserving groups for the reserved GPUs
    # nobody used, overhead for the rest; reserved idle + used + unreserved idle = capacity
    "idle_cost": """
WITH e AS (SELECT month, any_value(currency) AS currency, sum(capacity_cost) AS capacity_cost,
                  sum(cost) AS used_cost, sum(capacity_hours) AS capacity_hours,
                  sum(gpu_hours) AS used_hours
           FROM estate_use WHERE capacity_hours IS NOT NULL GROUP BY ALL),
r AS (SELECT month, sum(idle_hours) AS reserved_idle_hours, sum(idle_cost) AS reserved_idle_cost,
             sum(lent_hours) AS lent_hours, sum(lent_cost) AS lent_cost
      FROM reserved_idle GROUP BY ALL),
b AS (SELECT month, sum(borrowed_hours) AS borrowed_hours FROM borrowed_usage GROUP BY ALL)
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

    # cloud capacity and spend in use now: per pool, declared capacity, GPUs held, cost/hour
    "in_use_now": f"""
WITH cap AS (SELECT pool, kind, gpu_type, gpus FROM capacity_periods
             WHERE effective_from <= {NOW} AND effective_to > {NOW}),
u AS (SELECT pool, any_value(gpu_type) AS gpu_type, count(*) AS tasks, sum(gpus) AS gpus,
             sum(gpus * per_gpu_hour) AS cost_per_hour, any_value(currency) AS currency
      FROM usage_priced WHERE end_at IS NULL GROUP BY pool)
SELECT coalesce(cap.pool, u.pool) AS pool, cap.kind, coalesce(cap.gpu_type, u.gpu_type)
           AS gpu_type, cap.gpus AS capacity, coalesce(u.gpus, 0) AS gpus_in_use,
       coalesce(u.tasks, 0) AS tasks, coalesce(u.cost_per_hour, 0) AS cost_per_hour,
       -- an idle pool's currency: its GPU type's price in force, else the estate's
       coalesce(u.currency,
                (SELECT p.currency FROM prices p WHERE p.gpu_type = cap.gpu_type
                   AND p.effective_from <= {NOW} ORDER BY p.effective_from DESC LIMIT 1),
                (SELECT min(p.currency) FROM prices p)) AS currency
FROM cap FULL OUTER JOIN u ON cap.pool = u.pool""",
}
VIEWS.update(CAPACITY_VIEWS)


def _columns(conn, table: str) -> list[str] | None:
    """The columns of ``table`` in this database's current schema, or None when it does not
    exist."""
    rows = conn.execute(
        "SELECT column_name FROM duckdb_columns() WHERE table_name = ? "
        "AND database_name = current_database() AND schema_name = current_schema() "
        "ORDER BY column_index", [table]).fetchall()
    return [r[0] for r in rows] or None


_CLOUD_UNTIL = f"greatest(c.start_at, coalesce(c.end_at, {NOW}))"

VIEWS["cloud_node_usage"] = f"""
SELECT n.*, {_hours("n.ms")} AS hours, {_amount_hours("n.ms", "n.gpus")} AS gpu_hours,
       {_dec(_round_div(f"CAST(n.ms AS HUGEINT) * {_micro('n.per_hour')}", 3_600_000))} AS cost
FROM (
    SELECT c.node, c.pool, c.provider, c.instance_type, c.lifecycle, c.gpus, c.per_hour,
           c.currency, c.start_at, c.end_at, c.end_reason, c.revision,
           CAST(m.month_start AS DATE) AS month,
           date_diff('millisecond', greatest(c.start_at, m.month_start),
                     least({_CLOUD_UNTIL}, m.month_start + INTERVAL 1 MONTH)) AS ms
    FROM cloud_nodes c, LATERAL (
        SELECT unnest(generate_series(date_trunc('month', c.start_at),
                                      greatest(c.start_at, {_CLOUD_UNTIL} - INTERVAL 1 MICROSECOND),
                                      INTERVAL 1 MONTH)) AS month_start) m
) n"""
"""One row per cloud node and UTC month it ran in (a running node up to now): its hours,
GPU-hours and cost (hours x ``per_hour``, rounded half up to the millionth)."""

VIEWS["cloud_spend_monthly"] = f"""
SELECT month, pool, lifecycle, instance_type, any_value(currency) AS currency,
       count(*) AS nodes, sum(ms) AS ms, CAST(sum(hours) AS {_SUM}) AS node_hours,
       CAST(sum(gpu_hours) AS {_SUM}) AS gpu_hours, CAST(sum(cost) AS {_SUM}) AS cost
FROM cloud_node_usage
GROUP BY ALL"""
"""Cloud spend per month, pool, lifecycle and instance type."""

from .lending import ORDER as _LENDING_ORDER  # noqa: E402 (it builds on the helpers above)
from .lending import VIEWS as _LENDING_VIEWS  # noqa: E402

VIEWS.update(_LENDING_VIEWS)

from . import lost as _lost  # noqa: E402

VIEWS["lost_work"] = _lost.view_sql(_cost("p.lost_ms", "p.gpus", "pp.per_gpu_hour"),
                                    "CAST(date_trunc('month', p.preempted_at) AS DATE)")
"""Each preemption's lost GPU-hours, priced (kliqued.ledger.lost)."""

VIEW_ORDER = ("price_periods", "usage", "usage_priced", "usage_by_month", "usage_monthly",
              "usage_by_level", "usage_by_business_unit", "usage_by_department",
              "cloud_node_usage", "cloud_spend_monthly", "capacity_periods",
              "capacity_by_month", *_LENDING_ORDER, "estate_use", "idle_cost", "in_use_now",
              "lost_work")
"""The views in an order where each reads only tables and views before it."""


def ensure_schema(conn) -> None:
    """Creates the tables when missing, (re)creates the views and folds pending closed
    intervals into ``ledger_monthly``. Safe to call at every start, inside or outside a
    transaction. A database from before ``ledger_monthly`` gets it built from its closed
    intervals; one from before ``group_path`` gets the column (NULL on its rows until
    :func:`kliqued.ledger.writer.fill_group_paths` runs with the estate) and its
    ``ledger_monthly`` rebuilt with the path as a dimension; one from before ``channel``
    gets it (``api`` on its rows) and ``ledger_monthly`` rebuilt likewise. Turns off DuckDB's
    progress bar on ``conn`` (it would print on stderr)."""
    conn.execute("PRAGMA disable_progress_bar")
    conn.execute(TABLES)
    conn.execute(CLOUD_TABLE)
    conn.execute(CAPACITY_TABLES)
    conn.execute(_lost.DUCK_TABLE)
    conn.execute("ALTER TABLE ledger ADD COLUMN IF NOT EXISTS group_path VARCHAR")
    conn.execute("ALTER TABLE prices ADD COLUMN IF NOT EXISTS list_per_gpu_hour DECIMAL(18,6)")
    conn.execute("ALTER TABLE ledger ADD COLUMN IF NOT EXISTS channel VARCHAR")
    pending = _columns(conn, "ledger_monthly_pending")
    for column in ("group_path", "channel"):
        if pending is not None and column not in pending:
            conn.execute(f"ALTER TABLE ledger_monthly_pending ADD COLUMN {column} VARCHAR")
    monthly = _columns(conn, "ledger_monthly")
    if monthly is not None and not {"group_path", "channel"} <= set(monthly):
        conn.execute("DROP VIEW IF EXISTS usage_monthly")
        conn.execute("DROP TABLE ledger_monthly")  # its key gains a dimension: rebuilt below
        monthly = None
    conn.execute(MONTHLY_TABLE)
    conn.execute(PENDING_TABLE)
    _ensure_feed(conn)
    for name in VIEW_ORDER:
        conn.execute(f"CREATE OR REPLACE VIEW {name} AS {VIEWS[name]}")
    if monthly is None:
        rebuild_monthly(conn)
    else:
        flush_monthly(conn)


_FLUSH = MERGE_MONTHLY.format(rows=monthly_rows_sql("ledger_monthly_pending"))


def flush_monthly(conn) -> int:
    """Folds the pending closed intervals into ``ledger_monthly``; returns how many. Runs in
    the caller's transaction; the writer calls it every ``FLUSH_AT`` closes."""
    n = conn.execute("SELECT count(*) FROM ledger_monthly_pending").fetchone()[0]
    if n:
        conn.execute(_FLUSH)
        conn.execute("DELETE FROM ledger_monthly_pending")
    return int(n)


def rebuild_monthly(conn, gpu_types: list[str] | None = None) -> None:
    """Recomputes ``ledger_monthly`` from the closed intervals of ``ledger``, all of it or
    only some GPU types (after their price periods changed). Runs in the caller's
    transaction."""
    if gpu_types is None:
        conn.execute("DELETE FROM ledger_monthly")
        conn.execute("DELETE FROM ledger_monthly_pending")
        source = "(SELECT * FROM ledger WHERE end_at IS NOT NULL)"
        conn.execute(f"INSERT INTO ledger_monthly {monthly_rows_sql(source)}")
        return
    if not gpu_types:
        return
    types = [list(gpu_types)]
    conn.execute("DELETE FROM ledger_monthly WHERE list_contains(?::VARCHAR[], gpu_type)", types)
    conn.execute("DELETE FROM ledger_monthly_pending "
                 "WHERE list_contains(?::VARCHAR[], gpu_type)", types)
    source = ("(SELECT * FROM ledger WHERE end_at IS NOT NULL "
              "AND list_contains(?::VARCHAR[], gpu_type))")
    conn.execute(f"INSERT INTO ledger_monthly {monthly_rows_sql(source)}", types * 2)
