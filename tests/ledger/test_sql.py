"""run_readonly: read-only by construction, a time limit, a row limit, JSON-ready values."""

from __future__ import annotations

import json
import time

import duckdb
import pytest

from kliqued.ledger import LedgerSqlError, open_intervals, run_readonly

from .conftest import row, set_prices


@pytest.mark.parametrize(
    "sql, code",
    [
        ("INSERT INTO prices VALUES ('x', 1, 'EUR', TIMESTAMP '2026-01-01')", "not-read-only"),
        ("UPDATE ledger SET gpus = 0", "not-read-only"),
        ("DELETE FROM ledger", "not-read-only"),
        ("CREATE TABLE evil AS SELECT 1", "not-read-only"),
        ("DROP TABLE ledger", "not-read-only"),
        ("ATTACH ':memory:' AS other", "not-read-only"),
        ("COPY ledger TO 'out.csv'", "not-read-only"),
        ("PRAGMA database_list", "not-read-only"),
        ("SET threads = 1", "not-read-only"),
        ("CALL pragma_version()", "not-read-only"),
        ("EXPLAIN SELECT 1", "not-read-only"),
        ("SELECT 1; DELETE FROM ledger", "multiple-statements"),
        ("SELECT 1; SELECT 2", "multiple-statements"),
        ("SELEC 1", "sql-error"),
        ("   ", "sql-error"),
        ("SELECT * FROM no_such_table", "not-allowed"),  # as for a table that exists
    ],
)
def test_refused_with_the_right_code(db, sql, code):
    with pytest.raises(LedgerSqlError) as err:
        run_readonly(db.cursor(), sql)
    assert err.value.code == code
    assert err.value.message
    assert db.execute("SELECT count(*) FROM ledger").fetchone()[0] == 0  # nothing changed


def test_external_access_is_blocked(db):
    for sql in [
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM read_text('/etc/hostname')",
        "SELECT * FROM read_parquet('https://example.com/x.parquet')",
    ]:
        with pytest.raises(LedgerSqlError) as err:
            run_readonly(db.cursor(), sql)
        # refused by the sandbox's allowlist of table functions before DuckDB's own
        # enable_external_access = false (which the database keeps as a second wall)
        assert err.value.code == "not-allowed"
        assert "not available" in err.value.message
    with pytest.raises(duckdb.PermissionException):
        db.execute("SELECT * FROM read_text('/etc/hostname')")


def test_a_select_cannot_write_even_through_a_function(db):
    db.execute("CREATE SEQUENCE s")
    # the statement is a SELECT; nextval is refused by the sandbox (a function with a side
    # effect), and the transaction is READ ONLY besides
    with pytest.raises(LedgerSqlError) as err:
        run_readonly(db.cursor(), "SELECT nextval('s')")
    assert err.value.code == "not-allowed"
    assert db.execute("SELECT nextval('s')").fetchone()[0] == 1  # never advanced


def test_timeout_interrupts_and_the_cursor_stays_usable(db):
    cur = db.cursor()
    t = time.perf_counter()
    with pytest.raises(LedgerSqlError) as err:
        run_readonly(
            cur, "SELECT count(*) FROM range(100000000) a, range(100000000) b", timeout_s=0.3
        )
    assert err.value.code == "timeout"
    assert time.perf_counter() - t < 5
    assert run_readonly(cur, "SELECT 42 AS x").rows == [[42]]


def test_limit_truncates(db):
    res = run_readonly(db.cursor(), "SELECT * FROM range(100) t(i) ORDER BY i", limit=10)
    assert res.truncated and len(res.rows) == 10 and res.rows[-1] == [9]
    res = run_readonly(db.cursor(), "SELECT * FROM range(10) t(i)", limit=10)
    assert not res.truncated and len(res.rows) == 10
    with pytest.raises(LedgerSqlError) as err:
        run_readonly(db.cursor(), "SELECT 1", limit=10**9)
    assert err.value.code == "too-large"
    with pytest.raises(LedgerSqlError) as err:
        run_readonly(db.cursor(), "SELECT 1", limit=0)
    assert err.value.code == "sql-error"


def test_result_too_large(db):
    with pytest.raises(LedgerSqlError) as err:
        run_readonly(
            db.cursor(),
            "SELECT repeat('x', 1000) FROM range(5000)",
            limit=5000,
            max_bytes=1_000_000,
        )
    assert err.value.code == "too-large"


def test_values_are_json_ready(db):
    set_prices(db, ("h100", "1.85", "2026-01-01"))
    open_intervals(db, [row(1, 1_767_225_600_123)])  # 2026-01-01T00:00:00.123Z
    res = run_readonly(
        db.cursor(),
        """
        SELECT interval_id, gpus, per_gpu_hour, start_at, end_at, CAST(start_at AS DATE) AS d,
               'nan'::DOUBLE AS n, INTERVAL 90 MINUTE AS i, [1, 2] AS l,
               {'a': 1.5::DECIMAL(4,2)} AS s,
               TIMESTAMPTZ '2026-01-01 01:00:00+00' AS tz
        FROM usage_priced""",
    )
    assert res.columns[:3] == ["interval_id", "gpus", "per_gpu_hour"]
    assert res.types[1] == "DECIMAL(12,3)" and res.types[3] == "TIMESTAMP"
    assert res.rows == [
        [
            "t-1#1",
            "1.000",
            "1.850000",
            "2026-01-01T00:00:00.123Z",
            None,
            "2026-01-01",
            "NaN",
            5400,
            [1, 2],
            {"a": "1.50"},
            "2026-01-01T01:00:00Z",
        ]
    ]
    json.dumps(res.to_json(), allow_nan=False)
    assert res.elapsed_ms >= 0


def test_snapshot_is_read_only_and_rolled_back(db):
    cur = db.cursor()
    run_readonly(cur, "SELECT 1")
    cur.execute("BEGIN")  # no transaction left open by run_readonly
    cur.execute("ROLLBACK")


def test_works_on_an_in_memory_database_without_the_ledger():
    conn = duckdb.connect(":memory:", config={"enable_external_access": False})
    assert run_readonly(conn, "SELECT 1 + 1 AS two").rows == [[2]]
