"""The ledger's tables and views in PostgreSQL's dialect (``kliqued serve --db
postgresql://...``): the same relations, columns and exact figures as the DuckDB ones of
:mod:`.schema`, whose docstring explains the layout (``ledger``, the monthly aggregate and its
pending rows, the feed, prices, capacity, cloud nodes) and the arithmetic.

Each table and view is defined once (:mod:`.tables`, :mod:`.views`, :mod:`.lending`) and
rendered here for PostgreSQL: :mod:`.dialect` holds the few forms that differ (PostgreSQL 15
has no ``GROUP BY ALL``, ``any_value``, negative list indexes, ``ASOF`` joins, ``HUGEINT`` or
``//``: amounts are summed as ``numeric``, exact, and rounded half up to the millionth once).
``tests/daemon/test_pg_ledger.py`` checks every view against DuckDB's for the same writes.

These are applied as versioned migrations (``kliqued.daemon.storage.pglog.MIGRATIONS``): a changed
view is a new migration that re-creates the views (:func:`view_statements`), never an edit of
a released one. tests/ledger/test_one_schema.py holds the rendered migrations to the catalog
and the rows of the SQL they were released with.
"""

from __future__ import annotations

from . import lost
from .dialect import POSTGRESQL
from .tables import (
    CAPACITY,
    CLOUD_NODES,
    FEED_SEQUENCE,
    LEDGER,
    LEDGER_FEED,
    LEDGER_MONTHLY,
    PRICES,
    RESERVATIONS,
    pending_table,
)
from .views import LOST_WORK_VIEW, VIEW_ORDER, merge_monthly, views
from .views import monthly_rows_sql as _monthly_rows

__all__ = [
    "LOST_WORK_VIEW",
    "MERGE_MONTHLY",
    "TABLES",
    "VIEWS",
    "lost",
    "monthly_rows_sql",
    "view_create",
    "view_statements",
]

TABLES = [
    LEDGER.render(POSTGRESQL),
    # the open intervals, found without reading the closed ones (DuckDB's zonemaps do this)
    "CREATE INDEX ledger_open ON ledger (start_at) WHERE end_at IS NULL",
    PRICES.render(POSTGRESQL),
    CLOUD_NODES.render(POSTGRESQL),
    CAPACITY.render(POSTGRESQL),
    RESERVATIONS.render(POSTGRESQL),
    LEDGER_MONTHLY.render(POSTGRESQL),
    pending_table(POSTGRESQL),
    LEDGER_FEED.render(POSTGRESQL),
    f"CREATE SEQUENCE {FEED_SEQUENCE} START 1",
]
"""The ledger's tables (migration 3; ``preemptions`` came with migration 5)."""

VIEWS: dict[str, str] = views(POSTGRESQL)

MERGE_MONTHLY = merge_monthly(POSTGRESQL)
"""Adds rows (``{rows}``: a query) to ``ledger_monthly``, summing into existing keys."""


def monthly_rows_sql(source: str) -> str:
    """:func:`.views.monthly_rows_sql` in PostgreSQL."""
    return _monthly_rows(POSTGRESQL, source)


def view_create(name: str) -> str:
    return f"CREATE VIEW {name} AS {VIEWS[name]}"


def view_statements(until: str | None = None) -> list[str]:
    """Every view dropped and created again, each after those it reads (the order of
    :data:`.views.VIEW_ORDER`): the statements of a migration that changes views.
    ``until``: only the views before that one (a released migration's, which ran before
    the tables of later views existed)."""
    names = VIEW_ORDER if until is None else VIEW_ORDER[: VIEW_ORDER.index(until)]
    drops = [f"DROP VIEW IF EXISTS {name} CASCADE" for name in reversed(names)]
    return drops + [view_create(name) for name in names]
