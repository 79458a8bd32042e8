"""Finance's SQL on PostgreSQL under memory and disk bombs (issue 25, item 5, the PostgreSQL
path): against a real PostgreSQL (tests/harness/postgres.py; skipped, saying why, where none
is installed) and a real ``kliqued serve --db postgresql://...``.

The database is given a generous ``work_mem`` of 2 GB (a server tuned for analytics): the
finance role's own bounds (``kliqued.ledger.pgsql.ROLE_LIMITS``) must hold anyway. Memory is
measured on the server's processes that ran the queries (the backends of the finance
connections, by their pids in ``pg_stat_activity``): their peak resident size."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest

from kliqued.daemon.storage import pgreader
from kliqued.ledger import sandbox
from kliqued.ledger.pgsql import ROLE_LIMITS, TEMP_FILE_LIMIT, WORK_MEM, run_readonly
from kliqued.ledger.sql import LedgerSqlError
from tests.harness.daemon import Server

BOMBS = [
    # test_sql_limits.BOMBS in PostgreSQL's words; issue 25's first
    "SELECT length(string_agg(repeat('x', 1000000), ',')) FROM generate_series(1, 3000)",
    "SELECT length(string_agg(repeat('x', 100000), ',')) FROM generate_series(1, 40000)",
    "SELECT max(cardinality(x)) FROM (SELECT array_agg(g) AS x "
    "FROM generate_series(1, 300000000) g) s",
    "SELECT count(*) FROM generate_series(1, 100000000) a, generate_series(1, 100000000) b",
    # test_sql_growth.BOMBS: one call that sizes its value
    "SELECT length(repeat(repeat('x', 1000000), 3000))",
    "SELECT length(lpad('x', 2000000000, 'y'))",
    # a hash table as large as work_mem lets it be
    "SELECT count(*) FROM (SELECT g % 50000000 AS k, count(*) FROM "
    "generate_series(1, 100000000) g GROUP BY 1) s",
]
TEMP_BOMB = (
    "SELECT count(*) FROM (SELECT repeat('x', 8000) || g AS r "
    "FROM generate_series(1, 10000000) g ORDER BY 1) s"
)
"""A sort of 80 GB: spills to disk, far past any temp_file_limit."""

PEAK_MB = 1536
"""A bomb's backend may reach PostgreSQL's 1 GB cap on one value (string_agg), not more."""


@pytest.fixture(scope="module")
def pg_daemon(postgres, tmp_path_factory):
    url = postgres.createdb("pg_sql_limits")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER DATABASE pg_sql_limits SET work_mem = '2GB'")
        conn.execute("ALTER DATABASE pg_sql_limits SET hash_mem_multiplier = 2")
    s = Server(tmp_path_factory.mktemp("pg-sql-limits"), db=url).start()
    try:
        yield s, s.token("role:finance"), url
    finally:
        assert s.stop() == 0, s.log()


def _sql(s: Server, token: str, text: str, **more) -> tuple[int, dict]:
    return s.call("POST", "/v1/ledger/sql", {"sql": text, **more}, token)


def _peak_mb(url: str) -> int:
    """The largest peak resident size (VmHWM) of the backends finance's queries ran on."""
    with psycopg.connect(url, autocommit=True) as conn:
        pids = [
            r[0]
            for r in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = 'kliqued-ledger-sql'"
            )
        ]
    peak = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]) // 1024)
        except OSError:  # ended meanwhile
            pass
    return peak


def test_the_finance_role_carries_the_bounds(pg_daemon):
    s, finance, url = pg_daemon
    body = s.ok(
        "POST",
        "/v1/ledger/sql",
        {
            "sql": "SELECT current_setting('work_mem'), "
            "current_setting('hash_mem_multiplier'), current_setting('temp_file_limit')"
        },
        finance,
    )
    assert body["rows"] == [[WORK_MEM, "1", TEMP_FILE_LIMIT]], body
    with psycopg.connect(url, autocommit=True) as conn:
        (config,) = conn.execute(
            "SELECT s.setconfig FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = "
            "s.setrole WHERE r.rolname = 'klique_finance' AND s.setdatabase = 0"
        ).fetchone()
    for name, value in ROLE_LIMITS:
        assert f"{name}={value}" in config, config


@pytest.mark.parametrize("sql", BOMBS)
def test_memory_bombs_are_stopped_within_the_deadline(pg_daemon, sql):
    """Each bomb is refused (too-large: PostgreSQL's limit on a value or a query's memory;
    or timeout) within its 2 s deadline and a grace, with a message that says what to do;
    the backend that ran it stays under PEAK_MB; the next query answers at once."""
    s, finance, url = pg_daemon
    t = time.monotonic()
    status, body = _sql(s, finance, sql, timeout_s=2)
    elapsed = time.monotonic() - t
    assert (status, body["error"]["code"]) in {(413, "too-large"), (422, "timeout")}, body
    message = body["error"]["message"]
    assert "Traceback" not in message
    assert status == 422 or "aggregate earlier" in message, body
    assert elapsed < 2 + 3, (elapsed, body)
    assert _peak_mb(url) < PEAK_MB, body
    t = time.monotonic()
    assert s.ok("POST", "/v1/ledger/sql", {"sql": "SELECT 1 AS one"}, finance)["rows"] == [[1]]
    assert time.monotonic() - t < 2.0


def _ledger_tables(conn: psycopg.Connection) -> None:
    """Empty stand-ins for what ``grant`` names (it only grants on them)."""
    for name in (*sandbox.RELATIONS, *pgreader.FEED):
        conn.execute(f'CREATE TABLE "{name}" (x int)')


def _drop(admin_url: str, db: str, *roles: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db}"')
        for role in roles:
            conn.execute(f'DROP OWNED BY "{role}"')
            conn.execute(f'DROP ROLE "{role}"')


def test_a_huge_sort_is_stopped_by_temp_file_limit(postgres):
    """A sort far larger than work_mem spills to disk, and the spill stops at the role's
    temp_file_limit with a 413 naming it, well before the deadline. (The daemon's limit is
    1 GB, which this disk may take longer than the 10 s maximum deadline to write: here the
    role gets 64 MB through the same ``grant``; test_the_finance_role_carries_the_bounds
    checks the daemon's.)"""
    admin_url = postgres.url("postgres")
    url = postgres.createdb("pg_temp_bomb")
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            _ledger_tables(conn)
            limits = tuple((n, "64MB" if n == "temp_file_limit" else v) for n, v in ROLE_LIMITS)
            assert pgreader.grant(conn, "kd_temp_finance", limits) is None
        readers = pgreader.Readers(url, "kd_temp_finance")
        try:
            t = time.monotonic()
            with pytest.raises(LedgerSqlError) as err:
                run_readonly(readers.open(), TEMP_BOMB, timeout_s=10)
            elapsed = time.monotonic() - t
            assert err.value.code == "too-large", err.value.message
            assert "temp_file_limit" in err.value.message, err.value.message
            assert elapsed < 8, elapsed
            assert run_readonly(readers.open(), "SELECT 1").rows == [[1]]
        finally:
            readers.close()
    finally:
        _drop(admin_url, "pg_temp_bomb", "kd_temp_finance")


def test_a_daemon_that_is_no_superuser_says_what_to_run(postgres):
    """kliqued's role with CREATEROLE, no superuser: the memory settings are set on the
    finance role, temp_file_limit cannot be, and the warning gives the administrator's
    command."""
    admin_url = postgres.url("postgres")
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute("CREATE ROLE kd_plain LOGIN CREATEROLE")
        conn.execute("CREATE DATABASE kd_plain OWNER kd_plain")
    try:
        with psycopg.connect(postgres.url("kd_plain", user="kd_plain"), autocommit=True) as conn:
            _ledger_tables(conn)
            warning = pgreader.grant(conn, "kd_plain_finance")
        assert warning is not None
        assert (
            "ALTER ROLE \"kd_plain_finance\" SET temp_file_limit = '1GB'" in warning
            and "superuser" in warning
            and "docs/ha.md" in warning
        ), warning
        with psycopg.connect(admin_url, autocommit=True) as conn:
            (config,) = conn.execute(
                "SELECT s.setconfig FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = "
                "s.setrole WHERE r.rolname = 'kd_plain_finance'"
            ).fetchone()
        assert f"work_mem={WORK_MEM}" in config and "temp_file_limit=1GB" not in config
    finally:
        _drop(admin_url, "kd_plain", "kd_plain_finance", "kd_plain")
