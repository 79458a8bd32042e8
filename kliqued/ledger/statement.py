"""Chargeback statements: what one group (a team, a department, a business unit: any level
of the tree) owes for one billing period (a UTC month), line by line, to the cent.

Why exact fractions: a statement is money sent to another department, and its total must be
the ledger's, not a sum of rounded rows. Each line is computed from the ledger's exact
integers (GPU x milliseconds, the price in millionths) as a :class:`~fractions.Fraction`;
the only rounding is to the cent, once, by the rule of :func:`allocate_cents`:

1. the statement's total is the exact total of its lines rounded half up to the cent;
2. each line is its exact cost rounded half up to the cent; when those do not add up to the
   total, the difference (a few cents at most) goes one cent at a time to the lines whose
   rounding moved them most (the largest remainders, then the earlier line), so the lines as
   printed always add up to the total as printed.

So a line is never more than one cent from its exact cost, and the total never differs from
the ledger's exact total by more than half a cent.

The lines are by team, project, user, GPU type and price in force (a price change in the
month makes two lines); they come from the same month pieces as ``usage_monthly`` (the
pre-aggregated closed intervals plus the pending and open ones), so a statement of a month of
ten million intervals reads thousands of rows. A statement of the current month counts open
intervals up to now: it is provisional until the month ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction
from typing import Any, Sequence

import duckdb

from klique_util.excerpt import excerpt
from klique_util.units import UNITS_PER_HOUR

from . import lending, scope
from .db import scalar
from .focus import next_month
from .schema import _MONTHLY_PIECES

CENT = Decimal("0.01")
_HOUR_MS = UNITS_PER_HOUR // 1000
"""Milliseconds in an hour."""

LINES_SQL = f"""
WITH m AS ({_MONTHLY_PIECES})
SELECT m."group", m.group_path, m.project, m."user", m.gpu_type,
       p.per_gpu_hour, p.currency, p.effective_from,
       CAST(sum(m.gpu_ms) * 1000 AS HUGEINT) AS gpu_milli_ms,
       CAST(sum(m.budget_ms) * 1000 AS HUGEINT) AS budget_milli_ms,
       CAST(sum(m.ms) AS HUGEINT) AS ms
FROM m
LEFT JOIN prices p ON p.gpu_type = m.gpu_type AND p.effective_from = m.price_from
WHERE m.month = CAST(? AS DATE) AND {{scope}}
GROUP BY ALL
ORDER BY m."group", m.project, m."user", m.gpu_type, p.effective_from NULLS FIRST"""
"""Exact sums per line (GPU-milliseconds in thousandths: integers) from the month pieces."""


def round_cent(x: Fraction) -> Decimal:
    """``x`` rounded half up to the cent (towards +infinity on a half: a credit line of
    -0.125 is -0.12)."""
    cents = x * 100
    whole, rest = divmod(cents.numerator, cents.denominator)
    if 2 * rest >= cents.denominator:
        whole += 1
    return Decimal(whole) / 100


def allocate_cents(exact: Sequence[Fraction]) -> tuple[list[Decimal], Decimal]:
    """The lines' costs in cents and the total, by the module's rounding rule: the total is
    the exact sum rounded half up; the lines are rounded half up and then moved by one cent
    at a time, largest remainder first, until they add up to the total."""
    total = round_cent(sum(exact, Fraction(0)))
    lines = [round_cent(x) for x in exact]
    diff = int((total - sum(lines, Decimal(0))) / CENT)
    if diff:
        # remainder: how far rounding moved each line (positive = rounded down)
        moved = [Fraction(x) - Fraction(str(r)) for x, r in zip(exact, lines)]
        order = sorted(range(len(lines)), key=lambda i: (-moved[i] if diff > 0 else moved[i], i))
        step = CENT if diff > 0 else -CENT
        for i in order[: abs(diff)]:
            lines[i] += step
    return [line.quantize(CENT) for line in lines], total.quantize(CENT)


class UnknownGroup(ValueError):
    """The group is neither in the estate nor on any recorded interval."""


@dataclass
class Line:
    group: str
    group_path: str | None
    project: str | None
    user: str
    gpu_type: str
    per_gpu_hour: Decimal | None
    price_from: str | None
    gpu_milli_ms: int
    budget_milli_ms: int
    ms: int
    cost: Decimal = Decimal(0)
    kind: str = "usage"
    """``usage``; ``reserved_idle``: the policy's reserved GPUs nobody used; with
    ``settings.attribution.borrowed: split``, ``borrowed_split`` (the half of the lent
    GPU-hours the lenders pay: a credit) and ``lent_split`` (that half, on a lender's)."""
    share: Fraction = Fraction(1)
    """The part of the GPU-hours' cost this line bills: -1/2 for ``borrowed_split``, 1/2 for
    ``lent_split``, else 1."""

    @property
    def exact_cost(self) -> Fraction:
        if self.per_gpu_hour is None:
            return Fraction(0)
        return (
            Fraction(self.gpu_milli_ms, 1000 * _HOUR_MS)
            * Fraction(str(self.per_gpu_hour))
            * self.share
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "group": self.group,
            "group_path": self.group_path,
            "project": self.project,
            "user": self.user,
            "gpu_type": self.gpu_type,
            "per_gpu_hour": None if self.per_gpu_hour is None else str(self.per_gpu_hour),
            "price_from": self.price_from,
            "gpu_hours": _hours(self.gpu_milli_ms),
            "budget_hours": _hours(self.budget_milli_ms),
            "hours": _hours(self.ms * 1000),
            "cost": str(self.cost),
        }


def _hours(milli_ms: int) -> str:
    """Thousandths x milliseconds as hours, rounded half up to the millionth (the ledger's
    precision for hours)."""
    return str(round_micro(Fraction(milli_ms, 1000 * _HOUR_MS)))


MICRO = Decimal("0.000001")


def round_micro(x: Fraction) -> Decimal:
    """``x`` rounded half up to the millionth, with six decimals (as the ledger shows)."""
    micro = x * 1_000_000
    whole, rest = divmod(micro.numerator, micro.denominator)
    if 2 * rest >= micro.denominator:
        whole += 1
    return (Decimal(whole) / 1_000_000).quantize(MICRO)


@dataclass
class Statement:
    group: str
    path: str
    period: date
    currency: str
    lines: list[Line]
    total: Decimal
    exact_total: Fraction
    budgets: list[dict[str, Any]] = field(default_factory=list)
    unpriced: list[str] = field(default_factory=list)
    borrowed: str = "borrower"
    """``settings.attribution.borrowed`` the statement was made with."""
    lost_work: str = "owner"
    """``settings.attribution.lost_work`` the statement was made with."""

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "path": self.path,
            "period": f"{self.period:%Y-%m}",
            "period_start": f"{self.period:%Y-%m-%d}T00:00:00Z",
            "period_end": f"{next_month(self.period):%Y-%m-%d}T00:00:00Z",
            "currency": self.currency,
            "lines": [line.to_json() for line in self.lines],
            "gpu_hours": _hours(
                sum(x.gpu_milli_ms for x in self.lines if x.kind in ("usage", "reserved_idle"))
            ),
            "budget_hours": _hours(sum(x.budget_milli_ms for x in self.lines)),
            "total": str(self.total),
            "exact_total": str(round_micro(self.exact_total)),
            "budgets": self.budgets,
            "unpriced_gpu_types": self.unpriced,
            "borrowed": self.borrowed,
            "lost_work": self.lost_work,
            "rounding": "lines and total to the cent, half up; the lines are adjusted by the "
            "largest remainders to add up to the total (docs/ledger.md)",
        }


def group_path_of(conn: duckdb.DuckDBPyConnection, group: str, estate_paths: dict[str, str]) -> str:
    """The path of ``group`` in the estate, or else as the ledger last recorded it (a group
    since removed still has its history). :class:`UnknownGroup` names the groups there are
    when it is in neither."""
    if group in estate_paths:
        return estate_paths[group]
    row = conn.execute(
        "SELECT max(group_path) FROM ledger WHERE list_contains(string_split(group_path, '/'), ?)",
        [group],
    ).fetchone()
    if row and row[0]:
        parts = row[0].split("/")
        return "/".join(parts[: parts.index(group) + 1])
    import difflib

    near = difflib.get_close_matches(group, list(estate_paths), n=3)
    hint = f" (did you mean {', '.join(near)}?)" if near else ""
    raise UnknownGroup(
        f"unknown group {excerpt(group)}: it is not in the estate and no usage was "
        f"ever recorded for it{hint}"
    )


RESERVED_IDLE = "(reserved, not used)"
"""The project column of a statement line that bills a policy's reserved GPUs nobody used
(``settings.attribution.reserved_idle: group``)."""

LENT = "(lent: half of what others borrowed)"
"""The project column of a lender's ``lent_split`` line."""

SPLIT = Fraction(1, 2)
"""The lenders' part of the cost of lent GPU-hours with ``borrowed: split``."""

_LENDING_SQL = """
SELECT x.side, x."group", x.group_path, coalesce(x.project, ''), coalesce(x."user", ''),
       x.policy, x.gpu_type, x.per_gpu_hour, x.currency, x.price_from,
       CAST(sum(x.lent_mms) AS HUGEINT)
FROM {pieces} x
WHERE x.month = CAST(? AS DATE) AND x.lent_mms > 0 AND {scope}
GROUP BY ALL
ORDER BY x.side, x."group", 4, 5, x.policy, x.gpu_type, x.price_from NULLS FIRST"""
"""The lent GPU-milliseconds (thousandths, exact) per borrower line and per lending policy,
by price in force."""


def _split_lines(
    conn: duckdb.DuckDBPyConnection, period: date, where: str, pieces: str
) -> list[Line]:
    """The lines of ``borrowed: split``: each borrower line's lent GPU-hours credited by
    half (the lenders pay it), each lending policy billed that half, pro rata (kliqued.ledger
    .lending): the same price on both sides, so the credits and shares add up to
    zero, to far below a cent."""
    out = []
    sql = _LENDING_SQL.format(scope=where, pieces=pieces)
    for r in conn.execute(sql, [period.isoformat()]).fetchall():
        borrower = r[0] == "borrowed"
        out.append(
            Line(
                group=r[1],
                group_path=r[2],
                project=(r[3] or None) if borrower else LENT,
                user=r[4],
                gpu_type=r[6],
                per_gpu_hour=r[7],
                price_from=None if r[9] is None else f"{r[9]:%Y-%m-%dT%H:%M:%SZ}",
                gpu_milli_ms=int(r[10]),
                budget_milli_ms=0,
                ms=0,
                kind="borrowed_split" if borrower else "lent_split",
                share=-SPLIT if borrower else SPLIT,
            )
        )
    return out


_IDLE_SQL = """
SELECT "group", group_path, policy, gpu_type, idle_hours, idle_cost, currency
FROM ({reserved_idle}) r WHERE month = CAST(? AS DATE) AND {scope} AND idle_hours > 0
ORDER BY "group", policy"""


def build(
    conn: duckdb.DuckDBPyConnection,
    group: str,
    period: date,
    estate_paths: dict[str, str],
    currency: str,
    policies: Sequence[Any] = (),
    visible: Sequence[str] | None = None,
    reserved_idle: bool = False,
    borrowed: str = "borrower",
    lost_work: str = "owner",
) -> Statement:
    """The statement of ``group``'s subtree for the month ``period``. ``estate_paths``: each
    estate group's path (:func:`kliqued.ledger.writer.group_paths`); ``policies``: the
    estate's compiled policies (for the budgets); ``visible``: the caller's groups when it
    may read only their subtrees (a group admin), None for everything; ``reserved_idle``:
    bill each policy's reserved GPUs nobody used to it, one line per policy (the ledger's
    ``reserved_idle``: its GPU-hours and cost, exact to the millionth, less what it lent);
    ``borrowed``: ``settings.attribution.borrowed`` (``split``: :func:`_split_lines`);
    ``lost_work``: ``settings.attribution.lost_work`` (``taker``, ``overhead``:
    :func:`lost_lines`)."""
    path = group_path_of(conn, group, estate_paths)
    where = scope.visible("m", [group])
    if visible is not None:
        where += " AND " + scope.visible("m", visible)
    rows = conn.execute(LINES_SQL.format(scope=where), [period.isoformat()]).fetchall()
    lines = [
        Line(
            group=r[0],
            group_path=r[1] or None,
            project=r[2] or None,
            user=r[3],
            gpu_type=r[4],
            per_gpu_hour=r[5],
            price_from=None if r[7] is None else f"{r[7]:%Y-%m-%dT%H:%M:%SZ}",
            gpu_milli_ms=int(r[8]),
            budget_milli_ms=int(r[9]),
            ms=int(r[10]),
        )
        for r in rows
    ]
    currencies = {r[6] for r in rows if r[6]}
    exact = [line.exact_cost for line in lines]
    if reserved_idle or borrowed == "split":  # both derive the month's lending, once
        with lending.month_pieces(conn, period) as pieces:
            _lending_lines(
                conn,
                period,
                group,
                visible,
                reserved_idle,
                borrowed,
                pieces,
                lines,
                exact,
                currencies,
            )
    if lost_work != "owner":
        moved = lost_lines(conn, period, group, visible, lost_work, currencies)
        lines += moved
        exact += [line.exact_cost for line in moved]
    costs, total = allocate_cents(exact)
    for line, cost in zip(lines, costs):
        line.cost = cost
    st = Statement(
        group=group,
        path=path,
        period=period,
        currency=currencies.pop() if len(currencies) == 1 else currency,
        lines=lines,
        total=total,
        exact_total=sum(exact, Fraction(0)),
        unpriced=sorted(
            {x.gpu_type for x in lines if x.per_gpu_hour is None and x.kind == "usage"}
        ),
        borrowed=borrowed,
        lost_work=lost_work,
    )
    st.budgets = _budgets(conn, period, path, policies, estate_paths, visible)
    return st


def _lending_lines(
    conn: duckdb.DuckDBPyConnection,
    period: date,
    group: str,
    visible: Sequence[str] | None,
    reserved_idle: bool,
    borrowed: str,
    pieces: str,
    lines: list[Line],
    exact: list[Fraction],
    currencies: set[str],
) -> None:
    """Adds the lines that derive the month's lending (``pieces``: :func:`lending
    .month_pieces`) to ``lines``, their exact costs to ``exact``: each policy's reserved idle
    GPU-hours, and with ``split`` the borrowers' credits and the lenders' shares."""
    if reserved_idle:
        where = scope.visible("r", [group]).replace("r.group_path", "group_path")
        if visible is not None:
            where += " AND " + scope.visible("r", visible).replace("r.group_path", "group_path")
        sql = _IDLE_SQL.format(scope=where, reserved_idle=lending.reserved_idle_sql(pieces))
        for r in conn.execute(sql, [period.isoformat()]).fetchall():
            idle_hours, idle_cost = Fraction(str(r[4])), Fraction(str(r[5] or 0))
            lines.append(
                Line(
                    group=r[0],
                    group_path=r[1],
                    project=RESERVED_IDLE,
                    user="",
                    gpu_type=r[3] or "",
                    per_gpu_hour=None,
                    price_from=None,
                    gpu_milli_ms=int(idle_hours * 1000 * _HOUR_MS),
                    budget_milli_ms=0,
                    ms=0,
                    kind="reserved_idle",
                )
            )
            exact.append(idle_cost)
            if r[6]:
                currencies.add(r[6])
    if borrowed == "split":
        where = scope.visible("x", [group])
        if visible is not None:
            where += " AND " + scope.visible("x", visible)
        split = _split_lines(conn, period, where, pieces)
        lines += split
        exact += [line.exact_cost for line in split]


def _budgets(
    conn: duckdb.DuckDBPyConnection,
    period: date,
    path: str,
    policies: Sequence[Any],
    estate_paths: dict[str, str],
    visible: Sequence[str] | None,
) -> list[dict[str, Any]]:
    """Each budget of a policy at or below the group: its hours per period and the budget
    hours its subtree used in the month (for a monthly budget, the share used)."""
    prefix = path + "/"
    out = []
    for pol in policies:
        if pol.budget is None:
            continue
        gpath = estate_paths.get(pol.group)
        if gpath is None or not (gpath == path or gpath.startswith(prefix)):
            continue
        where = scope.visible("m", [pol.group])
        if visible is not None:
            where += " AND " + scope.visible("m", visible)
        used = scalar(
            conn,
            f"WITH m AS ({_MONTHLY_PIECES}) SELECT CAST(coalesce(sum(m.budget_ms), 0) * 1000 "
            f"AS HUGEINT) FROM m WHERE m.month = CAST(? AS DATE) AND {where}",
            [period.isoformat()],
        )
        hours = Decimal(pol.budget.hours_milli) / 1000
        entry = {
            "policy": pol.name,
            "group": pol.group,
            "period": pol.budget.period,
            "hours": str(hours),
            "used_hours": _hours(int(used)),
        }
        if pol.budget.period == "month" and hours:
            entry["used_pct"] = str(
                (Decimal(_hours(int(used))) * 100 / hours).quantize(Decimal("0.1"), ROUND_HALF_UP)
            )
        out.append(entry)
    return out


LOST_TAKEN = "(lost work of the tasks it preempted)"
"""The project column of a taker's ``lost_work_taken`` line (``lost_work: taker``): the
preempted tasks' own projects and users are their group's, not the taker's to see."""

_LOST_SQL = """
SELECT {side}, p.gpu_type, pp.per_gpu_hour, pp.currency, pp.effective_from,
       CAST(sum(CAST(p.gpus * 1000 AS HUGEINT) * p.lost_ms) AS HUGEINT)
FROM preemptions p
LEFT JOIN price_periods pp ON p.gpu_type = pp.gpu_type
      AND p.preempted_at >= pp.effective_from AND p.preempted_at < pp.effective_to
WHERE p.taker IS NOT NULL AND p.lost_ms > 0
  AND p.preempted_at >= CAST(? AS TIMESTAMP) AND p.preempted_at < CAST(? AS TIMESTAMP)
  AND {scope}
GROUP BY ALL
ORDER BY 1, 3, 4, p.gpu_type, pp.effective_from NULLS FIRST"""
"""Lost GPU-milliseconds (thousandths, exact) of the month's reclaims and rebalances, per
line, at the price in force at each preemption."""

_OWNER_SIDE = 'p."group", p.group_path, coalesce(p.project, \'\'), p."user"'
_TAKER_SIDE = "p.taker, p.taker_path, '', ''"


def lost_lines(
    conn: duckdb.DuckDBPyConnection,
    period: date,
    group: str,
    visible: Sequence[str] | None,
    lost_work: str,
    currencies: set[str],
) -> list[Line]:
    """The lines that move lost work off its owner (``settings.attribution.lost_work``):
    each preempted task's group is credited its lost GPU-hours (``lost_work_credit``, by
    project and user); with ``taker``, the group that took the GPUs back is billed them
    (``lost_work_taken``), so a statement above both nets to zero. Only preemptions with a
    taker (reclaims, rebalances) move: a budget's or a start timeout's lost work stays the
    owner's (docs/decisions.md). Lines fall in the month of the preemption; their
    currencies are added to ``currencies``."""
    start, end = period.isoformat(), next_month(period).isoformat()
    sides = [("lost_work_credit", _OWNER_SIDE, "p.group_path")]
    if lost_work == "taker":
        sides.append(("lost_work_taken", _TAKER_SIDE, "p.taker_path"))
    out: list[Line] = []
    for kind, side, column in sides:
        where = scope.visible("x", [group]).replace("x.group_path", column)
        if visible is not None:
            where += " AND " + scope.visible("x", visible).replace("x.group_path", column)
        sql = _LOST_SQL.format(side=side, scope=where)
        for r in conn.execute(sql, [start, end]).fetchall():
            credit = kind == "lost_work_credit"
            out.append(
                Line(
                    group=r[0],
                    group_path=r[1],
                    project=(r[2] or None) if credit else LOST_TAKEN,
                    user=r[3],
                    gpu_type=r[4],
                    per_gpu_hour=r[5],
                    price_from=None if r[7] is None else f"{r[7]:%Y-%m-%dT%H:%M:%SZ}",
                    gpu_milli_ms=int(r[8]),
                    budget_milli_ms=0,
                    ms=0,
                    kind=kind,
                    share=Fraction(-1) if credit else Fraction(1),
                )
            )
            if r[6]:
                currencies.add(r[6])
    return out
