"""Finance's SQL on PostgreSQL (kliqued/ledger/pgsql.py, kliqued/daemon/storage/pgreader.py), end to
end against a real PostgreSQL 15 and a streaming replica of it (skipped, saying why, where
none is installed): it runs as the read-only role, reads the ledger's relations only, stops
at its deadline with a 422, keeps the row and byte caps, and runs on the replica when
``--ledger-replica`` names one."""

from __future__ import annotations

import threading
from pathlib import Path

import psycopg
import pytest

from tests.harness.daemon import Server
from tests.harness.typed import present
from tests.harness.wait import wait_for

CMD = {"command": ["true"]}


@pytest.fixture(scope="module")
def replica(postgres):
    """A streaming replica of the session's PostgreSQL (pg_basebackup -R, by pid)."""
    standby = postgres.replica()
    try:
        yield standby
    finally:
        standby.stop()


def sql(s: Server, token: str, text: str, **more) -> tuple[int, dict]:
    return s.call("POST", "/v1/ledger/sql", {"sql": text, **more}, token)


def test_finance_sql_runs_in_postgresql_as_the_read_only_role(tmp_path: Path, pg_url: str) -> None:
    s = Server(tmp_path, db=pg_url).start()
    try:
        finance = s.token("role:finance")
        bob = s.token({"user": "bob"})
        s.ok("POST", "/v1/tasks", {"resource": "team-a/one", **CMD}, bob)
        wait_for(
            lambda: sql(s, finance, "SELECT count(*) FROM ledger")[1]["rows"] == [[1]],
            20,
            "the placement in PostgreSQL's ledger",
        )
        body = s.ok(
            "POST",
            "/v1/ledger/sql",
            {
                "sql": "SELECT current_user, "
                "current_setting('transaction_read_only'), \"user\", gpus FROM usage"
            },
            finance,
        )
        assert body["rows"] == [["klique_finance", "on", "bob", "1.000"]]
        assert body["types"][3].startswith("numeric")
        for text in (
            "SELECT * FROM tokens",
            "SELECT data FROM events",
            "SELECT * FROM klique_schema",
            "SELECT * FROM ledger_monthly",
            "WITH t AS (SELECT * FROM tokens) SELECT * FROM t",
        ):
            status, err = sql(s, finance, text)
            assert (status, err["error"]["code"]) == (400, "not-allowed"), (text, err)
            assert "permission denied" in err["error"]["message"]
            assert "ledger SQL may read only ledger, prices" in err["error"]["message"]
        for text in (
            "DELETE FROM ledger",
            "INSERT INTO prices VALUES ('x', 1, 'EUR', now())",
            "WITH d AS (DELETE FROM ledger RETURNING 1) SELECT * FROM d",
        ):
            status, err = sql(s, finance, text)
            assert (status, err["error"]["code"]) == (400, "not-read-only"), (text, err)
            assert "only SELECT queries may run on the ledger" in err["error"]["message"]
        # a setting changed by a query ends with its transaction (always rolled back)
        for _ in range(3):  # whichever of the pool's connections answers
            s.ok(
                "POST",
                "/v1/ledger/sql",
                {"sql": "SELECT set_config('default_transaction_read_only', 'off', false)"},
                finance,
            )
            assert s.ok(
                "POST",
                "/v1/ledger/sql",
                {"sql": "SELECT current_setting('default_transaction_read_only')"},
                finance,
            )["rows"] == [["on"]]
        status, err = sql(s, finance, "SELECT 1; SELECT * FROM tokens")
        assert (status, err["error"]["code"]) == (400, "multiple-statements"), err
        status, err = sql(s, finance, "SELEC 1")
        assert (status, err["error"]["code"]) == (400, "sql-error"), err
        assert "syntax error" in err["error"]["message"]
        with psycopg.connect(pg_url) as conn:  # nothing was changed
            assert conn.execute("SELECT count(*) FROM ledger").fetchone() == (1,)
            assert conn.execute("SELECT count(*) FROM prices WHERE gpu_type = 'x'").fetchone() == (
                0,
            )
    finally:
        s.stop()


def test_exports_and_feed_read_postgresqls_ledger(tmp_path: Path, pg_url: str) -> None:
    s = Server(tmp_path, db=pg_url).start()
    try:
        finance = s.token("role:finance")
        with psycopg.connect(pg_url) as conn:  # a row only PostgreSQL's ledger has
            conn.execute("""INSERT INTO ledger VALUES ('T-x#1', 'T-x', 'zed', NULL, 'team-a',
                'team-a', 'one', 'team-a/one', 'pool-1', 'h100-80gb', 1.5, 1, TIMESTAMP
                '2026-03-01 10:00:00', TIMESTAMP '2026-03-01 12:00:00', 'finished', 'r',
                'team-a', 'cli')""")
            # closed as the writer closes: numbered in the feed, pending for the aggregate
            conn.execute("INSERT INTO ledger_feed VALUES (nextval('ledger_feed_seq'), 'T-x#1')")
            conn.execute("INSERT INTO ledger_monthly_pending SELECT * FROM ledger")
        status, text = s.call(
            "GET",
            "/v1/ledger/export?from=2026-03-01T00:00:00Z&to=2026-03-02T00:00:00Z",
            token=finance,
        )
        assert status == 200, text
        lines = text.splitlines()
        assert len(lines) == 2 and lines[0].startswith("interval_id,task,user")
        # 2 hours of 1.5 GPUs at weight 1, priced 2.5 EUR a GPU-hour
        assert lines[1] == (
            "T-x#1,T-x,zed,,team-a,team-a,,,team-a,one,team-a/one,pool-1,"
            "h100-80gb,1.500,1.000,2026-03-01T10:00:00.000Z,"
            "2026-03-01T12:00:00.000Z,finished,r,2.000000,3.000000,2.000000,"
            "2.500000,EUR,7.500000,cli"
        )
        status, text = s.call("GET", "/v1/ledger/focus?period=2026-03", token=finance)
        assert status == 200, text
        lines = text.splitlines()
        assert len(lines) == 2 and lines[1].startswith("7.500000,team-a,team-a,"), lines
        with psycopg.connect(pg_url) as conn:  # usage without a price: refused, named
            conn.execute("""INSERT INTO ledger VALUES ('T-y#1', 'T-y', 'zed', NULL, 'team-a',
                'team-a', 'one', 'team-a/one', 'pool-1', 'a100', 1, 1, TIMESTAMP
                '2026-03-02 10:00:00', TIMESTAMP '2026-03-02 12:00:00', 'finished', 'r',
                'team-a', 'cli')""")
        status, err = s.call("GET", "/v1/ledger/focus?period=2026-03", token=finance)
        assert (status, err["error"]["code"]) == (422, "no-price"), err
        assert "no price for GPU type a100 in 2026-03" in err["error"]["message"], err
        pulled = s.ok("GET", "/v1/ledger/feed", token=finance)
        assert [r["interval_id"] for r in pulled["rows"]] == ["T-x#1"], pulled
    finally:
        s.stop()


def test_a_heavy_query_is_stopped_at_its_deadline_with_a_clear_422(
    tmp_path: Path, pg_url: str
) -> None:
    s = Server(tmp_path, db=pg_url).start()
    try:
        finance = s.token("role:finance")
        heavy = "SELECT count(*) FROM generate_series(1, 100000000000) a"
        status, err = sql(s, finance, heavy, timeout_s=1)
        assert (status, err["error"]["code"]) == (422, "timeout"), err
        assert "ran longer than 1 s and was stopped" in err["error"]["message"]
        # the caps of the DuckDB ledger hold here too
        body = s.ok(
            "POST",
            "/v1/ledger/sql",
            {"sql": "SELECT g FROM generate_series(1, 50) g", "limit": 7},
            finance,
        )
        assert body["truncated"] is True and [r[0] for r in body["rows"]] == list(range(1, 8))
        status, err = sql(s, finance, "SELECT repeat('x', 10000) FROM generate_series(1, 5000)")
        assert (status, err["error"]["code"]) == (413, "too-large"), err
        # the connection is usable again after each of those
        assert s.ok("POST", "/v1/ledger/sql", {"sql": "SELECT 1"}, finance)["rows"] == [[1]]
        # a connection lost during a query (the server restarted, a replica failed over) is
        # a 503 naming the cause; the next query connects again
        out: dict = {}
        t = threading.Thread(
            target=lambda: out.update(r=sql(s, finance, "SELECT pg_sleep(5)", timeout_s=9))
        )
        t.start()

        def kill() -> bool:
            with psycopg.connect(pg_url, autocommit=True) as conn:
                return bool(
                    present(
                        conn.execute(
                            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE "
                            "application_name = 'kliqued-ledger-sql' AND state = 'active'"
                        ).fetchone()
                    )[0]
                )

        wait_for(kill, 10, "the finance query running")
        t.join(15)
        status, err = out["r"]
        assert (status, err["error"]["code"]) == (503, "unavailable"), err
        for _ in range(3):  # whichever of the pool's connections answers
            assert s.ok("POST", "/v1/ledger/sql", {"sql": "SELECT 2"}, finance)["rows"] == [[2]]
    finally:
        s.stop()


def test_finance_sql_runs_on_the_replica_when_one_is_given(
    tmp_path: Path, postgres, replica, pg_url: str
) -> None:
    name = psycopg.conninfo.conninfo_to_dict(pg_url)["dbname"]
    replica.wait_replayed(postgres)  # the new database is on the replica
    s = Server(tmp_path, db=pg_url)
    s.extra = ["--ledger-replica", replica.url(name)]
    s.start()
    try:
        finance = s.token("role:finance")
        bob = s.token({"user": "bob"})
        replica.wait_replayed(postgres)  # the role and its grants made at start
        body = s.ok(
            "POST", "/v1/ledger/sql", {"sql": "SELECT pg_is_in_recovery(), current_user"}, finance
        )
        assert body["rows"] == [[True, "klique_finance"]]
        s.ok("POST", "/v1/tasks", {"resource": "team-a/one", **CMD}, bob)
        wait_for(
            lambda: sql(s, finance, 'SELECT "user" FROM ledger')[1].get("rows") == [["bob"]],
            20,
            "the placement streamed to the replica's ledger",
        )
        status, err = sql(s, finance, "SELECT * FROM tokens")
        assert (status, err["error"]["code"]) == (400, "not-allowed"), err
    finally:
        s.stop()
