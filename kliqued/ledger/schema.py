"""The ledger's tables and views in DuckDB. ``ensure_schema`` is idempotent: tables are
created when missing, views are replaced so that their definition always follows this code.
Each table and view is defined once (:mod:`.tables`, :mod:`.views`) and rendered here for
DuckDB and in :mod:`.pgschema` for PostgreSQL.

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

from .db import Conn, scalar
from .dialect import DUCKDB, q
from .tables import (
    CAPACITY,
    CLOUD_NODES,
    FEED_SEQUENCE,
    LEDGER,
    LEDGER_COLUMNS,
    LEDGER_FEED,
    LEDGER_MONTHLY,
    PREEMPTIONS,
    PRICES,
    RESERVATIONS,
    pending_table,
)
from .views import DIMENSIONS, VIEW_ORDER, merge_monthly, monthly_pieces, views
from .views import monthly_rows_sql as _monthly_rows
from .views import pieces_sql as _pieces

__all__ = [
    "DIMENSIONS",
    "FEED_SEQUENCE",
    "FLUSH_AT",
    "LEDGER_COLUMNS",
    "MONTHLY_TABLE",
    "VIEWS",
    "VIEW_ORDER",
    "ensure_schema",
    "flush_monthly",
    "monthly_rows_sql",
    "pieces_sql",
    "q",
    "rebuild_monthly",
]

FLUSH_AT = 10_000
"""Pending closed intervals folded into ``ledger_monthly`` at once."""

TABLES = [
    t.render(DUCKDB) for t in (LEDGER, PRICES, CLOUD_NODES, CAPACITY, RESERVATIONS, PREEMPTIONS)
]
"""The tables created when missing (the monthly aggregate, its pending rows and the feed are
created in :func:`ensure_schema`, after the upgrades of older files)."""

MONTHLY_TABLE = LEDGER_MONTHLY.render(DUCKDB)
PENDING_TABLE = pending_table(DUCKDB)
FEED_TABLE = LEDGER_FEED.render(DUCKDB)

VIEWS = views(DUCKDB)
"""Every view's SELECT, by name (created in :data:`VIEW_ORDER`)."""

_MONTHLY_PIECES = monthly_pieces(DUCKDB)
"""Every month piece as ``ledger_monthly`` rows (``m``): the aggregate of the closed
intervals, the open intervals computed live and the pending closed ones."""


def pieces_sql(source: str) -> str:
    """:func:`.views.pieces_sql` in DuckDB."""
    return _pieces(DUCKDB, source)


def monthly_rows_sql(source: str) -> str:
    """:func:`.views.monthly_rows_sql` in DuckDB: ``ledger_monthly`` rows (not yet merged
    with existing ones) for the rows of ``source``."""
    return _monthly_rows(DUCKDB, source)


MERGE_MONTHLY = merge_monthly(DUCKDB)


def _ensure_feed(conn: Conn) -> None:
    """Creates the feed; a database from before it gets its closed intervals numbered in the
    order they ended (then by id), and the sequence continues after them."""
    if _columns(conn, "ledger_feed") is not None:
        conn.execute(f"CREATE SEQUENCE IF NOT EXISTS {FEED_SEQUENCE} START 1")
        return
    conn.execute(FEED_TABLE)
    conn.execute(
        "INSERT INTO ledger_feed SELECT row_number() OVER (ORDER BY end_at, "
        "interval_id), interval_id FROM ledger WHERE end_at IS NOT NULL"
    )
    n = int(scalar(conn, "SELECT count(*) FROM ledger_feed"))
    conn.execute(f"DROP SEQUENCE IF EXISTS {FEED_SEQUENCE}")
    conn.execute(f"CREATE SEQUENCE {FEED_SEQUENCE} START {n + 1}")


def _columns(conn: Conn, table: str) -> list[str] | None:
    """The columns of ``table`` in this database's current schema, or None when it does not
    exist."""
    rows = conn.execute(
        "SELECT column_name FROM duckdb_columns() WHERE table_name = ? "
        "AND database_name = current_database() AND schema_name = current_schema() "
        "ORDER BY column_index",
        [table],
    ).fetchall()
    return [str(r[0]) for r in rows] or None


def ensure_schema(conn: Conn) -> None:
    """Creates the tables when missing, (re)creates the views and folds pending closed
    intervals into ``ledger_monthly``. Safe to call at every start, inside or outside a
    transaction. A database from before ``ledger_monthly`` gets it built from its closed
    intervals; one from before ``group_path`` gets the column (NULL on its rows until
    :func:`kliqued.ledger.writer.fill_group_paths` runs with the estate) and its
    ``ledger_monthly`` rebuilt with the path as a dimension; one from before ``channel``
    gets it (``api`` on its rows) and ``ledger_monthly`` rebuilt likewise. Turns off DuckDB's
    progress bar on ``conn`` (it would print on stderr)."""
    conn.execute("PRAGMA disable_progress_bar")
    for table in TABLES:
        conn.execute(table)
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


def flush_monthly(conn: Conn) -> int:
    """Folds the pending closed intervals into ``ledger_monthly``; returns how many. Runs in
    the caller's transaction; the writer calls it every ``FLUSH_AT`` closes."""
    n = int(scalar(conn, "SELECT count(*) FROM ledger_monthly_pending"))
    if n:
        conn.execute(_FLUSH)
        conn.execute("DELETE FROM ledger_monthly_pending")
    return n


def rebuild_monthly(conn: Conn, gpu_types: list[str] | None = None) -> None:
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
    conn.execute(
        "DELETE FROM ledger_monthly_pending WHERE list_contains(?::VARCHAR[], gpu_type)", types
    )
    source = (
        "(SELECT * FROM ledger WHERE end_at IS NOT NULL AND list_contains(?::VARCHAR[], gpu_type))"
    )
    conn.execute(f"INSERT INTO ledger_monthly {monthly_rows_sql(source)}", types * 2)
