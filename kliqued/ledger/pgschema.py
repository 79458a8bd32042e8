"""The ledger's tables and views in PostgreSQL's dialect (``kliqued serve --db
postgresql://...``): the same relations, columns and exact figures as the DuckDB ones of
:mod:`.schema`, whose docstring explains the layout (``ledger``, the monthly aggregate and its
pending rows, the feed, prices, capacity, cloud nodes) and the arithmetic.

Why a module of its own rather than one SQL text for both: the DuckDB views lean on DuckDB
(``GROUP BY ALL``, ``any_value``, negative list indexes, ``ASOF`` joins, ``HUGEINT``, ``//``),
PostgreSQL 15 has none of them, and a translation at run time would hide what runs. Each
view here is written once for PostgreSQL with the same shape: amounts are integer
milliseconds, thousandths and millionths, summed as ``numeric`` (exact, in place of HUGEINT)
and rounded half up to the millionth once; ``tests/daemon/test_pg_ledger.py`` checks every
view against DuckDB's for the same writes.

These are applied as versioned migrations (``kliqued.daemon.storage.pglog.MIGRATIONS``): a changed
view is a new migration that re-creates the views (:func:`view_statements`), never an edit of
a released one.
"""

from __future__ import annotations

from klique_util.units import UNITS_PER_HOUR

from . import lost
from .schema import DIMENSIONS, LEDGER_COLUMNS, q

TABLES = [
    """CREATE TABLE ledger (
        interval_id TEXT PRIMARY KEY, task TEXT NOT NULL, "user" TEXT NOT NULL, project TEXT,
        "group" TEXT NOT NULL, policy TEXT NOT NULL, profile TEXT NOT NULL,
        resource TEXT NOT NULL, pool TEXT NOT NULL, gpu_type TEXT NOT NULL,
        gpus NUMERIC(12,3) NOT NULL, time_weight NUMERIC(12,3) NOT NULL,
        start_at TIMESTAMP NOT NULL, end_at TIMESTAMP, end_reason TEXT, revision TEXT,
        group_path TEXT, channel TEXT)""",
    # the open intervals, found without reading the closed ones (DuckDB's zonemaps do this)
    "CREATE INDEX ledger_open ON ledger (start_at) WHERE end_at IS NULL",
    """CREATE TABLE prices (
        gpu_type TEXT NOT NULL, per_gpu_hour NUMERIC(18,6) NOT NULL, currency TEXT NOT NULL,
        effective_from TIMESTAMP NOT NULL, list_per_gpu_hour NUMERIC(18,6))""",
    """CREATE TABLE cloud_nodes (
        node TEXT PRIMARY KEY, pool TEXT NOT NULL, provider TEXT NOT NULL,
        instance_type TEXT NOT NULL, lifecycle TEXT NOT NULL, gpus INTEGER NOT NULL,
        per_hour NUMERIC(18,6) NOT NULL, currency TEXT NOT NULL, start_at TIMESTAMP NOT NULL,
        end_at TIMESTAMP, end_reason TEXT, revision TEXT)""",
    """CREATE TABLE capacity (
        effective_from TIMESTAMP NOT NULL, revision TEXT NOT NULL, pool TEXT NOT NULL,
        kind TEXT NOT NULL, gpu_type TEXT NOT NULL, gpus NUMERIC(12,3) NOT NULL)""",
    """CREATE TABLE reservations (
        effective_from TIMESTAMP NOT NULL, revision TEXT NOT NULL, policy TEXT NOT NULL,
        "group" TEXT NOT NULL, group_path TEXT NOT NULL, gpus NUMERIC(12,3) NOT NULL,
        gpu_type TEXT)""",
    """CREATE TABLE ledger_monthly (
        month DATE NOT NULL, "group" TEXT NOT NULL, group_path TEXT NOT NULL,
        project TEXT NOT NULL, "user" TEXT NOT NULL, channel TEXT NOT NULL,
        policy TEXT NOT NULL, profile TEXT NOT NULL, resource TEXT NOT NULL, pool TEXT NOT NULL,
        gpu_type TEXT NOT NULL, price_from TIMESTAMP NOT NULL, pieces BIGINT NOT NULL,
        ms BIGINT NOT NULL, gpu_ms NUMERIC(38,3) NOT NULL, budget_ms NUMERIC(38,3) NOT NULL,
        PRIMARY KEY (month, "group", group_path, project, "user", channel, policy, profile,
                     resource, pool, gpu_type, price_from))""",
    "CREATE TABLE ledger_monthly_pending (LIKE ledger)",
    """CREATE TABLE ledger_feed (seq BIGINT PRIMARY KEY, interval_id TEXT NOT NULL)""",
    "CREATE SEQUENCE ledger_feed_seq START 1",
]
"""The ledger's tables: :mod:`.schema`'s, with PostgreSQL's types (TEXT, NUMERIC)."""

MONTHLY_KEY = ('month, "group", group_path, project, "user", channel, policy, profile, '
               'resource, pool, gpu_type, price_from')

NOW = "(transaction_timestamp() AT TIME ZONE 'UTC')"
"""Now as a UTC TIMESTAMP: the start of the transaction, as DuckDB's ``current_timestamp``."""

FAR_FUTURE = "TIMESTAMP '9999-12-31 23:59:59'"
NO_PRICE = "TIMESTAMP '-infinity'"
MONTH = "INTERVAL '1 month'"

_UNTIL = f"greatest(l.start_at, coalesce(l.end_at, {NOW}))"


def _epoch_ms(t: str) -> str:
    return f"floor(extract(epoch FROM {t}) * 1000)::bigint"


def _ms(a: str, b: str) -> str:
    """Whole milliseconds from ``a`` to ``b`` (DuckDB's ``date_diff('millisecond', a, b)``)."""
    return f"({_epoch_ms(b)} - {_epoch_ms(a)})"


def _cols(alias: str) -> str:
    return ", ".join(f"{alias}.{q(n)}" for n, _ in LEDGER_COLUMNS)


def _milli(amount: str) -> str:
    return f"({amount} * 1000)::bigint"


def _micro(amount: str) -> str:
    return f"({amount} * 1000000)::bigint"


def _round_div(numerator: str, denominator: int) -> str:
    """Integer division rounded half up, for a non-negative numerator (``numeric``: exact)."""
    return f"div(({numerator})::numeric + {denominator // 2}, {denominator})"


def _dec(micro: str, typ: str = "NUMERIC(18,6)") -> str:
    return f"(({micro}) / 1000000.0)::{typ}"


def _hours(ms: str) -> str:
    return _dec(_round_div(f"{ms} * 10", 36))


_UNITS_PER_MICRO_HOUR = UNITS_PER_HOUR // 1_000_000


def _amount_micro(ms: str, amount: str) -> str:
    return _round_div(f"{ms}::numeric * {_milli(amount)}", _UNITS_PER_MICRO_HOUR)


def _amount_hours(ms: str, amount: str) -> str:
    return _dec(_amount_micro(ms, amount))


def _cost(ms: str, gpus: str, price: str) -> str:
    return _dec(_round_div(f"({_amount_micro(ms, gpus)}) * {_micro(price)}", 10**6))


_SUM = "NUMERIC(38,6)"


def _part(alias: str, back: int) -> str:
    """The path's part ``back`` from its end (1: the group itself), NULL where shorter."""
    arr = f"string_to_array({alias}.group_path, '/')"
    return f"({arr})[cardinality({arr}) - {back - 1}]"


def _levels(alias: str) -> str:
    return f"{_part(alias, 3)} AS business_unit, {_part(alias, 2)} AS department"


def _month_pieces(source: str) -> str:
    """:func:`.schema.pieces_sql` for PostgreSQL."""
    return f"""
    SELECT {_cols("l")}, date_trunc('month', l.start_at) AS month_start,
           l.start_at AS piece_start, {_UNTIL} AS piece_end
    FROM {source} l
    WHERE date_trunc('month', l.start_at) = date_trunc('month', {_UNTIL})
    UNION ALL
    SELECT {_cols("l")}, m.month_start,
           greatest(l.start_at, m.month_start) AS piece_start,
           least({_UNTIL}, m.month_start + {MONTH}) AS piece_end
    FROM {source} l CROSS JOIN LATERAL generate_series(
        date_trunc('month', l.start_at),
        greatest(l.start_at, {_UNTIL} - INTERVAL '1 microsecond'), {MONTH}) AS m(month_start)
    WHERE date_trunc('month', l.start_at) <> date_trunc('month', {_UNTIL})"""


def monthly_rows_sql(source: str) -> str:
    """:func:`.schema.monthly_rows_sql` for PostgreSQL."""
    ms = _ms("p.piece_start", "p.piece_end")
    return f"""
SELECT p.month_start::date AS month, p."group",
       coalesce(p.group_path, '') AS group_path, coalesce(p.project, '') AS project,
       p."user", coalesce(p.channel, 'api') AS channel, p.policy, p.profile, p.resource,
       p.pool, p.gpu_type, coalesce(pp.effective_from, {NO_PRICE}) AS price_from,
       count(*) AS pieces, sum({ms})::bigint AS ms,
       sum(p.gpus * {ms}) AS gpu_ms, sum(p.time_weight * {ms}) AS budget_ms
FROM ({_month_pieces(source)}) p
LEFT JOIN price_periods pp
       ON p.gpu_type = pp.gpu_type
      AND p.piece_start >= pp.effective_from AND p.piece_start < pp.effective_to
GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12"""


MERGE_MONTHLY = """
INSERT INTO ledger_monthly {rows}
ON CONFLICT ({key}) DO UPDATE SET pieces = ledger_monthly.pieces + excluded.pieces,
    ms = ledger_monthly.ms + excluded.ms, gpu_ms = ledger_monthly.gpu_ms + excluded.gpu_ms,
    budget_ms = ledger_monthly.budget_ms + excluded.budget_ms"""

_DIMS = ", ".join(q(d) for d in DIMENSIONS)

_MONTHLY_PIECES = f"""
    SELECT month, {_DIMS}, price_from, pieces, ms, gpu_ms, budget_ms FROM ledger_monthly
    UNION ALL
    {monthly_rows_sql("(SELECT * FROM ledger WHERE end_at IS NULL)")}
    UNION ALL
    {monthly_rows_sql("ledger_monthly_pending")}
"""


def _monthly_sums(a: str) -> str:
    return f"""sum({a}.pieces) AS pieces, sum({a}.ms) AS ms,
       {_dec(_round_div(f"sum({a}.ms) * 10", 36), _SUM)} AS hours,
       {_dec(_round_div(f"sum({a}.gpu_ms) * 1000", _UNITS_PER_MICRO_HOUR), _SUM)} AS gpu_hours,
       {_dec(_round_div(f"sum({a}.budget_ms) * 1000", _UNITS_PER_MICRO_HOUR), _SUM)}
           AS budget_hours,
       min(p.currency) AS currency,
       {_dec(_round_div(f"sum(({a}.gpu_ms * 1000)::numeric * {_micro('p.per_gpu_hour')})",
                        UNITS_PER_HOUR), _SUM)} AS cost"""


_MONTHLY_GROUP = ('month, "group", group_path, project, "user", channel, policy, profile, '
                  'resource, pool, gpu_type')

VIEWS: dict[str, str] = {
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
             {_ms("l.start_at", _UNTIL)} AS ms FROM ledger l) u""",

    # DuckDB's ASOF join: the price whose period holds the interval's start
    "usage_priced": f"""
SELECT u.*, p.per_gpu_hour, p.currency, p.effective_from AS price_from,
       {_cost("u.ms", "u.gpus", "p.per_gpu_hour")} AS cost
FROM usage u
LEFT JOIN price_periods p ON u.gpu_type = p.gpu_type
      AND u.start_at >= p.effective_from AND u.start_at < p.effective_to""",

    "usage_by_month": f"""
SELECT p.*, pp.per_gpu_hour, pp.currency, pp.effective_from AS price_from,
       {_cost("p.ms", "p.gpus", "pp.per_gpu_hour")} AS cost
FROM (SELECT q.*, {_levels("q")},
             {_hours("q.ms")} AS hours,
             {_amount_hours("q.ms", "q.gpus")} AS gpu_hours,
             {_amount_hours("q.ms", "q.time_weight")} AS budget_hours
      FROM (SELECT {_cols("l")}, l.month_start::date AS month, l.piece_start,
                   l.piece_end, {_ms("l.piece_start", "l.piece_end")} AS ms
            FROM ({_month_pieces("ledger")}) l) q) p
LEFT JOIN price_periods pp
       ON p.gpu_type = pp.gpu_type
      AND p.piece_start >= pp.effective_from AND p.piece_start < pp.effective_to""",

    "usage_monthly": f"""
WITH m AS ({_MONTHLY_PIECES})
SELECT m.month, m."group", nullif(m.group_path, '') AS group_path, {_levels("m")},
       nullif(m.project, '') AS project, m."user", m.channel, m.policy, m.profile,
       m.resource, m.pool, m.gpu_type,
       {_monthly_sums("m")}
FROM m
LEFT JOIN prices p ON p.gpu_type = m.gpu_type AND p.effective_from = m.price_from
GROUP BY {", ".join("m." + c.strip() for c in _MONTHLY_GROUP.split(","))}""",

    "usage_by_level": f"""
WITH m AS ({_MONTHLY_PIECES}),
x AS (SELECT m.*, string_to_array(m.group_path, '/') AS parts FROM m WHERE m.group_path <> ''),
e AS (SELECT x.*, lv.level FROM x CROSS JOIN LATERAL
      generate_series(1, cardinality(x.parts)) AS lv(level))
SELECT e.month, e.level::integer AS level, e.parts[e.level] AS name,
       array_to_string(e.parts[1:e.level], '/') AS path,
       {_monthly_sums("e")}
FROM e
LEFT JOIN prices p ON p.gpu_type = e.gpu_type AND p.effective_from = e.price_from
GROUP BY 1, 2, 3, 4""",

    "usage_by_business_unit": f"""
WITH m AS ({_MONTHLY_PIECES}),
e AS (SELECT m.*, {_part("m", 3)} AS business_unit FROM m WHERE m.group_path <> '')
SELECT e.month, e.business_unit, {_monthly_sums("e")}
FROM e
LEFT JOIN prices p ON p.gpu_type = e.gpu_type AND p.effective_from = e.price_from
WHERE e.business_unit IS NOT NULL
GROUP BY 1, 2""",

    "usage_by_department": f"""
WITH m AS ({_MONTHLY_PIECES}),
e AS (SELECT m.*, {_part("m", 3)} AS business_unit, {_part("m", 2)} AS department
      FROM m WHERE m.group_path <> '')
SELECT e.month, e.business_unit, e.department, {_monthly_sums("e")}
FROM e
LEFT JOIN prices p ON p.gpu_type = e.gpu_type AND p.effective_from = e.price_from
WHERE e.department IS NOT NULL
GROUP BY 1, 2, 3""",
}

_CLOUD_UNTIL = f"greatest(c.start_at, coalesce(c.end_at, {NOW}))"

VIEWS["cloud_node_usage"] = f"""
SELECT n.*, {_hours("n.ms")} AS hours, {_amount_hours("n.ms", "n.gpus")} AS gpu_hours,
       {_dec(_round_div(f"n.ms::numeric * {_micro('n.per_hour')}", 3_600_000))} AS cost
FROM (
    SELECT c.node, c.pool, c.provider, c.instance_type, c.lifecycle, c.gpus, c.per_hour,
           c.currency, c.start_at, c.end_at, c.end_reason, c.revision,
           m.month_start::date AS month,
           {_ms("greatest(c.start_at, m.month_start)",
                f"least({_CLOUD_UNTIL}, m.month_start + {MONTH})")} AS ms
    FROM cloud_nodes c CROSS JOIN LATERAL generate_series(
        date_trunc('month', c.start_at),
        greatest(c.start_at, {_CLOUD_UNTIL} - INTERVAL '1 microsecond'), {MONTH})
        AS m(month_start)
) n"""

VIEWS["cloud_spend_monthly"] = f"""
SELECT month, pool, lifecycle, instance_type, min(currency) AS currency,
       count(*) AS nodes, sum(ms) AS ms, sum(hours)::{_SUM} AS node_hours,
       sum(gpu_hours)::{_SUM} AS gpu_hours, sum(cost)::{_SUM} AS cost
FROM cloud_node_usage
GROUP BY 1, 2, 3, 4"""

_SNAPSHOTS = f"""
SELECT effective_from,
       coalesce(lead(effective_from) OVER (ORDER BY effective_from), {FAR_FUTURE}) AS effective_to
FROM (SELECT DISTINCT effective_from FROM capacity) d"""


def _month_split(source: str, start: str, end: str) -> str:
    return f"""
    SELECT x.*, m.month_start, greatest({start}, m.month_start) AS piece_start,
           least({end}, m.month_start + {MONTH}) AS piece_end
    FROM {source} x CROSS JOIN LATERAL generate_series(
        date_trunc('month', {start}), greatest({start}, {end} - INTERVAL '1 microsecond'),
        {MONTH}) AS m(month_start)
    WHERE {end} > {start}"""


VIEWS["capacity_periods"] = f"""
SELECT c.effective_from, s.effective_to, c.revision, c.pool, c.kind, c.gpu_type, c.gpus
FROM capacity c JOIN ({_SNAPSHOTS}) s ON s.effective_from = c.effective_from"""

VIEWS["capacity_by_month"] = f"""
SELECT p.month_start::date AS month, p.pool, p.kind, p.gpu_type, p.gpus, p.revision,
       p.piece_start, p.piece_end, p.ms, {_amount_hours("p.ms", "p.gpus")} AS gpu_hours,
       pp.per_gpu_hour, pp.currency, {_cost("p.ms", "p.gpus", "pp.per_gpu_hour")} AS cost
FROM (SELECT q.*, {_ms("q.piece_start", "q.piece_end")} AS ms
      FROM ({_month_split("(SELECT *, least(effective_to, " + NOW + ") AS until_at "
                          "FROM capacity_periods)", "x.effective_from", "x.until_at")}) q) p
LEFT JOIN price_periods pp
       ON p.gpu_type = pp.gpu_type
      AND p.piece_start >= pp.effective_from AND p.piece_start < pp.effective_to"""

VIEWS["estate_use"] = """
WITH c AS (SELECT month, pool, min(kind) AS kind, min(gpu_type) AS gpu_type,
                  sum(gpu_hours) AS capacity_hours, sum(cost) AS capacity_cost,
                  min(currency) AS currency
           FROM capacity_by_month GROUP BY 1, 2),
u AS (SELECT month, pool, min(gpu_type) AS gpu_type, sum(gpu_hours) AS gpu_hours,
             sum(cost) AS cost, min(currency) AS currency
      FROM usage_monthly GROUP BY 1, 2)
SELECT coalesce(c.month, u.month) AS month, coalesce(c.pool, u.pool) AS pool, c.kind,
       coalesce(c.gpu_type, u.gpu_type) AS gpu_type, c.capacity_hours,
       coalesce(u.gpu_hours, 0) AS gpu_hours,
       c.capacity_hours - coalesce(u.gpu_hours, 0) AS idle_hours,
       round(100 * coalesce(u.gpu_hours, 0) / nullif(c.capacity_hours, 0), 1)::NUMERIC(9,1)
           AS used_pct,
       coalesce(c.currency, u.currency) AS currency, c.capacity_cost,
       coalesce(u.cost, 0) AS cost, c.capacity_cost - coalesce(u.cost, 0) AS idle_cost
FROM c FULL OUTER JOIN u ON c.month = u.month AND c.pool = u.pool"""

VIEWS["idle_cost"] = """
WITH e AS (SELECT month, min(currency) AS currency, sum(capacity_cost) AS capacity_cost,
                  sum(cost) AS used_cost, sum(capacity_hours) AS capacity_hours,
                  sum(gpu_hours) AS used_hours
           FROM estate_use WHERE capacity_hours IS NOT NULL GROUP BY 1),
r AS (SELECT month, sum(idle_hours) AS reserved_idle_hours, sum(idle_cost) AS reserved_idle_cost,
             sum(lent_hours) AS lent_hours, sum(lent_cost) AS lent_cost
      FROM reserved_idle GROUP BY 1),
b AS (SELECT month, sum(borrowed_hours) AS borrowed_hours FROM borrowed_usage GROUP BY 1)
SELECT e.month, e.currency, e.capacity_hours, e.used_hours,
       coalesce(r.reserved_idle_hours, 0) AS reserved_idle_hours,
       e.capacity_hours - e.used_hours - coalesce(r.reserved_idle_hours, 0)
           AS unreserved_idle_hours,
       e.capacity_cost, e.used_cost, coalesce(r.reserved_idle_cost, 0) AS reserved_idle_cost,
       e.capacity_cost - e.used_cost - coalesce(r.reserved_idle_cost, 0)
           AS unreserved_idle_cost,
       coalesce(b.borrowed_hours, 0) AS borrowed_hours, coalesce(r.lent_hours, 0) AS lent_hours,
       coalesce(r.lent_cost, 0) AS lent_cost
FROM e LEFT JOIN r ON r.month = e.month LEFT JOIN b ON b.month = e.month"""

VIEWS["in_use_now"] = f"""
WITH cap AS (SELECT pool, kind, gpu_type, gpus FROM capacity_periods
             WHERE effective_from <= {NOW} AND effective_to > {NOW}),
u AS (SELECT pool, min(gpu_type) AS gpu_type, count(*) AS tasks, sum(gpus) AS gpus,
             sum(gpus * per_gpu_hour) AS cost_per_hour, min(currency) AS currency
      FROM usage_priced WHERE end_at IS NULL GROUP BY pool)
SELECT coalesce(cap.pool, u.pool) AS pool, cap.kind, coalesce(cap.gpu_type, u.gpu_type)
           AS gpu_type, cap.gpus AS capacity, coalesce(u.gpus, 0) AS gpus_in_use,
       coalesce(u.tasks, 0) AS tasks, coalesce(u.cost_per_hour, 0) AS cost_per_hour,
       -- an idle pool's currency: its GPU type's price in force, else the estate's
       coalesce(u.currency,
                (SELECT p.currency FROM prices p WHERE p.gpu_type = cap.gpu_type
                   AND p.effective_from <= {NOW} ORDER BY p.effective_from DESC LIMIT 1),
                (SELECT min(p.currency) FROM prices p)) AS currency
FROM cap FULL OUTER JOIN u ON cap.pool = u.pool"""


# --- borrowed and lent GPU-hours (kliqued.ledger.lending's views, whose docstring says the
# rules and the method: segments per policy, a running integral per GPU type) -------------

_INTERVAL = ("interval_id", "task", "user", "project", "group", "policy", "pool", "gpu_type")
_SCALE = 10**12


def lending_pieces_sql(lo: str = "TIMESTAMP '-infinity'", hi: str = "TIMESTAMP 'infinity'"
                       ) -> str:
    """:func:`.lending.lending_pieces_sql` in PostgreSQL (the whole ledger)."""
    cols = ", ".join("l." + q(c) for c in _INTERVAL)
    return f"""
WITH snap AS (
    SELECT s.effective_from AS eff, greatest(s.effective_from, {lo}) AS from_at,
           least(s.effective_to, {NOW}, {hi}) AS until_at
    FROM ({_SNAPSHOTS}) s
    WHERE s.effective_from < least({NOW}, {hi}) AND least(s.effective_to, {NOW}, {hi}) > {lo}),
iv AS (
    SELECT {cols}, l.group_path, (l.gpus * 1000)::bigint AS milli, l.start_at,
           greatest(l.start_at, {lo}, (SELECT min(from_at) FROM snap)) AS t0,
           least({_UNTIL}, {hi}, (SELECT max(until_at) FROM snap)) AS t1
    FROM ledger l
    WHERE l.start_at < {hi} AND {_UNTIL} > {lo}),
ivr AS (SELECT * FROM iv WHERE t1 > t0),
pol AS (SELECT policy FROM ivr UNION SELECT policy FROM reservations),
res AS (
    SELECT p.policy, s.from_at, s.until_at,
           coalesce(r.gpus * 1000, 0)::bigint AS reserved, r.gpu_type AS res_type,
           r."group" AS res_group, r.group_path AS res_path
    FROM pol p CROSS JOIN snap s
    LEFT JOIN reservations r ON r.policy = p.policy AND r.effective_from = s.eff
    WHERE s.until_at > s.from_at),
ev AS (
    SELECT policy, t0 AS t, milli AS d, false AS hard FROM ivr
    UNION ALL SELECT policy, t1, -milli, false FROM ivr
    UNION ALL SELECT policy, from_at, 0, true FROM res
    UNION ALL SELECT policy, until_at, 0, true FROM res
    UNION ALL
    SELECT policy, generate_series(date_trunc('month', from_at) + {MONTH}, until_at, {MONTH}), 0,
           true
    FROM res
    UNION ALL
    SELECT r.policy, p.effective_from, 0, true FROM res r
    JOIN (SELECT DISTINCT effective_from FROM prices) p
      ON p.effective_from > r.from_at AND p.effective_from < r.until_at),
bp AS (SELECT policy, t, sum(d) AS d, bool_or(hard) AS hard FROM ev GROUP BY 1, 2),
seg AS (
    SELECT policy, t AS seg_start, lead(t) OVER (PARTITION BY policy ORDER BY t) AS seg_end,
           (sum(d) OVER (PARTITION BY policy ORDER BY t))::bigint AS in_use,
           row_number() OVER (PARTITION BY policy ORDER BY t) AS idx, hard
    FROM bp),
pseg0 AS (
    SELECT s.policy, s.idx, s.seg_start, s.seg_end, s.in_use, r.reserved, r.res_type,
           r.res_group, r.res_path, {_ms("s.seg_start", "s.seg_end")} AS ms, s.hard
    FROM seg s JOIN res r ON r.policy = s.policy
     AND s.seg_start >= r.from_at AND s.seg_start < r.until_at
    WHERE s.seg_end > s.seg_start),
pseg AS (
    SELECT *, sum(CASE WHEN in_use > reserved THEN 1 ELSE 0 END)
                  OVER (PARTITION BY policy ORDER BY idx) AS overs,
              sum(CASE WHEN hard THEN 1 ELSE 0 END) OVER (PARTITION BY policy ORDER BY idx) AS hn
    FROM pseg0),
cover AS (
    SELECT i.*, generate_series(a.idx, b.idx - 1) AS idx
    FROM ivr i JOIN seg a ON a.policy = i.policy AND a.seg_start = i.t0
    JOIN seg b ON b.policy = i.policy AND b.seg_start = i.t1
    JOIN pseg x ON x.policy = i.policy AND x.idx = a.idx
    JOIN pseg y ON y.policy = i.policy AND y.idx = b.idx - 1
    WHERE y.overs - x.overs + CASE WHEN x.in_use > x.reserved THEN 1 ELSE 0 END > 0),
bcum AS (
    SELECT c.*, p.seg_start, p.seg_end, p.reserved, p.hn,
           sum(c.milli) OVER (PARTITION BY p.policy, p.idx
                              ORDER BY c.start_at, c.interval_id) AS cum
    FROM cover c JOIN pseg p ON p.policy = c.policy AND p.idx = c.idx
    WHERE p.in_use > p.reserved),
bseg AS (SELECT *, least(milli, cum - reserved)::bigint AS borrowed FROM bcum
         WHERE cum > reserved),
bisl AS (SELECT *, idx - row_number() OVER (PARTITION BY interval_id, borrowed, hn
                                            ORDER BY idx) AS island FROM bseg),
bpiece AS (
    SELECT {", ".join(q(c) for c in _INTERVAL)}, group_path, borrowed,
           min(seg_start) AS seg_start, max(seg_end) AS seg_end,
           {_ms("min(seg_start)", "max(seg_end)")} AS ms
    FROM bisl GROUP BY {", ".join(q(c) for c in _INTERVAL)}, group_path, borrowed, hn, island),
ipiece AS (SELECT *, reserved - in_use AS idle FROM pseg
           WHERE reserved > in_use AND res_type IS NOT NULL),
gev AS (
    SELECT gpu_type AS k, seg_start AS t, borrowed AS b, 0 AS i FROM bpiece
    UNION ALL SELECT gpu_type, seg_end, -borrowed, 0 FROM bpiece
    UNION ALL SELECT res_type, seg_start, 0, idle FROM ipiece
    UNION ALL SELECT res_type, seg_end, 0, -idle FROM ipiece),
gbp AS (SELECT k, t, sum(b) AS b, sum(i) AS i FROM gev GROUP BY 1, 2),
gseg AS (
    SELECT k, t, lead(t) OVER (PARTITION BY k ORDER BY t) AS t_next,
           (sum(b) OVER (PARTITION BY k ORDER BY t))::numeric AS b_tot,
           (sum(i) OVER (PARTITION BY k ORDER BY t))::numeric AS i_tot
    FROM gbp),
grate AS (
    SELECT k, t,
           CASE WHEN b_tot > 0 AND i_tot > 0 AND t_next > t
                THEN div(least(b_tot, i_tot) * {_ms("t", "t_next")} * {_SCALE}, b_tot)
                ELSE 0 END AS rb,
           CASE WHEN b_tot > 0 AND i_tot > 0 AND t_next > t
                THEN div(least(b_tot, i_tot) * {_ms("t", "t_next")} * {_SCALE}, i_tot)
                ELSE 0 END AS ri
    FROM gseg),
gp AS (
    SELECT k, t, coalesce(sum(rb) OVER w, 0) AS pb, coalesce(sum(ri) OVER w, 0) AS pi
    FROM grate
    WINDOW w AS (PARTITION BY k ORDER BY t ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)),
pieces AS (
    SELECT 'borrowed' AS side, {", ".join("b." + q(c) for c in _INTERVAL)}, b.group_path,
           b.seg_start AS piece_start, 0::bigint AS reserved,
           b.borrowed::numeric * b.ms AS borrowed_mms, 0::numeric AS idle_mms,
           0::numeric AS reserved_mms,
           div(b.borrowed * (y.pb - x.pb) + {_SCALE // 2}, {_SCALE}) AS lent_mms
    FROM bpiece b
    JOIN gp x ON x.k = b.gpu_type AND x.t = b.seg_start
    JOIN gp y ON y.k = b.gpu_type AND y.t = b.seg_end
    UNION ALL
    SELECT 'reserved', NULL, NULL, NULL, NULL, p.res_group, p.policy, NULL, p.res_type,
           p.res_path, p.seg_start, p.reserved, 0,
           greatest(p.reserved - p.in_use, 0)::numeric * p.ms,
           p.reserved::numeric * p.ms,
           CASE WHEN p.reserved > p.in_use
                THEN div((p.reserved - p.in_use) * (y.pi - x.pi) + {_SCALE // 2}, {_SCALE})
                ELSE 0 END
    FROM pseg p
    LEFT JOIN gp x ON x.k = p.res_type AND x.t = p.seg_start
    LEFT JOIN gp y ON y.k = p.res_type AND y.t = p.seg_end
    WHERE p.reserved > 0)
SELECT date_trunc('month', x.piece_start)::date AS month, x.*,
       pp.per_gpu_hour, pp.currency, pp.effective_from AS price_from
FROM pieces x
LEFT JOIN price_periods pp
       ON x.gpu_type = pp.gpu_type
      AND x.piece_start >= pp.effective_from AND x.piece_start < pp.effective_to"""


def _hours_of(mms: str) -> str:
    return _dec(_round_div(f"sum({mms})", _UNITS_PER_MICRO_HOUR), _SUM)


def _cost_of(mms: str) -> str:
    return _dec(_round_div(f"sum(({mms})::numeric * {_micro('x.per_gpu_hour')})",
                           _UNITS_PER_MICRO_HOUR * 1_000_000), _SUM)


VIEWS["lending_pieces"] = lending_pieces_sql()

VIEWS["borrowed_usage"] = f"""
SELECT x.month, x.interval_id, x.task, x."group", x.group_path, {_levels("x")}, x.project,
       x."user", x.policy, x.pool, x.gpu_type, x.per_gpu_hour, x.currency, x.price_from,
       {_hours_of("x.borrowed_mms")} AS borrowed_hours, {_hours_of("x.lent_mms")} AS lent_hours,
       {_cost_of("x.borrowed_mms")} AS borrowed_cost, {_cost_of("x.lent_mms")} AS lent_cost
FROM lending_pieces x WHERE x.side = 'borrowed'
GROUP BY x.month, x.interval_id, x.task, x."group", x.group_path, x.project, x."user",
         x.policy, x.pool, x.gpu_type, x.per_gpu_hour, x.currency, x.price_from"""

VIEWS["reserved_idle"] = f"""
SELECT x.month, x.policy, x."group", x.group_path, {_levels("x")}, x.gpu_type,
       (max(x.reserved) * 0.001)::numeric(12,3) AS reserved,
       {_hours_of("x.reserved_mms")} AS reserved_hours,
       {_hours_of("x.idle_mms - x.lent_mms")} AS idle_hours,
       {_hours_of("x.lent_mms")} AS lent_hours,
       min(x.currency) AS currency,
       {_cost_of("x.idle_mms - x.lent_mms")} AS idle_cost,
       {_cost_of("x.lent_mms")} AS lent_cost
FROM lending_pieces x WHERE x.side = 'reserved'
GROUP BY x.month, x.policy, x."group", x.group_path, x.gpu_type"""


LOST_WORK_VIEW = "lost_work"
"""The view migration 5 adds with its table (``preemptions``)."""

VIEWS[LOST_WORK_VIEW] = lost.view_sql(_cost("p.lost_ms", "p.gpus", "pp.per_gpu_hour"),
                                      "date_trunc('month', p.preempted_at)::date")


def view_create(name: str) -> str:
    return f"CREATE VIEW {name} AS {VIEWS[name]}"


def view_statements(until: str | None = None) -> list[str]:
    """Every view dropped and created again, each after those it reads (the order of
    :data:`.schema.VIEW_ORDER`): the statements of a migration that changes views.
    ``until``: only the views before that one (a released migration's, which ran before
    the tables of later views existed)."""
    from .schema import VIEW_ORDER
    names = VIEW_ORDER if until is None else VIEW_ORDER[:VIEW_ORDER.index(until)]
    drops = [f"DROP VIEW IF EXISTS {name} CASCADE" for name in reversed(names)]
    return drops + [view_create(name) for name in names]
