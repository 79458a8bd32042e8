"""Borrowed and lent GPU-hours, derived exactly from the ledger and the recorded reservations.

The ledger records what each interval held; whether those GPUs were *borrowed* (held beyond
the policy's reservation, engine.md) and whose idle reservation they were *lent* from is a
function of every interval and reservation at each moment, so it is derived here rather than
written at the open (an interval's borrowed part changes when an older one of its policy ends).

The rules, in the order they apply at every moment (docs/ledger.md, "Borrowed GPU-hours"):

1. **Borrowed.** A policy (the group's own, as the ledger records it: organisation.md's
   envelopes are not a level of borrowing, docs/decisions.md) holding more than its
   reservation borrows the excess; the excess sits on its *newest* placements, the ones a
   reclaim takes first (``State.borrowed_by_pool`` counts it the same way). A policy with no
   reservation borrows all it holds.
2. **Lent.** Per GPU type, the GPUs borrowed (``B``) sit first on the reserved GPUs other
   policies leave idle (``I``: reservation less use, priced at the reservation's GPU type):
   ``min(B, I)`` are lent, the rest run on unreserved capacity.
3. **Pro rata.** The lent GPU-milliseconds of a moment are shared among the borrowing
   intervals by their borrowed GPUs and among the lending policies by their idle reserved
   GPUs. Each piece's share is its GPUs times the integral of ``lent / borrowed`` (or
   ``lent / idle``) over the piece, a running sum per GPU type in 10^-12 ms, rounded half up
   once to an integer thousandth of a GPU-millisecond: within half a unit of exact (a unit
   is 2.8e-10 GPU-hours), so borrowers' and lenders' totals agree far below a cent. Each
   piece joins the running sum at its two ends (equality joins: linear in the pieces).

Pieces. A borrowed piece is a stretch of one interval over which its borrowed GPUs stay the
same, within one month, estate snapshot and price period (a *hard* break: a month's start,
a snapshot's bounds or a price change, cuts every piece); a reserved piece is one of its
policy's segments (the times anything of the policy changes). Lent shares are rounded once
per piece, so the pieces are defined by what they hold, not by how they are found:

- **By definition** (the views, finance's SQL): an interval during which its policy is
  above its reservation at some moment (a running count of such segments tells, by two
  equality joins) is expanded over its policy's segments by segment number, its borrowed
  GPUs read in each, and runs of the same value joined back into pieces (islands). The cost
  is those intervals times their policy's concurrency.
- **By a sweep** (:func:`month_pieces`: statements, the CIO's figures, the split FOCUS
  rows): :mod:`kliqued.ledger.sweep` walks each policy's starts and ends in time order,
  keeping where the borrowed part begins, and writes the same pieces in time that grows
  with the intervals alone. The month's intervals and segments are computed once, in
  temporary tables of the query's cursor. tests/ledger/test_lending_sweep.py holds the two
  to the same rows on ledgers made at random.

Only time covered by a recorded estate snapshot (``capacity``) counts: before it the
reservations are unknown, and nothing is said rather than guessed (as for idle cost).

``lending_pieces`` is internal (finance reads ``borrowed_usage`` and ``reserved_idle``):
one row per piece of constant borrowing or lending, within one UTC month, with exact integer
GPU-milliseconds in thousandths (``*_mms``) and the price in force at the piece's start. The
borrower's and the lenders' lent pieces of a moment share one start, so one price: the lent
cost is the same amount on both sides.
"""

from __future__ import annotations

import itertools
import operator
import re
from contextlib import contextmanager
from datetime import date
from typing import Iterator, cast

import duckdb

from . import sweep
from .dialect import (
    DUCKDB,
    SNAPSHOTS,
    SUM_PRECISION,
    UNITS_PER_MICRO_HOUR,
    Dialect,
    dec,
    levels,
    q,
    round_div,
    until,
)

_INTERVAL = ("interval_id", "task", "user", "project", "group", "policy", "pool", "gpu_type")
"""The interval's columns a borrowed piece carries."""

_SCALE = 10**12
"""The lent fraction of a moment, ``lent / borrowed`` (or ``/ idle``), is integrated in
millionths of millionths of a millisecond: a piece's share is exact to far below a unit."""

NO_BOUND = ("TIMESTAMP '-infinity'", "TIMESTAMP 'infinity'")


def _segments_sql(
    lo: str,
    hi: str,
    schema: str,
    made: dict[str, str] | None = None,
    reads: tuple[str, ...] = ("ivr", "seg", "pseg"),
    d: Dialect = DUCKDB,
) -> str:
    """The WITH clauses up to each policy's segments (``seg``, every one, numbered; ``hard``
    when it starts at a month, a snapshot's bound or a price change) and those within a
    recorded snapshot with their reservation (``pseg``, ``hn``: the hard starts so far).
    ``made``: clauses already computed, by name, and the relation that holds their rows
    (:func:`month_pieces` computes ``ivr``, ``seg`` and ``pseg`` once for its queries);
    ``reads``: the clauses the query after the WITH reads (the others are left out)."""
    now, end = d.now, until(d)
    cols = ", ".join("l." + q(c) for c in _INTERVAL)
    clauses = [
        (
            "snap",
            f"""
    SELECT s.effective_from AS eff, greatest(s.effective_from, {lo}) AS from_at,
           least(s.effective_to, {now}, {hi}) AS until_at
    FROM ({SNAPSHOTS}) s
    WHERE s.effective_from < least({now}, {hi}) AND least(s.effective_to, {now}, {hi}) > {lo}""",
        ),
        (
            "iv",
            f"""
    SELECT {cols}, l.group_path, CAST(l.gpus * 1000 AS BIGINT) AS milli, l.start_at,
           greatest(l.start_at, {lo}, (SELECT min(from_at) FROM snap)) AS t0,
           least({end}, {hi}, (SELECT max(until_at) FROM snap)) AS t1
    FROM {schema}ledger l
    WHERE l.start_at < {hi} AND {end} > {lo}""",
        ),
        ("ivr", "SELECT * FROM iv WHERE t1 > t0"),
        ("pol", f"SELECT policy FROM ivr UNION SELECT policy FROM {schema}reservations"),
        (
            "res",
            f"""
    SELECT p.policy, s.from_at, s.until_at,
           CAST(coalesce(r.gpus * 1000, 0) AS BIGINT) AS reserved, r.gpu_type AS res_type,
           r."group" AS res_group, r.group_path AS res_path
    FROM pol p CROSS JOIN snap s
    LEFT JOIN {schema}reservations r ON r.policy = p.policy AND r.effective_from = s.eff
    WHERE s.until_at > s.from_at""",
        ),
        (
            "ev",
            f"""
    SELECT policy, t0 AS t, milli AS d, false AS hard FROM ivr
    UNION ALL SELECT policy, t1, -milli, false FROM ivr
    UNION ALL SELECT policy, from_at, 0, true FROM res
    UNION ALL SELECT policy, until_at, 0, true FROM res
    UNION ALL
    SELECT policy, {d.series(f"date_trunc('month', from_at) + {d.month}", "until_at", d.month)},
           0, true
    FROM res
    UNION ALL
    SELECT r.policy, p.effective_from, 0, true FROM res r
    JOIN (SELECT DISTINCT effective_from FROM prices) p
      ON p.effective_from > r.from_at AND p.effective_from < r.until_at""",
        ),
        (
            "bp",
            "SELECT policy, t, sum(d) AS d, bool_or(hard) AS hard FROM ev " + d.group_by("1, 2"),
        ),
        (
            "seg",
            """
    SELECT policy, t AS seg_start, lead(t) OVER (PARTITION BY policy ORDER BY t) AS seg_end,
           CAST(sum(d) OVER (PARTITION BY policy ORDER BY t) AS BIGINT) AS in_use,
           row_number() OVER (PARTITION BY policy ORDER BY t) AS idx, hard
    FROM bp""",
        ),
        (
            "pseg0",
            f"""
    SELECT s.policy, s.idx, s.seg_start, s.seg_end, s.in_use, r.reserved, r.res_type,
           r.res_group, r.res_path, {d.ms("s.seg_start", "s.seg_end")} AS ms, s.hard
    FROM seg s JOIN res r ON r.policy = s.policy
     AND s.seg_start >= r.from_at AND s.seg_start < r.until_at
    WHERE s.seg_end > s.seg_start""",
        ),
        (
            "pseg",
            """
    SELECT *, sum(CASE WHEN in_use > reserved THEN 1 ELSE 0 END)
                  OVER (PARTITION BY policy ORDER BY idx) AS overs,
              sum(CASE WHEN hard THEN 1 ELSE 0 END) OVER (PARTITION BY policy ORDER BY idx) AS hn
    FROM pseg0""",
        ),
    ]
    made = made or {}
    needed: set[str] = set()
    todo = list(reads)
    while todo:
        name = todo.pop()
        if name not in needed:
            needed.add(name)
            todo += [] if name in made else _READS[name]
    return "\nWITH " + ",\n".join(
        f"{name} AS (SELECT * FROM {made[name]})" if name in made else f"{name} AS ({body})"
        for name, body in clauses
        if name in needed
    )


_READS = {
    "snap": [],
    "iv": ["snap"],
    "ivr": ["iv"],
    "pol": ["ivr"],
    "res": ["pol", "snap"],
    "ev": ["ivr", "res"],
    "bp": ["ev"],
    "seg": ["bp"],
    "pseg0": ["seg", "res"],
    "pseg": ["pseg0"],
}
"""The clauses each of :func:`_segments_sql`'s reads: a clause already made leaves out what
only it needed (each statement's SQL is parsed and planned anew: the less, the sooner)."""


def _derived_bpiece(d: Dialect) -> str:
    """Each interval's borrowed pieces, by definition: expanded over its policy's segments
    while the policy is above its reservation, then joined back into runs of the same
    borrowed GPUs (islands) that no hard break cuts (:mod:`kliqued.ledger.sweep` gets the
    same rows faster)."""
    return f"""
cover AS (
    SELECT i.*, {d.int_range("a.idx", "b.idx")} AS idx
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
bseg AS (SELECT *, CAST(least(milli, cum - reserved) AS BIGINT) AS borrowed FROM bcum
         WHERE cum > reserved),
bisl AS (SELECT *, idx - row_number() OVER (PARTITION BY interval_id, borrowed, hn
                                            ORDER BY idx) AS island FROM bseg),
bpiece AS (
    SELECT {", ".join(q(c) for c in _INTERVAL)}, group_path, borrowed,
           min(seg_start) AS seg_start, max(seg_end) AS seg_end
    FROM bisl GROUP BY {", ".join(q(c) for c in _INTERVAL)}, group_path, borrowed, hn, island)"""


def _floor_scaled(dialect: Dialect, x: str, d: str) -> str:
    """``floor(x * 10^12 / d)`` for non-negative BIGINTs (``x`` a lent amount times
    milliseconds, ``d`` the GPUs it is shared by), exact, in BIGINT divisions: a HUGEINT
    division per row cost more than the rest of the running integrals together. With
    ``x = q1*d + r1``, ``r1*10^6 = q2*d + r2``: ``q1*10^12 + q2*10^6 + r2*10^6 // d``; every
    product stays below ``d * 10^6``. PostgreSQL's ``numeric`` divides exactly at once."""
    if dialect.pg:
        return f"div(CAST({x} AS NUMERIC) * {_SCALE}, {d})"
    r2 = f"(({x}) % ({d}) * 1000000 % ({d}))"
    return (
        f"(CAST(({x}) // ({d}) AS HUGEINT) * {_SCALE} + (({x}) % ({d}) * 1000000 // ({d}))"
        f" * 1000000 + {r2} * 1000000 // ({d}))"
    )


_FINAL = "\nSELECT CAST(date_trunc('month', x.piece_start) AS DATE) AS month, x.*,"
"""The start of the pieces' final SELECT (what precedes it is the WITH clauses)."""


def _gp(d: Dialect) -> str:
    """Per GPU type, at each time anything borrowed or idle changes, the running integrals
    of ``lent / borrowed`` (``pb``) and ``lent / idle`` (``pi``) up to it (``t`` is unique
    per ``k``: the default frame ends at the row itself)."""
    return f"""
    SELECT k, t,
           {d.huge("sum(rb) OVER w - rb")} AS pb,
           {d.huge("sum(ri) OVER w - ri")} AS pi
    FROM grate
    WINDOW w AS (PARTITION BY k ORDER BY t)"""


def _swept_bpiece(relation: str) -> str:
    """The borrowed pieces from ``relation`` (:mod:`kliqued.ledger.sweep`'s rows: ``n``,
    ``first``, ``last``, ``borrowed``), with their intervals' columns (``ivr`` made by
    :func:`month_pieces`, whose ``n`` numbers them)."""
    return f"""
bpiece AS (
    SELECT {", ".join("i." + q(c) for c in _INTERVAL)}, i.group_path, p.borrowed,
           s.seg_start, e.seg_start AS seg_end
    FROM {relation} p JOIN ivr i ON i.n = p.n
    JOIN seg s ON s.policy = i.policy AND s.idx = p."first"
    JOIN seg e ON e.policy = i.policy AND e.idx = p."last")"""


def lending_pieces_sql(
    lo: str = NO_BOUND[0],
    hi: str = NO_BOUND[1],
    schema: str = "",
    borrowed: str | None = None,
    made: dict[str, str] | None = None,
    d: Dialect = DUCKDB,
) -> str:
    """The ``lending_pieces`` rows (below) for the time range [``lo``, ``hi``) (SQL timestamp
    expressions), cut at its ends: at any moment the derivation reads only what was held
    and reserved at that moment, so a month's pieces come out the same from the month's
    intervals alone as from the whole ledger (a statement or export reads only its month's
    intervals; the view, unbounded, reads all of them). ``schema`` (``main.``) names the
    tables that hold group rows past a group admin's scope (:mod:`kliqued.ledger.scope`
    redefines them): lending is derived from every group's rows, then cut. ``borrowed``: a
    relation holding the borrowed pieces :func:`swept` computed for the same range (the
    same rows as the SQL's, in time that grows with the intervals alone); ``made``: as for
    :func:`_segments_sql`; ``d``: the dialect (the sweep and ``made`` are DuckDB's)."""
    bpiece = _derived_bpiece(d) if borrowed is None else _swept_bpiece(borrowed)
    half = _SCALE // 2
    return f"""{_segments_sql(lo, hi, schema, made, d=d)},{bpiece},
ipiece AS (SELECT *, reserved - in_use AS idle FROM pseg
           WHERE reserved > in_use AND res_type IS NOT NULL),
gev AS (
    SELECT gpu_type AS k, seg_start AS t, borrowed AS b, 0 AS i FROM bpiece
    UNION ALL SELECT gpu_type, seg_end, -borrowed, 0 FROM bpiece
    UNION ALL SELECT res_type, seg_start, 0, idle FROM ipiece
    UNION ALL SELECT res_type, seg_end, 0, -idle FROM ipiece),
gbp AS (SELECT k, t, sum(b) AS b, sum(i) AS i FROM gev {d.group_by("1, 2")}),
gseg AS (
    SELECT k, t, lead(t) OVER (PARTITION BY k ORDER BY t) AS t_next,
           {d.huge("sum(b) OVER (PARTITION BY k ORDER BY t)")} AS b_tot,
           {d.huge("sum(i) OVER (PARTITION BY k ORDER BY t)")} AS i_tot
    FROM gbp),
gsegx AS (
    SELECT k, t, CAST(b_tot AS BIGINT) AS b, CAST(i_tot AS BIGINT) AS i,
           CASE WHEN b_tot > 0 AND i_tot > 0 AND t_next > t
                THEN CAST(least(b_tot, i_tot) AS BIGINT) * {d.ms("t", "t_next")}
                ELSE 0 END AS x
    FROM gseg),
grate AS (
    SELECT k, t, CASE WHEN x > 0 THEN {_floor_scaled(d, "x", "b")} ELSE 0 END AS rb,
           CASE WHEN x > 0 THEN {_floor_scaled(d, "x", "i")} ELSE 0 END AS ri
    FROM gsegx),
gp AS ({_gp(d) if "gp" not in (made or {}) else "SELECT * FROM " + (made or {})["gp"]}),
pieces AS (
    SELECT 'borrowed' AS side, {", ".join("b." + q(c) for c in _INTERVAL)}, b.group_path,
           b.seg_start AS piece_start, CAST(0 AS BIGINT) AS reserved,
           {d.huge("b.borrowed")} * {d.ms("b.seg_start", "b.seg_end")} AS borrowed_mms,
           {d.huge("0")} AS idle_mms, {d.huge("0")} AS reserved_mms,
           {d.idiv(f"b.borrowed * (y.pb - x.pb) + {half}", _SCALE)} AS lent_mms
    FROM bpiece b
    JOIN gp x ON x.k = b.gpu_type AND x.t = b.seg_start
    JOIN gp y ON y.k = b.gpu_type AND y.t = b.seg_end
    UNION ALL
    SELECT 'reserved', NULL, NULL, NULL, NULL, p.res_group, p.policy, NULL, p.res_type,
           p.res_path, p.seg_start, p.reserved, 0,
           {d.huge("greatest(p.reserved - p.in_use, 0)")} * p.ms,
           {d.huge("p.reserved")} * p.ms,
           CASE WHEN p.reserved > p.in_use
                THEN {d.idiv(f"(p.reserved - p.in_use) * (y.pi - x.pi) + {half}", _SCALE)}
                ELSE 0 END
    FROM pseg p
    LEFT JOIN gp x ON x.k = p.res_type AND x.t = p.seg_start
    LEFT JOIN gp y ON y.k = p.res_type AND y.t = p.seg_end
    WHERE p.reserved > 0)
{_FINAL}
       pp.per_gpu_hour, pp.currency, pp.effective_from AS price_from
FROM pieces x
LEFT JOIN price_periods pp
       ON x.gpu_type = pp.gpu_type
      AND x.piece_start >= pp.effective_from AND x.piece_start < pp.effective_to"""


def sweep_inputs_sql(
    lo: str, hi: str, schema: str = "", made: dict[str, str] | None = None
) -> tuple[str, str]:
    """The two queries :func:`swept` feeds the sweep: the hard breaks of each policy that is
    ever above its reservation in the range (:class:`kliqued.ledger.sweep.Break`), and those
    policies' intervals with their placement rank and first and past-the-last segment
    (:class:`~kliqued.ledger.sweep.Interval`), both in policy order (``made``: as
    for :func:`_segments_sql`)."""
    head = _segments_sql(lo, hi, schema, made)
    over = "(SELECT DISTINCT policy FROM pseg WHERE in_use > reserved)"
    breaks = f"""{head}
SELECT s.policy, s.idx, p.reserved
FROM seg s LEFT JOIN pseg p ON p.policy = s.policy AND p.idx = s.idx
WHERE s.policy IN {over} AND (s.hard OR p.idx IS NULL)
ORDER BY s.policy, s.idx"""
    intervals = f"""{head}
SELECT i.policy, row_number() OVER (PARTITION BY i.policy ORDER BY i.start_at, i.interval_id),
       i.n, i.milli, a.idx, b.idx
FROM ivr i JOIN seg a ON a.policy = i.policy AND a.seg_start = i.t0
JOIN seg b ON b.policy = i.policy AND b.seg_start = i.t1
WHERE i.policy IN {over}
ORDER BY i.policy"""
    return breaks, intervals


LENDING_PIECES = "lending_pieces"
"""The view of :func:`lending_pieces_sql` unbounded: one row per piece of constant borrowing
(``side = 'borrowed'``: an interval's GPUs above its policy's reservation, ``borrowed_mms``,
and of them the lent ones, ``lent_mms``) or of a reservation (``side = 'reserved'``:
``reserved_mms``, ``idle_mms`` before lending and the ``lent_mms`` other policies borrowed
from it); amounts in thousandths of a GPU-millisecond.
Every piece lies within one UTC month, one estate snapshot and one price period of every GPU
type (their starts are breakpoints), so both sides of a moment's lending have one price."""


def _hours_of(d: Dialect, mms: str) -> str:
    """A sum of thousandths of GPU-milliseconds as GPU-hours, rounded half up once."""
    return dec(d, round_div(d, d.huge(f"sum({mms})"), UNITS_PER_MICRO_HOUR), SUM_PRECISION)


def _cost_of(d: Dialect, mms: str) -> str:
    """A sum of thousandths of GPU-milliseconds times the row's price, rounded half up once
    to the millionth (NULL when unpriced)."""
    return dec(
        d,
        round_div(
            d,
            f"sum({d.huge(mms)} * {d.huge('x.per_gpu_hour * 1000000')})",
            UNITS_PER_MICRO_HOUR * 1_000_000,
        ),
        SUM_PRECISION,
    )


def borrowed_usage_sql(pieces: str = "lending_pieces", d: Dialect = DUCKDB) -> str:
    """``borrowed_usage`` over ``pieces`` (the view, or a bounded :func:`lending_pieces_sql`
    in parentheses)."""
    return f"""
SELECT x.month, x.interval_id, x.task, x."group", x.group_path, {levels(d, "x")}, x.project,
       x."user", x.policy, x.pool, x.gpu_type, x.per_gpu_hour, x.currency, x.price_from,
       {_hours_of(d, "x.borrowed_mms")} AS borrowed_hours,
       {_hours_of(d, "x.lent_mms")} AS lent_hours,
       {_cost_of(d, "x.borrowed_mms")} AS borrowed_cost,
       {_cost_of(d, "x.lent_mms")} AS lent_cost
FROM {pieces} x WHERE x.side = 'borrowed'
{
        d.group_by(
            'x.month, x.interval_id, x.task, x."group", x.group_path, x.project, x."user", '
            "x.policy, x.pool, x.gpu_type, x.per_gpu_hour, x.currency, x.price_from"
        )
    }"""


def reserved_idle_sql(pieces: str = "lending_pieces", d: Dialect = DUCKDB) -> str:
    """``reserved_idle`` over ``pieces``, like :func:`borrowed_usage_sql`."""
    return f"""
SELECT x.month, x.policy, x."group", x.group_path, {levels(d, "x")}, x.gpu_type,
       CAST(max(x.reserved) * 0.001 AS {d.decimal(12, 3)}) AS reserved,
       {_hours_of(d, "x.reserved_mms")} AS reserved_hours,
       {_hours_of(d, "x.idle_mms - x.lent_mms")} AS idle_hours,
       {_hours_of(d, "x.lent_mms")} AS lent_hours,
       {d.any_value("x.currency")} AS currency,
       {_cost_of(d, "x.idle_mms - x.lent_mms")} AS idle_cost,
       {_cost_of(d, "x.lent_mms")} AS lent_cost
FROM {pieces} x WHERE x.side = 'reserved'
{d.group_by('x.month, x.policy, x."group", x.group_path, x.gpu_type')}"""


def swept(
    conn: duckdb.DuckDBPyConnection,
    lo: str,
    hi: str,
    schema: str = "",
    made: dict[str, str] | None = None,
) -> list[sweep.Piece]:
    """The borrowed pieces of [``lo``, ``hi``) by :func:`kliqued.ledger.sweep.borrowed_pieces`
    over each policy that is ever above its reservation there (the others borrow nothing)."""
    breaks_sql, iv_sql = sweep_inputs_sql(lo, hi, schema, made)
    # The rows are plain tuples whose columns are sweep.Break's and sweep.Interval's fields in
    # order (the SELECTs of sweep_inputs_sql); the sweep reads them by position, so they are
    # typed as those records without building one per row (a sweep reads millions).
    breaks = cast(list[sweep.Break], conn.execute(breaks_sql).fetchall())
    ivs = cast(list[sweep.Interval], conn.execute(iv_sql).fetchall())
    intervals: dict[str, list[sweep.Interval]] = {}
    for policy, iv_rows in itertools.groupby(ivs, key=_policy):
        intervals[policy] = list(iv_rows)
    out: list[sweep.Piece] = []
    for policy, rows in itertools.groupby(breaks, key=_policy):
        out += sweep.borrowed_pieces(list(rows), intervals.get(policy, ()))
    return out


_policy = operator.itemgetter(0)
"""A sweep input row's policy (its first column)."""


_TEMP = "_lending_swept_{n}"
"""The temporary tables of one :func:`month_pieces` are named after this (one cursor's,
dropped after use): the swept borrowed pieces, and ``_ivr``, ``_seg``, ``_pseg``, ``_gp``
after it (:func:`_temp_tables`)."""

_temp_names = itertools.count()

_MADE = ("ivr", "seg", "pseg")
"""The clauses :func:`month_pieces` computes once, in this order (each reads the one before)."""


@contextmanager
def month_pieces(conn: duckdb.DuckDBPyConnection, period: date) -> Iterator[str]:
    """The lending pieces of the UTC month starting on the date ``period``, as a
    parenthesised query (:func:`lending_pieces_sql` bounded to the month) to run on ``conn``
    (a cursor of its own) within the ``with`` block. The month's intervals and segments are
    computed once and the borrowed pieces come from the sweep (:func:`swept`), all held in
    temporary tables of the cursor meanwhile: the same rows as the SQL's own derivation
    (tests/ledger/test_lending_sweep.py), in time that grows with the intervals alone."""
    lo = f"TIMESTAMP '{period.isoformat()}'"
    hi = f"({lo} + INTERVAL 1 MONTH)"
    name = _TEMP.format(n=next(_temp_names))
    made: dict[str, str] = {}
    try:
        for clause in _MADE:
            # the intervals get a number of the query's own: the sweep's rows are then
            # integers alone, quicker to hand back than the interval ids
            extra = ", row_number() OVER () AS n" if clause == "ivr" else ""
            # pseg without the running counts only the SQL's own derivation reads
            source = "pseg0" if clause == "pseg" else clause
            conn.execute(
                f"CREATE TEMP TABLE {name}_{clause} AS "
                f"{_segments_sql(lo, hi, 'main.', made, (source,))} "
                f"SELECT *{extra} FROM {source}"
            )
            made[clause] = f"temp.main.{name}_{clause}"
        pieces = swept(conn, lo, hi, "main.", made)
        columns = [list(c) for c in zip(*pieces)] if pieces else [[], [], [], []]
        conn.execute(
            f"CREATE TEMP TABLE {name} AS SELECT unnest($1::BIGINT[]) AS n, "
            f'unnest($2::BIGINT[]) AS "first", unnest($3::BIGINT[]) AS "last", '
            f"unnest($4::BIGINT[]) AS borrowed",
            columns,
        )
        whole = lending_pieces_sql(lo, hi, "main.", f"temp.main.{name}", made)
        # the running integrals once (every query of the block reads them: both sides)
        conn.execute(
            f"CREATE TEMP TABLE {name}_gp AS {whole.partition(_FINAL)[0]} SELECT * FROM gp"
        )
        made["gp"] = f"temp.main.{name}_gp"
        yield f"({lending_pieces_sql(lo, hi, 'main.', f'temp.main.{name}', made)})"
    finally:
        for table in _temp_tables(name):
            conn.execute(f"DROP TABLE IF EXISTS temp.main.{table}")


_TEMP_IN = re.compile(r"\btemp\.main\.(_lending_swept_\d+)\b")


def temp_tables(pieces: str) -> tuple[str, ...]:
    """The temporary tables :func:`month_pieces` made for ``pieces``, if any: the tables
    besides the ledger's that the sandbox lets that query's plan scan (a query of finance's
    can never name them: the parse check allows only the ledger's relations)."""
    found = _TEMP_IN.search(pieces)
    return () if found is None else _temp_tables(found.group(1))


def _temp_tables(name: str) -> tuple[str, ...]:
    return (name, *(f"{name}_{c}" for c in (*_MADE, "gp")))


def views(d: Dialect) -> dict[str, str]:
    """The views of this module in dialect ``d``, by name (:mod:`.views` gathers them)."""
    return {
        "lending_pieces": lending_pieces_sql(d=d),
        # each interval's borrowed GPU-hours per month and price period, and of them the
        # ones lent by other policies' idle reservations (with their cost)
        "borrowed_usage": borrowed_usage_sql(d=d),
        # the reserved GPUs each policy neither used nor lent, per month (the lent ones are
        # paid for by their borrowers: no GPU-hour is counted twice), and what it lent
        "reserved_idle": reserved_idle_sql(d=d),
    }


ORDER: tuple[str, ...] = ("lending_pieces", "borrowed_usage", "reserved_idle")
"""Their creation order (each reads only what comes before it)."""
