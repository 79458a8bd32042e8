"""Finance's SQL sees the ledger only, and can call nothing with a side effect (issue 9,
findings 3 and 9), on the daemon's real database layout: events, tokens and the ledger in one
DuckDB file opened as ``kliqued serve`` opens it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from kliqued.daemon.storage.store import Store
from kliqued.ledger import LedgerSqlError, run_readonly

SECRET = "f00dfacecafe0123456789abcdef0123456789abcdef0123456789abcdef0123"


@pytest.fixture(scope="module")
def _built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The database every test starts from, built once (its schema alone takes 0.15 s): each
    test gets a copy of the file, so what one test does reaches no other."""
    path = tmp_path_factory.mktemp("sandbox") / "kliqued.duckdb"
    s = Store(str(path))
    s.ensure_schema()
    s.conn.execute(
        "INSERT INTO tokens (id, hash, principal, name, created_at_ms, created_by)"
        " VALUES ('tok-1', ?, 'user:alice', 'laptop', 1, 'role:admin')",
        [SECRET],
    )
    s.conn.execute(
        "INSERT INTO events VALUES (1, 1, 'submitted', 't-1', 'user:alice', NULL, "
        "'team-a', 'alice', '{\"command\": [\"echo\", \"private\"]}')"
    )
    s.close()
    return path


@pytest.fixture
def store(_built: Path, tmp_path: Path):
    copy = tmp_path / "kliqued.duckdb"
    shutil.copy(_built, copy)
    s = Store(str(copy))
    yield s
    s.close()


LEAKS = [
    "SELECT * FROM tokens",
    "SELECT * FROM main.tokens",
    'SELECT * FROM "tokens"',
    'SELECT * FROM "TOKENS"',
    "SELECT * FROM kliqued.main.tokens",
    "SELECT * FROM events",
    "SELECT data FROM main.events",
    "SELECT * FROM information_schema.tables",
    "SELECT table_name, column_name FROM information_schema.columns",
    "SELECT * FROM duckdb_tables()",
    "SELECT * FROM duckdb_views()",
    "SELECT * FROM duckdb_columns()",
    "SELECT * FROM duckdb_tables",
    "SELECT * FROM system.main.duckdb_tables()",
    "SELECT * FROM sqlite_master",
    "SELECT * FROM pg_catalog.pg_tables",
    "SELECT * FROM pg_catalog.pg_class",
    "SELECT * FROM pragma_table_info('tokens')",
    "SELECT * FROM pragma_storage_info('tokens')",
    "SELECT * FROM query('SELECT * FROM tokens')",
    "SELECT * FROM query_table('tokens')",
    "SELECT * FROM (DESCRIBE tokens)",
    "SELECT * FROM (SUMMARIZE events)",
    # CTE tricks: a CTE's body does not see itself, so these name the real table
    "WITH tokens AS (SELECT * FROM tokens) SELECT * FROM tokens",
    "WITH RECURSIVE tokens AS (SELECT * FROM tokens) SELECT * FROM tokens",
    "WITH x AS (SELECT 1) SELECT * FROM (WITH tokens AS (SELECT 1) SELECT * FROM tokens), tokens",
    "WITH a AS (SELECT hash FROM tokens) SELECT * FROM a",
    # subqueries anywhere
    "SELECT (SELECT hash FROM tokens LIMIT 1)",
    "SELECT * FROM ledger WHERE task IN (SELECT task FROM events)",
    "SELECT interval_id FROM ledger UNION ALL SELECT hash FROM tokens",
    "SELECT * FROM ledger, LATERAL (SELECT hash FROM tokens) t",
    "SELECT * FROM tokens AT (VERSION => 1)",
    # the daemon's internal tables
    "SELECT * FROM ledger_monthly",
    "SELECT * FROM ledger_monthly_pending",
    "SELECT * FROM temp.main.ledger",
    "SELECT * FROM duckdb_settings()",
    "SELECT * FROM duckdb_functions()",
    "SELECT * FROM glob('*')",
    "SELECT * FROM (SHOW TABLES)",
    "SELECT * FROM (SHOW ALL TABLES)",
    "SELECT * FROM (FROM duckdb_tables())",
    'SELECT * FROM "information_schema"."tables"',
    "SELECT * FROM unnest((SELECT list(hash) FROM tokens))",
    "SELECT json_execute_serialized_sql(json_serialize_sql('SELECT * FROM tokens'))",
    "SELECT * FROM json_execute_serialized_sql(json_serialize_sql('SELECT * FROM tokens'))",
    "SELECT * FROM read_json_auto('/etc/hostname')",
]


@pytest.mark.parametrize("sql", LEAKS)
def test_finance_reads_only_the_ledger(store, sql):
    with pytest.raises(LedgerSqlError) as err:
        run_readonly(store.conn.cursor(), sql)
    assert err.value.code == "not-allowed", err.value.message
    assert SECRET not in err.value.message and "private" not in err.value.message
    assert (
        "usage_monthly" in err.value.message
        or "not available" in err.value.message
        or "cannot be used" in err.value.message
    )


SIDE_EFFECTS = [
    "SELECT * FROM checkpoint()",
    "SELECT * FROM force_checkpoint()",
    "SELECT checkpoint()",
    "SELECT * FROM pragma_database_size()",
    "SELECT nextval('s')",
    "SELECT setseed(0.5)",
    "SELECT current_setting('memory_limit')",
    "SELECT getvariable('x')",
    "SELECT setval('s', 10)",
    "SELECT write_log('hello')",
    "SELECT sleep_ms(600000)",
]


@pytest.mark.parametrize("sql", SIDE_EFFECTS)
def test_no_function_with_a_side_effect(store, sql):
    store.conn.execute("CREATE SEQUENCE IF NOT EXISTS s")
    with pytest.raises(LedgerSqlError) as err:
        run_readonly(store.conn.cursor(), sql)
    assert err.value.code == "not-allowed"


def test_checkpoint_from_ledger_sql_does_not_checkpoint(store):
    """The finding: ``SELECT * FROM checkpoint()`` as finance folded the WAL into the file."""
    wal = store.path + ".wal"
    store.conn.execute(
        "INSERT INTO events SELECT i + 10, i, 'x', NULL, NULL, NULL, NULL, "
        "NULL, NULL FROM range(20000) t(i)"
    )
    before = os.path.getsize(wal)
    assert before > 0
    for sql in ("SELECT * FROM checkpoint()", "SELECT * FROM force_checkpoint()"):
        with pytest.raises(LedgerSqlError):
            run_readonly(store.conn.cursor(), sql)
    assert os.path.getsize(wal) == before


@pytest.mark.parametrize(
    "sql, code",
    [
        ("CHECKPOINT", "not-read-only"),
        ("FORCE CHECKPOINT", "not-read-only"),
        ("SET threads = 1", "not-read-only"),
        ("RESET threads", "not-read-only"),
        ("CALL checkpoint()", "not-read-only"),
        ("PRAGMA enable_profiling", "not-read-only"),
        ("COPY ledger TO 'x.csv'", "not-read-only"),
        ("ATTACH ':memory:' AS m", "not-read-only"),
        ("INSTALL httpfs", "not-read-only"),
        ("LOAD httpfs", "not-read-only"),
        ("EXPORT DATABASE 'dir'", "not-read-only"),
        ("DETACH kliqued", "not-read-only"),
        ("USE memory", "not-read-only"),
        ("VACUUM", "not-read-only"),
        ("SET VARIABLE x = 1", "not-read-only"),
        ("SELECT 1; CHECKPOINT", "multiple-statements"),
    ],
)
def test_statements_with_side_effects_are_refused(store, sql, code):
    with pytest.raises(LedgerSqlError) as err:
        run_readonly(store.conn.cursor(), sql)
    assert err.value.code == code


ALLOWED = [
    'SELECT "group", month, round(sum(gpu_hours), 1) AS gpu_hours, round(sum(cost), 2) AS cost '
    "FROM usage_monthly GROUP BY ALL ORDER BY ALL",
    "SELECT u.interval_id, u.gpu_type, u.start_at, p.per_gpu_hour, p.effective_from FROM usage "
    "u ASOF LEFT JOIN prices p ON u.gpu_type = p.gpu_type AND u.start_at >= p.effective_from",
    "WITH m AS (SELECT * FROM usage_by_month) SELECT count(*) FROM m",
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 3) SELECT * FROM r",
    "WITH ledger AS (SELECT 1 AS x) SELECT * FROM ledger",
    "SELECT * FROM main.ledger, kliqued.main.prices, kliqued.usage",
    "SELECT * FROM ledger l JOIN LATERAL (SELECT * FROM prices p "
    "WHERE p.gpu_type = l.gpu_type) x ON true",
    "SELECT * FROM ledger UNION ALL BY NAME SELECT * FROM ledger USING SAMPLE 10%",
    "SELECT list_transform([1, 2], lambda x: x + 1)",
    "SELECT * FROM range(3), generate_series(1, 2), unnest([1, 2])",
    "SELECT * FROM (VALUES (1), (2)) v(x)",
    "SELECT * FROM price_periods, usage_priced LIMIT 1",
    "SELECT count(*) FILTER (WHERE end_at IS NULL) FROM ledger",
]


@pytest.mark.parametrize("sql", ALLOWED)
def test_the_ledger_and_its_views_stay_readable(store, sql):
    run_readonly(store.conn.cursor(), sql)


def test_a_recursive_cte_sees_itself_only_in_its_recursive_part(store):
    with pytest.raises(LedgerSqlError) as err:
        run_readonly(
            store.conn.cursor(),
            "WITH RECURSIVE tokens AS (SELECT * FROM tokens "
            "UNION ALL SELECT * FROM tokens) SELECT * FROM tokens",
        )
    assert err.value.code == "not-allowed"


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT " + "(" * 600 + "1" + ")" * 600,
        "SELECT " + "-" * 900 + "1",
        "SELECT " + "[" * 400 + "1" + "]" * 400,
        "SELECT * FROM " + "(SELECT * " * 300 + "FROM ledger" + ")" * 300,
    ],
)
def test_deep_nesting_is_a_clear_error(store, sql):
    """Python's JSON decoder and walks stop at about 1,000 levels; DuckDB's parser allows
    1,000 levels of expression, whose JSON tree is deeper: a clear 400, never a 500."""
    try:
        run_readonly(store.conn.cursor(), sql)
    except LedgerSqlError as err:
        assert err.code in ("sql-error", "not-allowed") and err.message


@pytest.mark.parametrize("name", ["kliqued-ledger.duckdb", "my ledger.duckdb", 'q"uote.duckdb'])
def test_a_database_file_whose_name_needs_quotes_keeps_its_ledger_readable(tmp_path, name):
    """DuckDB names the database after the file and quotes it in the plan
    (``"kliqued-ledger".main.ledger``): the default --ledger-db of a PostgreSQL log."""
    s = Store(str(tmp_path / name))
    try:
        s.ensure_schema()
        assert run_readonly(s.conn.cursor(), "SELECT count(*) FROM ledger").rows == [[0]]
        with pytest.raises(LedgerSqlError) as err:
            run_readonly(s.conn.cursor(), "SELECT * FROM tokens")
        assert err.value.code == "not-allowed"
    finally:
        s.close()
