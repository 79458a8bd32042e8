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
   GPUs, in integer thousandths of a GPU-millisecond, each share rounded so that the shares
   add up exactly to the whole (cumulative rounding: a share is never a unit from exact).

Only time covered by a recorded estate snapshot (``capacity``) counts: before it the
reservations are unknown, and nothing is said rather than guessed (as for idle cost).

``lending_pieces`` is internal (finance reads ``borrowed_usage`` and ``reserved_idle``):
one row per piece of constant borrowing or lending, within one UTC month, with exact integer
GPU-milliseconds in thousandths (``*_mms``) and the price in force at the piece's start. The
borrower's and the lenders' lent pieces of a moment share one start, so one price: the lent
cost is the same amount on both sides.
"""

from __future__ import annotations

from .schema import (_SUM, _UNITS_PER_MICRO_HOUR, _UNTIL, NOW, _SNAPSHOTS, _dec, _levels,
                     _round_div, q)

_INTERVAL = ("interval_id", "task", "user", "project", "group", "policy", "pool", "gpu_type")
"""The interval's columns a borrowed piece carries."""

_MS = "date_diff('millisecond', {a}, {b})"

LENDING_PIECES = f"""
WITH snap AS (
    SELECT effective_from, least(effective_to, {NOW}) AS until_at FROM ({_SNAPSHOTS})
    WHERE effective_from < {NOW}),
iv AS (
    SELECT {", ".join("l." + q(c) for c in _INTERVAL)}, l.group_path,
           CAST(l.gpus * 1000 AS BIGINT) AS milli, l.start_at, {_UNTIL} AS until_at
    FROM ledger l
    WHERE {_UNTIL} > l.start_at AND {_UNTIL} > (SELECT min(effective_from) FROM snap)),
pol AS (SELECT policy FROM iv UNION SELECT policy FROM reservations),
res AS (
    SELECT p.policy, s.effective_from, s.until_at,
           CAST(coalesce(r.gpus * 1000, 0) AS BIGINT) AS reserved, r.gpu_type AS res_type,
           r."group" AS res_group, r.group_path AS res_path
    FROM pol p CROSS JOIN snap s
    LEFT JOIN reservations r ON r.policy = p.policy AND r.effective_from = s.effective_from
    WHERE s.until_at > s.effective_from),
ev AS (
    SELECT policy, start_at AS t, milli AS d FROM iv
    UNION ALL SELECT policy, until_at, -milli FROM iv
    UNION ALL SELECT policy, effective_from, 0 FROM res
    UNION ALL SELECT policy, until_at, 0 FROM res
    UNION ALL
    SELECT policy, unnest(generate_series(date_trunc('month', effective_from)
                                          + INTERVAL 1 MONTH, until_at, INTERVAL 1 MONTH)), 0
    FROM res),
bp AS (SELECT policy, t, sum(d) AS d FROM ev GROUP BY ALL),
seg AS (
    SELECT policy, t AS seg_start, lead(t) OVER (PARTITION BY policy ORDER BY t) AS seg_end,
           CAST(sum(d) OVER (PARTITION BY policy ORDER BY t) AS BIGINT) AS in_use
    FROM bp),
pseg AS (
    SELECT s.policy, s.seg_start, s.seg_end, s.in_use, r.reserved, r.res_type, r.res_group,
           r.res_path, {_MS.format(a="s.seg_start", b="s.seg_end")} AS ms
    FROM seg s JOIN res r ON r.policy = s.policy
     AND s.seg_start >= r.effective_from AND s.seg_start < r.until_at
    WHERE s.seg_end > s.seg_start),
bcum AS (
    SELECT i.*, p.seg_start, p.seg_end, p.ms, p.reserved,
           sum(i.milli) OVER (PARTITION BY p.policy, p.seg_start
                              ORDER BY i.start_at, i.interval_id) AS cum
    FROM pseg p JOIN iv i ON i.policy = p.policy
     AND i.start_at <= p.seg_start AND i.until_at >= p.seg_end
    WHERE p.in_use > p.reserved),
bpiece AS (SELECT *, CAST(least(milli, cum - reserved) AS BIGINT) AS borrowed FROM bcum
           WHERE cum > reserved),
ipiece AS (SELECT *, reserved - in_use AS idle FROM pseg
           WHERE reserved > in_use AND res_type IS NOT NULL),
gev AS (
    SELECT gpu_type AS k, seg_start AS t, borrowed AS b, 0 AS i FROM bpiece
    UNION ALL SELECT gpu_type, seg_end, -borrowed, 0 FROM bpiece
    UNION ALL SELECT res_type, seg_start, 0, idle FROM ipiece
    UNION ALL SELECT res_type, seg_end, 0, -idle FROM ipiece),
gbp AS (SELECT k, t, sum(b) AS b, sum(i) AS i FROM gev GROUP BY ALL),
gseg AS (
    SELECT k, t AS g_start, lead(t) OVER (PARTITION BY k ORDER BY t) AS g_end,
           sum(b) OVER (PARTITION BY k ORDER BY t) AS b_tot,
           sum(i) OVER (PARTITION BY k ORDER BY t) AS i_tot
    FROM gbp),
lseg AS (
    SELECT k, g_start, g_end, b_tot, i_tot,
           CAST(least(b_tot, i_tot) AS HUGEINT) * {_MS.format(a="g_start", b="g_end")} AS lent
    FROM gseg WHERE g_end > g_start AND b_tot > 0 AND i_tot > 0),
bshare AS (
    SELECT b.*, l.g_start, l.lent, l.b_tot,
           sum(b.borrowed) OVER (PARTITION BY l.k, l.g_start ORDER BY b.interval_id) AS c
    FROM lseg l JOIN bpiece b ON b.gpu_type = l.k
     AND b.seg_start <= l.g_start AND b.seg_end >= l.g_end),
ishare AS (
    SELECT p.*, l.g_start, l.lent, l.i_tot,
           sum(p.idle) OVER (PARTITION BY l.k, l.g_start ORDER BY p.policy) AS c
    FROM lseg l JOIN ipiece p ON p.res_type = l.k
     AND p.seg_start <= l.g_start AND p.seg_end >= l.g_end),
pieces AS (
    SELECT 'borrowed' AS side, {", ".join(q(c) for c in _INTERVAL)}, group_path,
           seg_start AS piece_start, CAST(0 AS BIGINT) AS reserved,
           CAST(borrowed AS HUGEINT) * ms AS borrowed_mms, CAST(0 AS HUGEINT) AS idle_mms,
           CAST(0 AS HUGEINT) AS reserved_mms, CAST(0 AS HUGEINT) AS lent_mms
    FROM bpiece
    UNION ALL
    SELECT 'borrowed', {", ".join(q(c) for c in _INTERVAL)}, group_path, g_start, 0, 0, 0, 0,
           lent * c // b_tot - lent * (c - borrowed) // b_tot
    FROM bshare
    UNION ALL
    SELECT 'reserved', NULL, NULL, NULL, NULL, res_group, policy, NULL, res_type, res_path,
           seg_start, reserved, 0, CAST(greatest(reserved - in_use, 0) AS HUGEINT) * ms,
           CAST(reserved AS HUGEINT) * ms, 0
    FROM pseg WHERE reserved > 0
    UNION ALL
    SELECT 'reserved', NULL, NULL, NULL, NULL, res_group, policy, NULL, res_type, res_path,
           g_start, reserved, 0, 0, 0, lent * c // i_tot - lent * (c - idle) // i_tot
    FROM ishare)
SELECT CAST(date_trunc('month', x.piece_start) AS DATE) AS month, x.*,
       pp.per_gpu_hour, pp.currency, pp.effective_from AS price_from
FROM pieces x
LEFT JOIN price_periods pp
       ON x.gpu_type = pp.gpu_type
      AND x.piece_start >= pp.effective_from AND x.piece_start < pp.effective_to"""
"""One row per piece of borrowing (``side = 'borrowed'``: an interval's GPUs above its
policy's reservation, ``borrowed_mms``, and of them the lent ones, ``lent_mms``) or of a
reservation (``side = 'reserved'``: ``reserved_mms``, ``idle_mms`` before lending and the
``lent_mms`` other policies borrowed from it); amounts in thousandths of a GPU-millisecond."""


def _hours_of(mms: str) -> str:
    """A sum of thousandths of GPU-milliseconds as GPU-hours, rounded half up once."""
    return _dec(_round_div(f"CAST(sum({mms}) AS HUGEINT)", _UNITS_PER_MICRO_HOUR), _SUM)


def _cost_of(mms: str) -> str:
    """A sum of thousandths of GPU-milliseconds times the row's price, rounded half up once
    to the millionth (NULL when unpriced)."""
    return _dec(_round_div(f"sum(CAST({mms} AS HUGEINT) * CAST(x.per_gpu_hour * 1000000 "
                           "AS HUGEINT))", _UNITS_PER_MICRO_HOUR * 1_000_000), _SUM)


VIEWS: dict[str, str] = {
    "lending_pieces": LENDING_PIECES,

    # each interval's borrowed GPU-hours per month and price period, and of them the ones
    # lent by other policies' idle reservations (with their cost)
    "borrowed_usage": f"""
SELECT x.month, x.interval_id, x.task, x."group", x.group_path, {_levels("x")}, x.project,
       x."user", x.policy, x.pool, x.gpu_type, x.per_gpu_hour, x.currency, x.price_from,
       {_hours_of("x.borrowed_mms")} AS borrowed_hours, {_hours_of("x.lent_mms")} AS lent_hours,
       {_cost_of("x.borrowed_mms")} AS borrowed_cost, {_cost_of("x.lent_mms")} AS lent_cost
FROM lending_pieces x WHERE x.side = 'borrowed'
GROUP BY ALL""",

    # the reserved GPUs each policy neither used nor lent, per month (the lent ones are
    # paid for by their borrowers: no GPU-hour is counted twice), and what it lent
    "reserved_idle": f"""
SELECT x.month, x.policy, x."group", x.group_path, {_levels("x")}, x.gpu_type,
       CAST(max(x.reserved) * 0.001 AS DECIMAL(12,3)) AS reserved,
       {_hours_of("x.reserved_mms")} AS reserved_hours,
       {_hours_of("x.idle_mms - x.lent_mms")} AS idle_hours,
       {_hours_of("x.lent_mms")} AS lent_hours,
       any_value(x.currency) AS currency,
       {_cost_of("x.idle_mms - x.lent_mms")} AS idle_cost,
       {_cost_of("x.lent_mms")} AS lent_cost
FROM lending_pieces x WHERE x.side = 'reserved'
GROUP BY ALL""",
}
"""The views of this module, by name (``kliqued.ledger.schema`` creates them in order)."""

ORDER: tuple[str, ...] = ("lending_pieces", "borrowed_usage", "reserved_idle")
"""Their creation order (each reads only what comes before it)."""
