"""The local DuckDB file follows PostgreSQL off the sequencer's path (kliqued/daemon/storage/store.py,
docs/ha.md), against real servers: after ``kill -9`` under load, with the file's thread held
back so that the file has lost its last batches, the restarted daemon's file equals
PostgreSQL again (the events' copy, every ledger table, the history of evicted tasks); and a
read of the file right after a write sees it (the audit log of a task just submitted, a
statement with an interval just closed)."""

from __future__ import annotations

import time
from decimal import Decimal
from pathlib import Path

import duckdb
import psycopg
import pytest

from kliqued.daemon.storage.pglog import PgLog
from kliqued.daemon.storage.store import FOLLOW_DELAY_ENV
from tests.daemon.test_durability import CMD, all_tasks, killed_under_load, settled
from tests.daemon.test_pg_ledger import norm
from tests.harness.daemon import Server
from tests.harness.typed import present
from tests.harness.wait import wait_for

FLAGS = ["--keep-ended", "0", "--snapshot-every", "25"]
"""Every ended task evicted at once (its history row written by the file thread), and
snapshots often, so that both happen in the window the kill loses."""


def pg_last(url: str) -> int:
    with psycopg.connect(url) as conn:
        return int(present(conn.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone())[0])


def file_rows(path: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(path), read_only=True) as conn:
        return sorted(tuple(norm(v) for v in r) for r in conn.execute(sql).fetchall())


def pg_rows(url: str, sql: str) -> list[tuple]:
    with psycopg.connect(url) as conn:
        return sorted(tuple(norm(v) for v in r) for r in conn.execute(sql).fetchall())


EVENTS = "SELECT seq, at_ms, kind, task, actor, revision, grp, usr, CAST(data AS {t}) FROM events"


def test_after_kill_9_the_restarted_daemons_file_equals_postgresql(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FOLLOW_DELAY_ENV, "1")  # the file lags PostgreSQL by ~1 s
    s = Server(tmp_path, db=pg_url, extra=FLAGS)
    # submissions with keys, a fifth cancelled (intervals close), then SIGKILL
    load, _ = killed_under_load(s, 60, timeout=90)
    # the kill landed while the file was behind: it lost its last batches
    copied = file_rows(s.local_db, "SELECT coalesce(max(seq), 0) FROM events")
    logged = pg_last(pg_url)
    assert int(copied[0][0]) < logged, (copied, logged)
    lost = file_rows(s.local_db, "SELECT count(*) FROM ledger")
    # tasks cancelled (then evicted: --keep-ended 0) in the lost window have no history row
    kept = len(file_rows(s.local_db, "SELECT id FROM task_history"))
    cancelled = pg_rows(pg_url, "SELECT count(DISTINCT task) FROM events WHERE kind = 'cancelled'")
    assert kept < int(cancelled[0][0]), (kept, cancelled)
    monkeypatch.delenv(FOLLOW_DELAY_ENV)
    s.start()
    for key, tid in load.acked.items():  # every acknowledged task, from memory or history
        assert s.ok("GET", f"/v1/tasks/{tid}")["labels"]["key"] == key
    settled(s)
    # intervals closed after the restart are numbered in the feed as PostgreSQL numbers them
    placed = [t["id"] for t in all_tasks(s) if t["state"] == "placed"][:3]
    assert placed, "no placed task left to close"
    for tid in placed:
        s.ok("POST", f"/v1/tasks/{tid}/cancel")
    settled(s)
    ended = {t["id"] for t in all_tasks(s) if t["state"] == "ended"}
    assert len(ended) > 5, "no task ended: the history is not exercised"
    assert s.stop() == 0
    assert "were missing from" in s.log()  # the restart copied what the file lost
    # the events' copy
    assert file_rows(s.local_db, EVENTS.format(t="VARCHAR")) == pg_rows(
        pg_url, EVENTS.format(t="TEXT")
    )
    # every table of the ledger, the feed's numbering included
    for table in PgLog.SEED_TABLES:
        assert file_rows(s.local_db, f"SELECT * FROM {table}") == pg_rows(
            pg_url, f"SELECT * FROM {table}"
        ), table
    assert file_rows(s.local_db, "SELECT * FROM ledger_behind") == []
    assert int(lost[0][0]) < len(file_rows(s.local_db, "SELECT * FROM ledger"))
    # the history: each evicted (every ended) task once, the lost window's included
    rows = file_rows(s.local_db, "SELECT id, count(*) FROM task_history GROUP BY id")
    assert {r[0] for r in rows} == ended and all(r[1] == "1" for r in rows), rows


def test_a_read_of_the_file_right_after_a_write_sees_it(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file thread held back 0.5 s: the audit log of a task just submitted has its
    submission, and a statement asked for just after a cancel has its closed interval."""
    monkeypatch.setenv(FOLLOW_DELAY_ENV, "0.5")
    s = Server(tmp_path, db=pg_url).start()
    bob = s.token({"user": "bob"})
    tid = s.ok("POST", "/v1/tasks", {"resource": "team-a/one", **CMD}, bob)["id"]
    events = s.ok("GET", f"/v1/events?task={tid}")["events"]
    assert [e["kind"] for e in events][:1] == ["submitted"], events
    wait_for(lambda: s.ok("GET", f"/v1/tasks/{tid}")["state"] == "placed")
    time.sleep(0.3)  # placed a measurable while: the charge runs on the subprocess's clock
    s.ok("POST", f"/v1/tasks/{tid}/cancel", token=bob)
    month = time.strftime("%Y-%m", time.gmtime())
    st = s.ok("GET", f"/v1/ledger/statement?group=team-a&period={month}")
    task = s.ok("GET", f"/v1/tasks/{tid}")
    assert task["state"] == "ended"
    assert Decimal(st["gpu_hours"]) > 0, st
    assert Decimal(st["gpu_hours"]) == Decimal(str(task["gpu_hours"])).quantize(
        Decimal("0.000001")
    ), (st, task)
    assert s.stop() == 0
