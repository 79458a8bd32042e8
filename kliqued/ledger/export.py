"""Ledger export: CSV streamed by the daemon, Parquet made from it by the client.

The API never writes a file: ``export_csv`` yields the CSV text in chunks for the HTTP
response, and ``csv_to_parquet`` runs in the CLI's own process with an in-memory DuckDB. The
dashboard's Parquet download (a browser has no converter) runs the same conversion in the
daemon, in a private temporary directory removed once the file is read. ``summary`` gives the
dashboard's usage figures over exactly the rows the export writes.
"""

from __future__ import annotations

import csv
import io
import os
from typing import Iterator, Sequence

import duckdb
import psycopg

from klique_util.excerpt import excerpt
from klique_util.files import atomic_path

from . import scope
from .db import AnyLedgerConn, Conn

EXPORT_COLUMNS: list[tuple[str, str]] = [
    ("interval_id", "VARCHAR"),
    ("task", "VARCHAR"),
    ("user", "VARCHAR"),
    ("project", "VARCHAR"),
    ("group", "VARCHAR"),
    ("group_path", "VARCHAR"),
    ("business_unit", "VARCHAR"),
    ("department", "VARCHAR"),
    ("policy", "VARCHAR"),
    ("profile", "VARCHAR"),
    ("resource", "VARCHAR"),
    ("pool", "VARCHAR"),
    ("gpu_type", "VARCHAR"),
    ("gpus", "DECIMAL(12,3)"),
    ("time_weight", "DECIMAL(12,3)"),
    ("start_at", "TIMESTAMP"),
    ("end_at", "TIMESTAMP"),
    ("end_reason", "VARCHAR"),
    ("revision", "VARCHAR"),
    ("hours", "DECIMAL(18,6)"),
    ("gpu_hours", "DECIMAL(18,6)"),
    ("budget_hours", "DECIMAL(18,6)"),
    ("per_gpu_hour", "DECIMAL(18,6)"),
    ("currency", "VARCHAR"),
    ("cost", "DECIMAL(18,6)"),
    ("channel", "VARCHAR"),
]
"""The CSV's columns and the types they have in the ledger (and in the Parquet file)."""

CHUNK_ROWS = 5000
_TS = "'%Y-%m-%dT%H:%M:%S.%gZ'"


_PG_TS = '\'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"\''
"""The same text in PostgreSQL's ``to_char``."""


def _select_list(pg: bool = False) -> str:
    out = []
    for name, typ in EXPORT_COLUMNS:
        col = f'u."{name}"'
        if typ == "TIMESTAMP":
            out.append(f"to_char({col}, {_PG_TS})" if pg else f"strftime({col}, {_TS})")
        elif typ == "VARCHAR":
            out.append(col)
        else:
            out.append(f"CAST({col} AS VARCHAR)")
    return ", ".join(out)


ROWS = """
FROM usage_priced u
WHERE u.start_at < make_timestamp(CAST(? AS BIGINT) * 1000)
  AND (u.until_at > make_timestamp(CAST(? AS BIGINT) * 1000)
       OR u.start_at >= make_timestamp(CAST(? AS BIGINT) * 1000))
  {scope}"""
EXPORT_SQL = f"""
SELECT {_select_list()}{ROWS}
ORDER BY u.start_at, u.interval_id"""
"""Rows whose interval overlaps [from, to): started before ``to`` and not ended by ``from``
(a zero-length interval counts when it starts inside the range). Whole intervals, not clipped
to the range: ``usage_by_month`` has the pieces. ``{{scope}}`` is empty for the whole ledger,
or the subtree filter of :mod:`kliqued.ledger.scope` for a group admin."""


PG_ROWS = """
FROM usage_priced u
WHERE u.start_at < TIMESTAMP 'epoch' + %s * INTERVAL '1 millisecond'
  AND (u.until_at > TIMESTAMP 'epoch' + %s * INTERVAL '1 millisecond'
       OR u.start_at >= TIMESTAMP 'epoch' + %s * INTERVAL '1 millisecond')"""
PG_EXPORT_SQL = f"""
SELECT {_select_list(pg=True)}{PG_ROWS}
ORDER BY u.start_at, u.interval_id"""
""":data:`EXPORT_SQL` in PostgreSQL (the ledger there: docs/ha.md), the whole ledger."""


def export_csv(
    conn: AnyLedgerConn,
    from_ms: int,
    to_ms: int,
    chunk_rows: int = CHUNK_ROWS,
    groups: Sequence[str] | None = None,
    pg: bool = False,
) -> Iterator[str]:
    """The ledger rows overlapping [from_ms, to_ms) with their price and cost, as CSV text in
    chunks (a header first). Times are RFC 3339 UTC with milliseconds, amounts exact decimal
    text, an empty field is NULL (an open interval has no ``end_at``; its hours run to now).
    ``groups``: only the rows whose group path passes through one of them (a group admin's
    subtree, :func:`kliqued.ledger.scope.visible`); None for every row. One query, so one
    consistent snapshot; pass a cursor the caller uses for nothing else while iterating.
    ``pg``: ``conn`` is a psycopg connection on PostgreSQL's ledger, in a transaction (the
    rows stream through a server-side cursor; the whole ledger only)."""
    if to_ms < from_ms:
        raise ValueError(f"the range ends before it starts: from {from_ms} > to {to_ms}")
    if pg and groups is not None:
        raise ValueError("a group admin's export reads the DuckDB ledger's scope")
    where = "" if groups is None else "AND " + scope.visible("u", groups)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([name for name, _ in EXPORT_COLUMNS])
    cur: Conn = conn
    if pg:
        if not isinstance(conn, psycopg.Connection):
            raise TypeError("pg=True reads through a psycopg connection")
        cur = conn.cursor(name="ledger_export")
    result = cur.execute(
        PG_EXPORT_SQL if pg else EXPORT_SQL.format(scope=where),
        [int(to_ms), int(from_ms), int(from_ms)],
    )
    header = buf.getvalue()
    buf.seek(0)
    buf.truncate()
    yield header
    while True:
        rows = result.fetchmany(chunk_rows)
        if not rows:
            break
        writer.writerows(rows)
        yield buf.getvalue()
        buf.seek(0)
        buf.truncate()


SUMMARY_DIMENSIONS = ("group", "project", "user", "gpu_type", "pool")
"""What the dashboard's usage page breaks GPU-hours and cost down by."""


def summary(
    conn: Conn, from_ms: int, to_ms: int, by: str, groups: Sequence[str] | None = None
) -> list[tuple[str | None, str, str, str]]:
    """GPU-hours and cost per value of ``by`` (one of ``SUMMARY_DIMENSIONS``) over exactly the
    rows ``export_csv`` writes for the same range and scope (so a page's totals and its CSV
    download agree): ``(value, gpu_hours, cost, currency)`` as exact decimal text, largest
    GPU-hours first."""
    if by not in SUMMARY_DIMENSIONS:
        raise ValueError(f"no breakdown by {excerpt(by)}: one of {', '.join(SUMMARY_DIMENSIONS)}")
    if to_ms < from_ms:
        raise ValueError(f"the range ends before it starts: from {from_ms} > to {to_ms}")
    where = "" if groups is None else "AND " + scope.visible("u", groups)
    sql = (
        f'SELECT u."{by}", CAST(sum(u.gpu_hours) AS VARCHAR), '
        f"CAST(coalesce(sum(u.cost), 0) AS VARCHAR), coalesce(max(u.currency), '') "
        f"{ROWS.format(scope=where)} GROUP BY ALL ORDER BY sum(u.gpu_hours) DESC, 1"
    )
    return conn.execute(sql, [int(to_ms), int(from_ms), int(from_ms)]).fetchall()


def _sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def parquet_columns(kind: str) -> list[tuple[str, str]]:
    """The column types of an export's Parquet file: ``ledger`` (the intervals) or ``focus``
    (:mod:`kliqued.ledger.focus`)."""
    if kind == "focus":
        from .focus import PARQUET_COLUMNS

        return PARQUET_COLUMNS
    return EXPORT_COLUMNS


def csv_to_parquet(
    csv_path: str | os.PathLike[str],
    parquet_path: str | os.PathLike[str],
    types: Sequence[tuple[str, str]] = EXPORT_COLUMNS,
) -> int:
    """Converts an export CSV into Parquet with the column ``types`` (the ledger's by
    default: TIMESTAMP in UTC, DECIMAL amounts), written through a temporary file and a
    rename. Returns the row count. Runs in an in-memory DuckDB of the calling process.
    Creates no directory: a missing one raises ``FileNotFoundError``.

    Timestamps are written as instants (``TIMESTAMPTZ``: Parquet's ``isAdjustedToUTC=true``),
    since every time in the ledger is UTC: a naive one reads as local time in tools that
    honour the flag. The file is private (0600), as the CSV export is."""
    columns = (
        "{"
        + ", ".join(
            f"{_sql_text(n)}: {_sql_text('TIMESTAMPTZ' if t == 'TIMESTAMP' else t)}"
            for n, t in types
        )
        + "}"
    )
    with atomic_path(parquet_path, suffix=".parquet") as tmp:
        con = duckdb.connect(":memory:")
        try:
            con.execute("SET TimeZone = 'UTC'")  # the CSV's times are UTC (a trailing Z)
            row = con.execute(
                f"COPY (SELECT * FROM read_csv({_sql_text(str(csv_path))}, header = true, "
                f"columns = {columns}, nullstr = '')) "
                f"TO {_sql_text(tmp)} (FORMAT parquet, COMPRESSION zstd)"
            ).fetchone()
        finally:
            con.close()
    return int(row[0]) if row else 0  # COPY answers one row: the rows written
