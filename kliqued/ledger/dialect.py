"""The two SQL dialects the ledger is written in (DuckDB, PostgreSQL 15), as one record of the
few expressions where they differ, and the exact-arithmetic helpers built on it.

The ledger's tables (:mod:`.tables`) and views (:mod:`.views`, :mod:`.lending`) are written
once against a :class:`Dialect`; :mod:`.schema` renders them for DuckDB and :mod:`.pgschema`
for PostgreSQL. Why our own small generator and not a transpiler (docs/decisions.md, "Issue
27: one ledger schema"): the differences are not syntax alone but choices of exact
arithmetic (DuckDB's ``HUGEINT`` and ``//`` against PostgreSQL's ``numeric`` and ``div``),
of plans (DuckDB's ``ASOF`` join, ``GROUP BY ALL``, list functions), and each is a line here
that a reader sees, where a transpiler would decide them at run time.

Amounts are integer milliseconds, thousandths (GPUs, weights) and millionths (prices), summed
exactly and rounded half up to the millionth once (docs/ledger.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from klique_util.units import UNITS_PER_HOUR

DialectName = Literal["duckdb", "postgresql"]


@dataclass(frozen=True)
class Dialect:
    """What differs between the two databases, each a short SQL form."""

    name: DialectName

    @property
    def pg(self) -> bool:
        return self.name == "postgresql"

    @property
    def now(self) -> str:
        """Now as a UTC TIMESTAMP, the start of the transaction: every row of one query sees
        the same now, whatever the session's time zone."""
        if self.pg:
            return "(transaction_timestamp() AT TIME ZONE 'UTC')"
        return "make_timestamp(epoch_us(current_timestamp))"

    @property
    def text(self) -> str:
        return "TEXT" if self.pg else "VARCHAR"

    def decimal(self, precision: int, scale: int) -> str:
        return f"{'NUMERIC' if self.pg else 'DECIMAL'}({precision},{scale})"

    @property
    def month(self) -> str:
        """One month as an INTERVAL."""
        return "INTERVAL '1 month'" if self.pg else "INTERVAL 1 MONTH"

    @property
    def microsecond(self) -> str:
        return "INTERVAL '1 microsecond'" if self.pg else "INTERVAL 1 MICROSECOND"

    def ms(self, a: str, b: str) -> str:
        """Whole milliseconds from ``a`` to ``b``."""
        if self.pg:
            return f"({_epoch_ms(b)} - {_epoch_ms(a)})"
        return f"date_diff('millisecond', {a}, {b})"

    def huge(self, x: str) -> str:
        """``x`` as an exact integer wide enough for any product of two amounts (DuckDB's
        HUGEINT; PostgreSQL's ``numeric``)."""
        return f"CAST({x} AS {'NUMERIC' if self.pg else 'HUGEINT'})"

    def idiv(self, numerator: str, denominator: int | str) -> str:
        """Integer division, truncated, of non-negative integers."""
        if self.pg:
            return f"div({numerator}, {denominator})"
        return f"({numerator}) // {denominator}"

    def any_value(self, x: str) -> str:
        """One value of a group whose rows all hold the same (PostgreSQL 15 has no
        ``any_value``: ``min`` gives the same)."""
        return f"min({x})" if self.pg else f"any_value({x})"

    def group_by(self, keys: str) -> str:
        """``GROUP BY`` the non-aggregated columns: DuckDB's ``ALL``, PostgreSQL's ``keys``."""
        return f"GROUP BY {keys}" if self.pg else "GROUP BY ALL"

    def same_month(self, a: str, b: str) -> str:
        if self.pg:
            return f"date_trunc('month', {a}) = date_trunc('month', {b})"
        return f"date_diff('month', {a}, {b}) = 0"

    def other_month(self, a: str, b: str) -> str:
        if self.pg:
            return f"date_trunc('month', {a}) <> date_trunc('month', {b})"
        return f"date_diff('month', {a}, {b}) <> 0"

    def months_of(self, start: str, end: str) -> str:
        """The joined relation ``m(month_start)``: every UTC month start from ``start``'s to
        the one holding the instant before ``end`` (at least ``start``'s), for the row before
        it (a lateral join; written after ``FROM source alias``)."""
        last = f"greatest({start}, {end} - {self.microsecond})"
        if self.pg:
            return (
                f" CROSS JOIN LATERAL generate_series(\n        date_trunc('month', {start}),"
                f" {last}, {self.month}) AS m(month_start)"
            )
        return (
            f", LATERAL (\n        SELECT unnest(generate_series(date_trunc('month', {start}),"
            f" {last}, {self.month})) AS month_start) m"
        )

    def series(self, start: str, stop: str, step: str) -> str:
        """A set-returning ``generate_series`` in a SELECT list (one row per value)."""
        series = f"generate_series({start}, {stop}, {step})"
        return series if self.pg else f"unnest({series})"

    def int_range(self, start: str, stop: str) -> str:
        """The integers ``start`` .. ``stop - 1`` as rows, in a SELECT list."""
        if self.pg:
            return f"generate_series({start}, {stop} - 1)"
        return f"unnest(range({start}, {stop}))"

    def split_path(self, x: str) -> str:
        """A group path as an array of its groups (1-based)."""
        return f"string_to_array({x}, '/')" if self.pg else f"string_split({x}, '/')"

    def path_part(self, alias: str, back: int) -> str:
        """The part ``back`` from the end of ``alias.group_path`` (1: the group itself), NULL
        where shorter."""
        arr = self.split_path(f"{alias}.group_path")
        if self.pg:
            return f"({arr})[cardinality({arr}) - {back - 1}]"
        return f"{arr}[-{back}]"


DUCKDB = Dialect("duckdb")
POSTGRESQL = Dialect("postgresql")


def _epoch_ms(t: str) -> str:
    return f"floor(extract(epoch FROM {t}) * 1000)::bigint"


_RESERVED = {"user", "group"}


def q(name: str) -> str:
    """A column name as SQL: ``user`` and ``group`` are reserved words."""
    return f'"{name}"' if name in _RESERVED else name


FAR_FUTURE = "TIMESTAMP '9999-12-31 23:59:59'"
NO_PRICE = "TIMESTAMP '-infinity'"
"""``ledger_monthly.price_from`` of pieces that have no price (a key column cannot be NULL)."""

SNAPSHOTS = f"""
SELECT effective_from,
       coalesce(lead(effective_from) OVER (ORDER BY effective_from), {FAR_FUTURE}) AS effective_to
FROM (SELECT DISTINCT effective_from FROM capacity) d"""
"""Each applied revision's time and the next one's: the estate's history as ranges."""

UNITS_PER_MICRO_HOUR = UNITS_PER_HOUR // 1_000_000
"""milli x ms in a millionth of an hour (3600): units (klique_util.units) to 6-decimal hours."""

SUM_PRECISION = 38
"""Sums are DECIMAL(38,6); row amounts DECIMAL(18,6)."""


def until(d: Dialect, alias: str = "l") -> str:
    """End of an interval, or now for an open one; never before its start."""
    return f"greatest({alias}.start_at, coalesce({alias}.end_at, {d.now}))"


def milli(amount: str) -> str:
    """A DECIMAL amount (GPUs, a time weight: 3 decimals) as exact integer thousandths."""
    return f"CAST({amount} * 1000 AS BIGINT)"


def micro(amount: str) -> str:
    """A DECIMAL(18,6) price as exact integer millionths."""
    return f"CAST({amount} * 1000000 AS BIGINT)"


def round_div(d: Dialect, numerator: str, denominator: int) -> str:
    """Integer division rounded half up, for a non-negative numerator."""
    if d.pg:
        return f"div(({numerator})::numeric + {denominator // 2}, {denominator})"
    return f"(({numerator}) + {denominator // 2}) // {denominator}"


def dec(d: Dialect, micros: str, precision: int = 18) -> str:
    """Integer millionths as a DECIMAL with 6 decimals (exact)."""
    typ = d.decimal(precision, 6)
    if d.pg:
        return f"(({micros}) / 1000000.0)::{typ}"
    return f"CAST(CAST({micros} AS DECIMAL({precision},0)) * 0.000001 AS {typ})"


def hours(d: Dialect, ms: str) -> str:
    """Milliseconds as hours, rounded half up to the millionth."""
    return dec(d, round_div(d, f"{ms} * 10", 36))


def amount_micro(d: Dialect, ms: str, amount: str) -> str:
    """Milliseconds times a 3-decimal amount (GPUs, a weight) in millionths of an hour,
    rounded half up: ms * milli / 3600."""
    wide = f"{ms}::numeric" if d.pg else ms
    return round_div(d, f"{wide} * {milli(amount)}", UNITS_PER_MICRO_HOUR)


def amount_hours(d: Dialect, ms: str, amount: str) -> str:
    """Milliseconds times a 3-decimal amount as hours, rounded half up to the millionth."""
    return dec(d, amount_micro(d, ms, amount))


_MAX_BIGINT = 9_000_000_000_000_000_000


def cost(d: Dialect, ms: str, gpus: str, price: str) -> str:
    """A row's GPU-hours (as shown, from ``ms`` and ``gpus``) times its price, rounded half up
    to the millionth: exactly what a reader recomputes from the row's gpu_hours and
    per_gpu_hour. DuckDB multiplies in BIGINT (HUGEINT only for a product that would not
    fit: much quicker); PostgreSQL in ``numeric``."""
    gh, pm = amount_micro(d, ms, gpus), micro(price)
    if d.pg:
        return dec(d, round_div(d, f"({gh}) * {pm}", 10**6))
    small = round_div(d, f"({gh}) * {pm}", 10**6)
    large = f"CAST({round_div(d, f'CAST({gh} AS HUGEINT) * {pm}', 10**6)} AS BIGINT)"
    return dec(
        d, f"CASE WHEN {gh} <= {_MAX_BIGINT} // greatest({pm}, 1) THEN {small} ELSE {large} END"
    )


def levels(d: Dialect, alias: str) -> str:
    """The convenience columns of a row with ``group_path``, counted up from its group (a
    team: work is always sent to a team): ``department`` is the group above it and
    ``business_unit`` the group above that, so an estate with or without a company group at
    the top reads the same. NULL where the path is shorter or unknown."""
    return f"{d.path_part(alias, 3)} AS business_unit, {d.path_part(alias, 2)} AS department"
