"""PostgreSQL's own failover, the way Patroni performs it (issue 18; docs/ha.md): the primary
dies, its synchronous streaming replica is promoted, and ``kliqued serve`` given both hosts
in one libpq URL (``target_session_attrs=read-write``) carries on against the promoted one,
after at most one restart by its supervisor, with every acknowledged submission there.

Patroni itself is not run here (it needs etcd and a Patroni per node); what it does to the
database is: the primary's processes are killed with SIGKILL, and the replica is promoted
with ``pg_promote()``, the call Patroni makes. Real PostgreSQL 15 processes, started by pid;
skipped, saying why, where PostgreSQL is not installed."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest

from tests.harness.daemon import Server
from tests.harness.postgres import SUPERUSER, Postgres, unavailable
from tests.harness.typed import present
from tests.harness.wait import wait_for

CMD = {"command": ["true"]}


def both(primary: Postgres, replica: Postgres, db: str) -> str:
    """One URL naming both servers, the replica first: libpq tries them in order and keeps
    the one that takes writes, as a client of a Patroni cluster is configured."""
    return (
        f"postgresql://{SUPERUSER}@/{db}?host={replica.dir},{primary.dir}"
        f"&port={replica.port},{primary.port}&target_session_attrs=read-write"
    )


def test_the_daemon_carries_on_after_its_databases_replica_is_promoted(tmp_path: Path) -> None:
    why = unavailable()
    if why:
        pytest.skip(why)
    primary = Postgres(durable=True).start()  # durable: synchronous_commit as in production
    replica: Postgres | None = None
    s: Server | None = None
    try:
        primary.createdb("klique")
        replica = primary.replica()
        with psycopg.connect(primary.url("postgres"), autocommit=True) as conn:
            # Patroni's synchronous_mode: a commit is acknowledged once the replica has it
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
            conn.execute("SELECT pg_reload_conf()")
        wait_for(lambda: _sync_replicas(primary) == 1, 20, "the replica to be synchronous")

        s = Server(tmp_path, db=both(primary, replica, "klique")).start()
        bob = s.token({"user": "bob"})
        acked = [
            s.ok(
                "POST", "/v1/tasks", {"resource": "team-a/one", **CMD, "labels": {"n": str(i)}}, bob
            )["id"]
            for i in range(10)
        ]
        with psycopg.connect(replica.url("postgres"), autocommit=True) as conn:
            assert present(conn.execute("SELECT pg_is_in_recovery()").fetchone())[0]  # not written

        assert primary.proc is not None
        primary.proc.kill()  # the primary's machine is gone
        primary.proc.wait(10)
        with psycopg.connect(replica.url("postgres"), autocommit=True) as conn:
            assert present(conn.execute("SELECT pg_promote(wait => true)").fetchone())[0]

        # the daemon's next write finds its connection gone: it either carries on on the
        # promoted server or exits 1 for its supervisor, which starts it again
        restarts = 0
        late: str | None = None
        deadline = time.monotonic() + 60
        while late is None and time.monotonic() < deadline:
            assert s.proc is not None
            if s.proc.poll() is not None:
                assert s.proc.returncode == 1, s.log()
                assert restarts == 0, f"exited twice:\n{s.log()}"
                restarts += 1
                s.start(timeout=60)
                continue
            try:
                status, body = s.call(
                    "POST",
                    "/v1/tasks",
                    {"resource": "team-a/one", **CMD, "labels": {"n": "late"}},
                    bob,
                    timeout=10,
                )
            except OSError:  # the daemon stopping under the request
                status, body = 0, {}
            if status == 201:
                late = body["id"]
            else:
                time.sleep(0.5)
        assert late is not None, s.log()

        tasks = {t["id"]: t for t in s.ok("GET", "/v1/tasks?limit=100", token=bob)["tasks"]}
        assert set(acked) <= set(tasks), "an acknowledged submission was lost"
        assert sorted(t["labels"]["n"] for t in tasks.values()) == sorted(
            [str(i) for i in range(10)] + ["late"]
        )  # and none twice
        with psycopg.connect(replica.url("klique"), autocommit=True) as conn:
            assert not present(conn.execute("SELECT pg_is_in_recovery()").fetchone())[0]
            logged = present(
                conn.execute(
                    "SELECT count(DISTINCT task) FROM events WHERE kind = 'submitted'"
                ).fetchone()
            )[0]
        assert logged == len(acked) + 1
        assert s.stop() == 0
        assert "Traceback" not in s.log()
    finally:
        if s is not None and s.proc is not None and s.proc.poll() is None:
            s.stop()
        if replica is not None:
            replica.stop()
        primary.stop()


def _sync_replicas(primary: Postgres) -> int:
    with psycopg.connect(primary.url("postgres"), autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'"
        ).fetchone()
    return int(row[0]) if row else 0
