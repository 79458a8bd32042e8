"""The ledger's tables and views, defined once (kliqued/ledger/tables.py, views.py) and
rendered for DuckDB and PostgreSQL, are equivalent to the DDL each database had before
(issue 27): ``fixtures/ddl_before_27.json`` holds the SQL that ``schema.py`` and
``pgschema.py`` generated before the change (DuckDB's ``ensure_schema`` statements, PostgreSQL's
ledger migrations 3-5). A database is built from each, side by side, and their catalogs
(tables, columns, types, nullability, keys, indexes, sequences, views' result columns) and
every relation's rows on one fixture ledger are compared. Time-dependent views (open
intervals run up to now) are read from both in one transaction, so both see the same now."""

from __future__ import annotations

import pytest

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import psycopg

from kliqued.daemon.storage.pglog import MIGRATIONS
from kliqued.ledger import ensure_schema
from kliqued.ledger.pgschema import monthly_rows_sql as pg_monthly_rows_sql
from kliqued.ledger.schema import VIEW_ORDER, monthly_rows_sql

BEFORE = json.loads((Path(__file__).parent / "fixtures" / "ddl_before_27.json").read_text())

TABLES = (
    "ledger",
    "prices",
    "cloud_nodes",
    "capacity",
    "reservations",
    "preemptions",
    "ledger_monthly",
    "ledger_monthly_pending",
    "ledger_feed",
)

_L = (
    'interval_id, task, "user", project, "group", policy, profile, resource, pool, '
    "gpu_type, gpus, time_weight, start_at, end_at, end_reason, revision, group_path, channel"
)


def _iv(
    n: int,
    group: str,
    path: str | None,
    start: str,
    end: str | None,
    gpus: str,
    gpu_type: str = "h100",
    channel: str | None = "cli",
) -> str:
    end_sql = "NULL" if end is None else f"TIMESTAMP '{end}'"
    path_sql = "NULL" if path is None else f"'{path}'"
    chan = "NULL" if channel is None else f"'{channel}'"
    project = "'llm'" if n % 2 else "NULL"
    return (
        f"('t-{n}#1', 't-{n}', 'u{n % 3}', {project}, '{group}', '{group}', 'std', "
        f"'{group}/std', 'pool-{gpu_type}', '{gpu_type}', {gpus}, 1.500, "
        f"TIMESTAMP '{start}', {end_sql}, 'finished', 'r1', {path_sql}, {chan})"
    )


FIXTURE = [
    (
        "INSERT INTO prices VALUES ('h100', 2.5, 'EUR', TIMESTAMP '2026-01-01 00:00:00', NULL), "
        "('h100', 3.25, 'EUR', TIMESTAMP '2026-09-15 00:00:00', 4.0), "
        "('l40s', 0.8, 'EUR', TIMESTAMP '2026-01-01 00:00:00', NULL)"
    ),
    (
        "INSERT INTO capacity VALUES (TIMESTAMP '2026-08-01 00:00:00', 'r1', 'pool-h100', "
        "'onprem', 'h100', 8), (TIMESTAMP '2026-08-01 00:00:00', 'r1', 'pool-l40s', 'cloud', "
        "'l40s', 4), (TIMESTAMP '2026-10-01 00:00:00', 'r2', 'pool-h100', 'onprem', 'h100', 6)"
    ),
    (
        "INSERT INTO reservations VALUES "
        "(TIMESTAMP '2026-08-01 00:00:00', 'r1', 'team-a', 'team-a', 'n/ml/team-a', 2, 'h100'), "
        "(TIMESTAMP '2026-08-01 00:00:00', 'r1', 'team-b', 'team-b', 'n/ml/team-b', 1, 'h100'), "
        "(TIMESTAMP '2026-10-01 00:00:00', 'r2', 'team-a', 'team-a', 'n/ml/team-a', 3, 'h100')"
    ),
    f"INSERT INTO ledger ({_L}) VALUES "
    + ", ".join(
        [
            _iv(1, "team-a", "n/ml/team-a", "2026-08-03 10:00:00", "2026-08-03 18:00:00.5", "1"),
            _iv(2, "team-b", "n/ml/team-b", "2026-08-31 22:30:00.25", "2026-10-02 01:00:00", "2.5"),
            _iv(3, "team-c", "s/ops/team-c", "2026-09-15 08:00:00", "2026-11-01 00:00:00", "3"),
            _iv(
                4,
                "team-a",
                None,
                "2026-09-30 23:59:59.999",
                "2026-10-01 00:00:10",
                "1",
                channel=None,
            ),
            _iv(5, "team-b", "n/ml/team-b", "2026-10-05 00:00:00", None, "0.5"),
            _iv(
                6,
                "team-c",
                "s/ops/team-c",
                "2026-10-06 00:00:00",
                "2026-10-08 00:00:00",
                "4",
                gpu_type="l40s",
            ),
            _iv(7, "team-a", "n/ml/team-a", "2026-09-01 00:00:00", "2026-09-20 00:00:00", "4"),
            _iv(8, "team-b", "n/ml/team-b", "2026-09-10 00:00:00", None, "2"),
        ]
    ),
    "INSERT INTO ledger_monthly_pending SELECT * FROM ledger WHERE interval_id = 't-7#1'",
    "INSERT INTO ledger_feed VALUES (1, 't-1#1'), (2, 't-4#1')",
    (
        "INSERT INTO cloud_nodes VALUES ('n1', 'pool-l40s', 'aws', 'g6', 'spot', 4, 3.2, 'EUR', "
        "TIMESTAMP '2026-09-30 20:00:00', TIMESTAMP '2026-10-01 03:15:00', 'idle', 'r1'), "
        "('n2', 'pool-l40s', 'aws', 'g6', 'on-demand', 4, 5.5, 'EUR', "
        "TIMESTAMP '2026-10-20 00:00:00', NULL, NULL, 'r2')"
    ),
    (
        "INSERT INTO preemptions VALUES ('t-2#1', 't-2', 'u2', NULL, 'team-b', 'n/ml/team-b', "
        "'team-b', 'pool-h100', 'h100', 2.5, TIMESTAMP '2026-10-02 01:00:00', 'reclaimed', 'r', "
        "'team-a', 'n/ml/team-a', 3600000, 2.5, 'r1')"
    ),
]
"""One small ledger for both databases: intervals across month ends and price changes, open
ones, borrowing and idle reservations, a pending row, cloud nodes (one running), a
preemption."""

_CLOSED = "(SELECT * FROM ledger WHERE end_at IS NOT NULL AND interval_id <> 't-7#1')"
"""The closed intervals folded into ``ledger_monthly`` (t-7 is still pending)."""


def _norm(value: Any) -> str:
    """A value by what it means (``0`` and ``0.000`` are one figure)."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, (int, Decimal)):
        return format(Decimal(value).normalize(), "f")
    return str(value)


def _rows(cur: Any, sql: str) -> tuple[list[str], list[tuple[str, ...]]]:
    cur.execute(sql)
    cols = [d[0] for d in cur.description]
    return cols, sorted(tuple(_norm(v) for v in r) for r in cur.fetchall())


# --- DuckDB ---------------------------------------------------------------------------------


def _duck_catalog(conn: duckdb.DuckDBPyConnection, db: str) -> dict[str, Any]:
    columns = conn.execute(
        "SELECT table_name, column_name, data_type, is_nullable, ordinal_position "
        "FROM information_schema.columns WHERE table_catalog = ? ORDER BY ALL",
        [db],
    ).fetchall()
    kinds = conn.execute(
        "SELECT table_name, table_type FROM information_schema.tables "
        "WHERE table_catalog = ? ORDER BY ALL",
        [db],
    ).fetchall()
    keys = conn.execute(
        "SELECT table_name, constraint_type, constraint_column_names "
        "FROM duckdb_constraints() WHERE database_name = ? ORDER BY ALL",
        [db],
    ).fetchall()
    indexes = conn.execute(
        "SELECT table_name, index_name FROM duckdb_indexes() WHERE database_name = ? ORDER BY ALL",
        [db],
    ).fetchall()
    sequences = conn.execute(
        "SELECT sequence_name, start_value FROM duckdb_sequences() "
        "WHERE database_name = ? ORDER BY ALL",
        [db],
    ).fetchall()
    return {
        "columns": columns,
        "kinds": kinds,
        "keys": keys,
        "indexes": indexes,
        "sequences": sequences,
    }


@pytest.mark.slow  # long on its own: make test, not make check
def test_duckdb_schema_is_the_one_before() -> None:
    conn = duckdb.connect(":memory:", config={"enable_external_access": False})
    try:
        conn.execute("ATTACH ':memory:' AS before")
        conn.execute("ATTACH ':memory:' AS after")
        conn.execute("USE before")
        for statement in BEFORE["duckdb"]:
            conn.execute(statement)
        conn.execute("USE after")
        ensure_schema(conn)
        for db in ("before", "after"):
            conn.execute(f"USE {db}")
            for statement in FIXTURE:
                conn.execute(statement)
            conn.execute(f"INSERT INTO ledger_monthly {monthly_rows_sql(_CLOSED)}")
        before, after = _duck_catalog(conn, "before"), _duck_catalog(conn, "after")
        assert after == before
        conn.execute("BEGIN")
        compared = 0
        for name in (*TABLES, *VIEW_ORDER):
            conn.execute("USE before")
            old = _rows(conn, f"SELECT * FROM {name}")
            conn.execute("USE after")
            new = _rows(conn, f"SELECT * FROM {name}")
            assert new == old, name
            compared += len(old[1])
        conn.execute("COMMIT")
        assert compared > 100
    finally:
        conn.close()


# --- PostgreSQL -----------------------------------------------------------------------------


def _pg_catalog(conn: psycopg.Connection[Any], schema: str) -> dict[str, Any]:
    def rows(sql: str) -> list[Any]:
        return conn.execute(sql, [schema]).fetchall()

    return {
        "columns": rows(
            "SELECT table_name, column_name, data_type, numeric_precision, "
            "numeric_scale, is_nullable, ordinal_position "
            "FROM information_schema.columns WHERE table_schema = %s "
            "ORDER BY 1, 2"
        ),
        "kinds": rows(
            "SELECT table_name, table_type FROM information_schema.tables "
            "WHERE table_schema = %s ORDER BY 1"
        ),
        "keys": rows(
            "SELECT c.relname, x.contype, pg_get_constraintdef(x.oid) "
            "FROM pg_constraint x JOIN pg_class c ON c.oid = x.conrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s "
            "ORDER BY 1, 2, 3"
        ),
        "indexes": rows(
            "SELECT tablename, indexname, "
            "replace(indexdef, schemaname || '.', '') FROM pg_indexes "
            "WHERE schemaname = %s ORDER BY 1, 2"
        ),
        "sequences": rows(
            "SELECT sequence_name, start_value FROM information_schema.sequences "
            "WHERE sequence_schema = %s ORDER BY 1"
        ),
    }


def test_postgresql_schema_is_the_one_before(pg_url: str) -> None:
    after_ddl = [s for version, _, statements in MIGRATIONS if version >= 3 for s in statements]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for schema, ddl in (("before", BEFORE["postgresql"]), ("after", after_ddl)):
            conn.execute(f"CREATE SCHEMA {schema}")
            conn.execute(f"SET search_path TO {schema}")
            for statement in ddl:
                conn.execute(statement)
            for statement in FIXTURE:
                conn.execute(statement)
            conn.execute(f"INSERT INTO ledger_monthly {pg_monthly_rows_sql(_CLOSED)}")
        before, after = _pg_catalog(conn, "before"), _pg_catalog(conn, "after")
        assert after["columns"] == before["columns"]
        assert after == before
    with psycopg.connect(pg_url) as conn:  # one transaction: one now for both
        cur = conn.cursor()
        compared = 0
        for name in (*TABLES, *VIEW_ORDER):
            old = _rows(cur, f"SELECT * FROM before.{name}")
            new = _rows(cur, f"SELECT * FROM after.{name}")
            assert new == old, name
            compared += len(old[1])
        assert compared > 100
