"""``kliqued serve --db postgresql://...`` end to end, against a real PostgreSQL 15 (skipped,
saying why, where none is installed): the log and tokens are in PostgreSQL, the ledger and
the audit reads' copy in the --ledger-db file; finance's SQL still reaches only the ledger;
a database that cannot be used is a clear error at start."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import psycopg
import pytest

from tests.harness.daemon import ROOT, SMALL_ESTATE, Server
from tests.harness.typed import present

CMD = {"command": ["true"]}


def test_tasks_and_tokens_live_in_postgresql_and_survive_a_restart(
    tmp_path: Path, pg_url: str
) -> None:
    s = Server(tmp_path, db=pg_url).start()
    try:
        bob = s.token({"user": "bob"})
        gone = s.ok("POST", "/v1/tokens", {"user": "erin"}, expect=201)
        s.ok("DELETE", f"/v1/tokens/{gone['id']}", expect=204)
        tid = s.ok("POST", "/v1/tasks", {"resource": "team-a/one", **CMD}, bob)["id"]
        with psycopg.connect(pg_url) as conn:
            kinds = [k for (k,) in conn.execute("SELECT kind FROM events ORDER BY seq")]
            tokens = conn.execute("SELECT count(*), count(revoked_at_ms) FROM tokens").fetchone()
        assert "submitted" in kinds and "token_created" in kinds and "token_revoked" in kinds
        assert tokens == (3, 1)  # the admin's, bob's, erin's revoked
        assert (tmp_path / "kliqued-ledger.duckdb.token-key").exists()  # beside the file
        assert s.stop() == 0
        s.start()
        assert s.ok("GET", f"/v1/tasks/{tid}", token=bob)["id"] == tid
        assert s.call("GET", "/v1/whoami", token=gone["token"])[0] == 401
        assert "replayed" in s.log() and "postgresql://klique@" in s.log()
        # the audit reads run on the local copy, which has every event
        events = s.ok("GET", "/v1/events?limit=1000")["events"]
        with psycopg.connect(pg_url) as conn:
            # The engine may commit an event after the read: count up to what was read.
            last = max(e["seq"] for e in events)
            assert (
                len(events)
                == present(
                    conn.execute("SELECT count(*) FROM events WHERE seq <= %s", (last,)).fetchone()
                )[0]
            )
    finally:
        s.stop()


@pytest.mark.parametrize(
    "sql", ["SELECT * FROM tokens", "SELECT data FROM events", "SELECT * FROM klique_schema"]
)
def test_finance_sql_reaches_only_the_ledger_on_postgresql(
    tmp_path: Path, pg_url: str, sql: str
) -> None:
    s = Server(tmp_path, db=pg_url).start()
    try:
        finance = s.token("role:finance")
        assert s.ok("POST", "/v1/ledger/sql", {"sql": "SELECT count(*) FROM ledger"}, finance)[
            "rows"
        ] == [[0]]
        status, body = s.call("POST", "/v1/ledger/sql", {"sql": sql}, finance)
        assert status in (400, 403), body
        assert "token" not in str(body.get("rows", "")) and "hash" not in str(body)
    finally:
        s.stop()
    with duckdb.connect(str(tmp_path / "kliqued-ledger.duckdb"), read_only=True) as conn:
        assert present(conn.execute("SELECT count(*) FROM tokens").fetchone())[0] == 0


def serve(db: str, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "kliqued.cli",
            "serve",
            "--db",
            db,
            "--ledger-db",
            str(tmp_path / "l.duckdb"),
            "--estate",
            str(SMALL_ESTATE),
            "--listen",
            "127.0.0.1:0",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_an_unreachable_database_is_a_clear_error_at_start(tmp_path: Path) -> None:
    p = serve("postgresql://kliqued:s3cret@/klique?host=/nonexistent-dir&port=1", tmp_path)
    assert p.returncode == 1, p.stderr
    assert "kliqued serve: error: cannot connect to postgresql://kliqued@" in p.stderr
    assert "Traceback" not in p.stderr and "s3cret" not in p.stderr


def test_a_database_migrated_by_a_newer_kliqued_is_refused(tmp_path: Path, pg_url: str) -> None:
    with psycopg.connect(pg_url) as conn:
        conn.execute(
            "CREATE TABLE klique_schema (version INT PRIMARY KEY, name TEXT NOT NULL, "
            "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        conn.execute("INSERT INTO klique_schema (version, name) VALUES (999, 'future')")
    p = serve(pg_url, tmp_path)
    assert p.returncode == 1, p.stderr
    assert "schema version 999, newer than this kliqued knows" in p.stderr
    assert "Traceback" not in p.stderr


def test_a_second_daemon_on_the_same_database_stands_by_and_takes_over(
    tmp_path: Path, pg_url: str
) -> None:
    """Another machine on the same database (its own ledger file, the token key copied
    there: the key is never in the database) stands by, and takes over when the first is
    killed (-9: its lease is not released, so after the lease's TTL)."""
    s = Server(tmp_path, db=pg_url).start()
    other = Server(tmp_path / "two", db=pg_url)
    try:
        other.tmp.mkdir()
        shutil.copy(
            tmp_path / "kliqued-ledger.duckdb.token-key",
            other.tmp / "kliqued-ledger.duckdb.token-key",
        )
        other.extra = ["--lease-ttl", "1s"]
        other.start(wait="standby")
        assert other.ok("GET", "/v1/health", token=None)["leader"]["url"] == s.url
    finally:
        s.kill()
    other.wait_ready(20)
    assert "events logged in postgresql://" in other.log()  # its copy filled from the log
    assert other.ok("GET", "/v1/whoami")["principal"] == "role:admin"
    assert other.stop() == 0


def test_losing_postgresql_refuses_writes_and_keeps_serving(tmp_path: Path) -> None:
    """PostgreSQL goes away under a running daemon (a restart, a failover): the write gets a
    503 naming the store, and the daemon stays up, degraded, rather than exiting (issue 26:
    exiting made a routine database restart a control-plane outage). Its reconnection and
    that nothing acknowledged is lost: tests/daemon/test_store_faults.py."""
    from tests.harness.postgres import Postgres, unavailable

    if unavailable():
        pytest.skip(present(unavailable()))
    pg = Postgres().start()
    try:
        s = Server(tmp_path, db=pg.createdb("lost")).start()
        bob = s.token({"user": "bob"})
        pg.stop()
        status, body = s.call("POST", "/v1/tasks", {"resource": "team-a/one", **CMD}, bob)
        assert (status, body["error"]["code"]) == (503, "store-unavailable")
        assert s.ok("GET", "/v1/health", token=None)["status"] == "degraded"
        assert s.proc is not None and s.proc.poll() is None  # still serving
        assert "Traceback" not in s.log()
        s.kill()
    finally:
        pg.stop()


def test_a_role_that_may_not_create_the_schema_is_a_clear_error(
    tmp_path: Path, pg_url: str, postgres
) -> None:
    """PostgreSQL 15 lets no role but the owner create in ``public``: a database made by an
    administrator for another owner, with kliqued given a login of its own."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS reader")
        conn.execute("CREATE ROLE reader LOGIN")
    url = pg_url.replace("postgresql://klique@", "postgresql://reader@")
    p = serve(url, tmp_path)
    assert p.returncode == 1, p.stderr
    assert "cannot bring the schema of postgresql://reader@" in p.stderr
    assert (
        "the version table klique_schema: permission denied for schema public "
        "(kliqued's role must be able to create tables" in p.stderr
    )
    assert "Traceback" not in p.stderr
