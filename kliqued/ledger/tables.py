"""The ledger's tables, each defined once as a typed record and rendered as DDL for DuckDB
and PostgreSQL (:mod:`.dialect`; :mod:`.schema` explains the layout).

Types are written portably: ``text`` (VARCHAR in DuckDB, TEXT in PostgreSQL) and
``decimal`` (DECIMAL, NUMERIC) by dialect; the others (TIMESTAMP, BIGINT, INTEGER, DATE) are
spelt alike in both.
"""

from __future__ import annotations

from dataclasses import dataclass

from .dialect import DUCKDB, Dialect, q


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    """``text``, ``decimal(p,s)`` or a type spelt alike in both databases."""
    null: bool = False
    primary: bool = False
    comment: str = ""

    def sql_type(self, d: Dialect) -> str:
        if self.type == "text":
            return d.text
        if self.type.startswith("decimal("):
            precision, scale = self.type[len("decimal(") : -1].split(",")
            return d.decimal(int(precision), int(scale))
        return self.type

    def render(self, d: Dialect) -> str:
        typ = self.sql_type(d)
        key = " PRIMARY KEY" if self.primary else ""
        null = "" if self.null or self.primary else " NOT NULL"
        return f"{q(self.name)} {typ}{key}{null}"


def _c(name: str, typ: str, comment: str = "") -> Column:
    return Column(name, typ, comment=comment)


def _n(name: str, typ: str, comment: str = "") -> Column:
    """A column that may be NULL."""
    return Column(name, typ, null=True, comment=comment)


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[Column, ...]
    key: tuple[str, ...] = ()
    """A primary key of several columns (one column's is on the column)."""

    def render(self, d: Dialect, if_missing: bool | None = None) -> str:
        """``CREATE TABLE``; ``if_missing`` (by default in DuckDB, whose ``ensure_schema``
        runs at every start; PostgreSQL's migrations run once) adds ``IF NOT EXISTS``."""
        lines = [c.render(d) for c in self.columns]
        if self.key:
            lines.append(f"PRIMARY KEY ({', '.join(q(k) for k in self.key)})")
        exists = "IF NOT EXISTS " if (not d.pg if if_missing is None else if_missing) else ""
        return f"CREATE TABLE {exists}{self.name} (\n    " + ",\n    ".join(lines) + "\n)"

    def without(self, *names: str) -> Table:
        """The table as it was before ``names`` were added (older files' upgrades)."""
        return Table(
            self.name,
            tuple(c for c in self.columns if c.name not in names),
            tuple(k for k in self.key if k not in names),
        )

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)


LEDGER = Table(
    "ledger",
    (
        Column("interval_id", "text", primary=True),
        _c("task", "text"),
        _c("user", "text"),
        _n("project", "text"),
        _c("group", "text"),
        _c("policy", "text"),
        _c("profile", "text"),
        _c("resource", "text"),
        _c("pool", "text"),
        _c("gpu_type", "text"),
        _c("gpus", "decimal(12,3)"),
        _c("time_weight", "decimal(12,3)"),
        _c("start_at", "TIMESTAMP"),
        _n("end_at", "TIMESTAMP"),
        _n("end_reason", "text"),
        _n("revision", "text"),
        _n("group_path", "text"),
        _n("channel", "text"),
    ),
)
"""One row per placement interval. ``group_path`` is the interval's group and its ancestors,
top first, joined by ``/`` (``northwind/research/team-a``), as the estate in force at the
interval's open had them; it is after the others because databases from before it get it by
``ALTER TABLE ... ADD COLUMN``; so is ``channel``: how the task was sent (``cli``, ``sdk``,
``api``, ``mcp``, ``schedule``, ``pipeline``, ``session``: kliqued/daemon/state/channels.py), NULL
on rows from before it (``usage_monthly`` and ``ledger_monthly`` count those as ``api``)."""

PRICES = Table(
    "prices",
    (
        _c("gpu_type", "text"),
        _c("per_gpu_hour", "decimal(18,6)"),
        _c("currency", "text"),
        _c("effective_from", "TIMESTAMP"),
        _n("list_per_gpu_hour", "decimal(18,6)", "NULL: the list price is per_gpu_hour"),
    ),
)

CLOUD_NODES = Table(
    "cloud_nodes",
    (
        Column("node", "text", primary=True),
        _c("pool", "text"),
        _c("provider", "text"),
        _c("instance_type", "text"),
        _c("lifecycle", "text", "spot | on-demand"),
        _c("gpus", "INTEGER"),
        _c("per_hour", "decimal(18,6)", "the node's price an hour, fixed at its start"),
        _c("currency", "text"),
        _c("start_at", "TIMESTAMP"),
        _n("end_at", "TIMESTAMP"),
        _n("end_reason", "text"),
        _n("revision", "text"),
    ),
)
"""One row per cloud node an autoscaler started (docs/ledger.md, "Cloud spend"): the node's
interval, its instance type and lifecycle, and the price an hour the estate gave it at its
start (``autoscale.node_prices``, else its GPUs x the gpu_type's price)."""

CAPACITY = Table(
    "capacity",
    (
        _c("effective_from", "TIMESTAMP"),
        _c("revision", "text"),
        _c("pool", "text"),
        _c("kind", "text"),
        _c("gpu_type", "text"),
        _c("gpus", "decimal(12,3)"),
    ),
)
"""Each applied revision's pools (:mod:`.capacity`)."""

RESERVATIONS = Table(
    "reservations",
    (
        _c("effective_from", "TIMESTAMP"),
        _c("revision", "text"),
        _c("policy", "text"),
        _c("group", "text"),
        _c("group_path", "text"),
        _c("gpus", "decimal(12,3)"),
        _n("gpu_type", "text", "how its idle GPUs are priced (record_estate)"),
    ),
)

MONTHLY_KEY = (
    "month",
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
    "price_from",
)

LEDGER_MONTHLY = Table(
    "ledger_monthly",
    (
        _c("month", "DATE"),
        _c("group", "text"),
        _c("group_path", "text", "'' for none"),
        _c("project", "text", "'' for none"),
        _c("user", "text"),
        _c("channel", "text"),
        _c("policy", "text"),
        _c("profile", "text"),
        _c("resource", "text"),
        _c("pool", "text"),
        _c("gpu_type", "text"),
        _c("price_from", "TIMESTAMP", "effective_from of the price at the piece's start"),
        _c("pieces", "BIGINT"),
        _c("ms", "BIGINT"),
        _c("gpu_ms", "decimal(38,3)"),
        _c("budget_ms", "decimal(38,3)"),
    ),
    key=MONTHLY_KEY,
)

LEDGER_FEED = Table(
    "ledger_feed",
    (
        Column(
            "seq",
            "BIGINT",
            primary=True,
            comment="the order in which intervals were closed (committed)",
        ),
        _c("interval_id", "text"),
    ),
)
"""The billing feed: every closed interval with a number given when it closed, in the same
transaction. The daemon's one writer commits closes in order, so a reader that has seen
number n has seen every number below it: ``seq > cursor`` never skips a row and never repeats
one, across restarts (the numbers are in the database, not in memory)."""

PREEMPTIONS = Table(
    "preemptions",
    (
        Column(
            "interval_id", "text", primary=True, comment="the ledger interval the preemption ended"
        ),
        _c("task", "text"),
        _c("user", "text"),
        _n("project", "text"),
        _c("group", "text", "the preempted task's group (the owner)"),
        _n("group_path", "text"),
        _c("policy", "text"),
        _c("pool", "text"),
        _c("gpu_type", "text"),
        _c("gpus", "decimal(12,3)"),
        _c("preempted_at", "TIMESTAMP"),
        _c("kind", "text", "reclaimed | rebalanced | budget | unstarted"),
        _c("reason", "text"),
        _n("taker", "text", "the group that took the GPUs back (NULL: none)"),
        _n("taker_path", "text"),
        _c("lost_ms", "BIGINT"),
        _c("lost_gpu_hours", "decimal(18,6)"),
        _n("revision", "text"),
    ),
)
"""Each preemption's lost work (:mod:`.lost`)."""

PENDING = "ledger_monthly_pending"
"""Closed intervals not yet folded into ``ledger_monthly``: the ledger's columns."""

FEED_SEQUENCE = "ledger_feed_seq"

LEDGER_COLUMNS: list[tuple[str, str]] = [(c.name, c.sql_type(DUCKDB)) for c in LEDGER.columns]
"""The ledger's columns in table order, with their DuckDB types (``user`` and ``group`` are
quoted in SQL: :func:`.dialect.q`)."""


def pending_table(d: Dialect) -> str:
    """``ledger_monthly_pending``: a table like ``ledger``, without its key."""
    if d.pg:
        return f"CREATE TABLE {PENDING} (LIKE ledger)"
    return f"CREATE TABLE IF NOT EXISTS {PENDING} AS SELECT * FROM ledger WITH NO DATA"
