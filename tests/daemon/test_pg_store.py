"""The PostgreSQL event log (kliqued/daemon/storage/pglog.py) behind the Store, against a real
PostgreSQL 15 (tests/harness/postgres.py; these skip, saying why, where none is installed):
versioned migrations, a batch's events and tokens in one transaction, the local DuckDB copy
brought up to date at start, and the refusals a start must make."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import psycopg
import pytest

from kliqued.daemon.errors import CopyBehind, StoreMismatch, Unavailable
from kliqued.daemon.storage.eventlog import TokenInsert, TokenUpdate
from kliqued.daemon.events import Event
from kliqued.daemon.storage.pglog import MIGRATIONS, PgError, PgLog
from kliqued.daemon.storage.store import FOLLOW_DELAY_ENV, Batch, Store
from tests.harness.typed import present


def open_store(local: Path, url: str) -> Store:
    store = Store(str(local), PgLog(url))
    store.ensure_schema()
    return store


def rows(n: int, first: int = 1) -> list[tuple]:
    return [
        Event(
            "submitted",
            f"T-{i}",
            "alice",
            "r1",
            "g",
            "alice",
            {"resource": "g/one", "note": f"é {i}"},
        ).row(i, 1000 + i)
        for i in range(first, first + n)
    ]


def pg_count(url: str, table: str) -> int:
    with psycopg.connect(url) as conn:
        return present(conn.execute(f"SELECT count(*) FROM {table}").fetchone())[0]


def local_seqs(path: Path) -> list[int]:
    with duckdb.connect(str(path), read_only=True) as conn:
        return [r[0] for r in conn.execute("SELECT seq FROM events ORDER BY seq").fetchall()]


def test_migrations_are_versioned_applied_once_and_recorded(tmp_path: Path, pg_url: str) -> None:
    for _ in range(2):  # the second start finds everything applied
        store = open_store(tmp_path / "l.duckdb", pg_url)
        store.close()
    with psycopg.connect(pg_url) as conn:
        got = conn.execute("SELECT version, name FROM klique_schema ORDER BY version").fetchall()
    assert got == [(v, name) for v, name, _ in MIGRATIONS]


def test_a_schema_newer_than_this_kliqued_is_refused(tmp_path: Path, pg_url: str) -> None:
    open_store(tmp_path / "l.duckdb", pg_url).close()
    with psycopg.connect(pg_url) as conn:
        conn.execute("INSERT INTO klique_schema (version, name) VALUES (999, 'from the future')")
    store = Store(str(tmp_path / "l.duckdb"), PgLog(pg_url))
    try:
        with pytest.raises(PgError, match=r"schema version 999, newer than this kliqued"):
            store.ensure_schema()
    finally:
        store.close()


def test_a_migration_that_fails_is_named_and_leaves_no_version(tmp_path: Path, pg_url: str) -> None:
    with psycopg.connect(pg_url) as conn:
        conn.execute("CREATE TABLE events (something TEXT)")  # not kliqued's
    store = Store(str(tmp_path / "l.duckdb"), PgLog(pg_url))
    try:
        with pytest.raises(
            PgError,
            match=r"migration 1 \(events and tokens\): relation "
            r'"events" already exists',
        ):
            store.ensure_schema()
    finally:
        store.close()
    with psycopg.connect(pg_url) as conn:  # the failed migration's transaction left nothing
        assert conn.execute("SELECT to_regclass('klique_schema')").fetchone() == (None,)


def test_events_and_tokens_round_trip_in_log_order(tmp_path: Path, pg_url: str) -> None:
    store = open_store(tmp_path / "l.duckdb", pg_url)
    try:
        written = rows(3)
        store.commit_sync(
            Batch(
                rows=written[:2],
                ops=[
                    TokenInsert("tok-1", "h1", "alice", "laptop", 5, "role:admin"),
                    TokenInsert("tok-2", "h2", "bob", None, 6, "role:admin", expires_at_ms=99),
                ],
            )
        )
        store.commit_sync(
            Batch(
                rows=written[2:],
                ops=[TokenUpdate("tok-1", "revoked_at_ms", 7), TokenUpdate("tok-2", "hash", "h2b")],
            )
        )
        assert list(store.read_events()) == written
        assert [json.loads(r[8]) for r in store.read_events()][0] == {
            "resource": "g/one",
            "note": "é 1",
        }
        assert store.last_seq() == 3
        assert store.read_tokens() == [
            ("tok-1", "h1", "alice", "laptop", 5, "role:admin", 7, None),
            ("tok-2", "h2b", "bob", None, 6, "role:admin", None, 99),
        ]
    finally:
        store.close()
    assert pg_count(pg_url, "events") == 3
    assert local_seqs(tmp_path / "l.duckdb") == [1, 2, 3]  # the audit reads' copy
    with duckdb.connect(str(tmp_path / "l.duckdb"), read_only=True) as conn:
        assert present(conn.execute("SELECT count(*) FROM tokens").fetchone())[0] == 0  # PG's only


def test_a_failing_file_part_is_fatal_and_the_restart_catches_up(
    tmp_path: Path, pg_url: str
) -> None:
    """The batch is durable in PostgreSQL when the file thread fails to apply its part:
    the failure is told (the daemon's fatal path), the next commit is refused
    (``CopyBehind``: nothing of it written), reads of the file are refused (503), and the
    next start brings the file up to the log."""
    store = open_store(tmp_path / "l.duckdb", pg_url)
    told: list[BaseException] = []
    store.on_follow_failed = told.append

    def file_write_fails(conn: object) -> None:
        raise RuntimeError("the file's write failed")

    try:
        store.commit_sync(Batch(rows=rows(1)))
        # The file thread coalesces the parts queued when it runs (one transaction): wait
        # for the first to be applied, or both would be rolled back together.
        store.read_sync(lambda cur: None)
        store.commit_sync(Batch(rows=rows(1, first=2), ops=[file_write_fails]))
        with pytest.raises(Unavailable, match="behind the log"):
            store.read_sync(lambda cur: None)
        assert [str(e) for e in told] == ["the file's write failed"]
        with pytest.raises(CopyBehind, match="could not apply a batch"):
            store.commit_sync(Batch(rows=rows(1, first=3)))
        assert store.last_seq() == 2
    finally:
        store.close()
    assert pg_count(pg_url, "events") == 2
    assert local_seqs(tmp_path / "l.duckdb") == [1]
    store = open_store(tmp_path / "l.duckdb", pg_url)
    try:
        assert store.caught_up == 1
    finally:
        store.close()
    assert local_seqs(tmp_path / "l.duckdb") == [1, 2]


def test_data_postgresql_refuses_is_a_value_error_and_rolls_back(
    tmp_path: Path, pg_url: str
) -> None:
    """A NUL in a text column: DuckDB takes it, PostgreSQL does not. The sequencer retries a
    batch item by item on a ValueError (loop.unstorable), so the refusal must be one."""
    store = open_store(tmp_path / "l.duckdb", pg_url)
    try:
        bad = Event("submitted", "T-\x00", "alice", None, None, None, {}).row(1, 5)
        with pytest.raises(ValueError, match="PostgreSQL refused the data"):
            store.commit_sync(Batch(rows=[bad]))
        store.commit_sync(Batch(rows=rows(1)))
        assert [r[0] for r in store.read_events()] == [1]
    finally:
        store.close()
    assert local_seqs(tmp_path / "l.duckdb") == [1]


def test_a_constraint_postgresql_enforces_is_a_value_error_as_on_duckdb(
    tmp_path: Path, pg_url: str
) -> None:
    """DuckDB's ConstraintException is a data error for the sequencer; PostgreSQL's
    IntegrityError must be one too (a token id taken twice)."""
    store = open_store(tmp_path / "l.duckdb", pg_url)
    try:
        store.commit_sync(Batch(ops=[TokenInsert("tok-1", "h1", "alice", None, 5, None)]))
        with pytest.raises(ValueError, match="PostgreSQL refused the data"):
            store.commit_sync(
                Batch(rows=rows(1), ops=[TokenInsert("tok-1", "h2", "bob", None, 6, None)])
            )
        assert store.last_seq() == 0 and len(store.read_tokens()) == 1
    finally:
        store.close()


def test_the_local_copy_is_brought_up_to_the_log_at_start(tmp_path: Path, pg_url: str) -> None:
    store = open_store(tmp_path / "a.duckdb", pg_url)
    store.commit_sync(Batch(rows=rows(5)))
    store.close()
    with duckdb.connect(str(tmp_path / "a.duckdb")) as conn:  # as if stopped between commits
        conn.execute("DELETE FROM events WHERE seq > 2")
    store = open_store(tmp_path / "a.duckdb", pg_url)
    try:
        assert store.caught_up == 3
    finally:
        store.close()
    assert local_seqs(tmp_path / "a.duckdb") == [1, 2, 3, 4, 5]


def test_a_local_file_ahead_of_the_log_is_refused(tmp_path: Path, pg_url: str, postgres) -> None:
    store = open_store(tmp_path / "a.duckdb", pg_url)
    store.commit_sync(Batch(rows=rows(2)))
    store.close()
    other = postgres.createdb(f"other_{tmp_path.name[-20:].lower()}")
    store = Store(str(tmp_path / "a.duckdb"), PgLog(other))
    try:
        with pytest.raises(StoreMismatch, match=r"holds events up to 2 but .* only up to 0"):
            store.ensure_schema()
    finally:
        store.close()


def test_an_unreachable_database_is_a_clear_error_without_the_password() -> None:
    with pytest.raises(PgError) as err:
        PgLog("postgresql://kliqued:s3cret@/klique?host=/nonexistent-dir&port=1")
    assert "cannot connect to postgresql://kliqued@/nonexistent-dir:1/klique" in str(err.value)
    assert "s3cret" not in str(err.value)


# ---------------------------------------------------------------- the file follows
def prepare_by_hand(url: str, seq: int, gid: str) -> None:
    """A batch an older kliqued prepared and never ended (its two-phase commit, stopped
    between the phases)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("BEGIN")
        conn.execute("INSERT INTO events (seq, at_ms, kind) VALUES (%s, 1, 'submitted')", [seq])
        conn.execute(f"PREPARE TRANSACTION '{gid}'")


def test_a_batch_is_one_postgresql_commit_and_the_file_follows(tmp_path: Path, pg_url: str) -> None:
    """No two-phase commit (the harness's PostgreSQL has PostgreSQL's default
    ``max_prepared_transactions = 0``): PostgreSQL commits, the file thread applies the
    batch after, and a read of the file waits for it (``Store.settled``)."""
    store = open_store(tmp_path / "l.duckdb", pg_url)
    try:
        store.commit_sync(Batch(rows=rows(2), ops=[TokenInsert("t", "h", "a", None, 1, None)]))
        store.commit_sync(Batch(rows=rows(1, first=3)))
        assert store.last_seq() == 3 and len(store.read_tokens()) == 1
        assert store.read_sync(
            lambda cur: cur.execute("SELECT seq FROM events ORDER BY seq").fetchall()
        ) == [(1,), (2,), (3,)]
        assert (
            store.read_sync(lambda cur: cur.execute("SELECT * FROM ledger_behind").fetchall()) == []
        )  # its ledger followed too
        tables = store.read_sync(
            lambda cur: cur.execute("SELECT table_name FROM information_schema.tables").fetchall()
        )
        assert ("log_decision",) not in tables
    finally:
        store.close()
    assert local_seqs(tmp_path / "l.duckdb") == [1, 2, 3]


def test_batches_queued_for_the_file_are_applied_together_in_order(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file thread held back: three batches queue and go in one DuckDB transaction, in
    commit order (an interval opened, closed, then a history row: the close's count left
    unread must not stop the next batch's appender)."""
    from kliqued.daemon.state import history
    from kliqued.ledger import ops
    from tests.daemon.test_pg_ledger import ms, row

    monkeypatch.setenv(FOLLOW_DELAY_ENV, "0.3")
    store = open_store(tmp_path / "l.duckdb", pg_url)
    done = ("T-1", "alice", "team-a", "team-a/one", "pool-1", "alice", None, 1, 2, "{}")
    try:
        store.commit_sync(
            Batch(rows=rows(1), ops=[ops.opens([row(1, "team-a", "alice", "2026-08-03T10:00:00")])])
        )
        store.commit_sync(
            Batch(
                rows=rows(1, first=2),
                ops=[ops.closes([("T-1#1", ms("2026-08-03T11:00:00"), "finished")])],
            )
        )
        store.commit_sync(
            Batch(
                rows=rows(1, first=3), ops=[lambda conn: history.write(conn, [done], dedupe=False)]
            )
        )
        got = store.read_sync(
            lambda cur: (
                cur.execute("SELECT count(*) FROM events").fetchall(),
                cur.execute("SELECT interval_id, end_reason FROM ledger").fetchall(),
                cur.execute("SELECT id FROM task_history").fetchall(),
            )
        )
        assert store.follow_failed is None
        assert got == ([(3,)], [("T-1#1", "finished")], [("T-1",)])
    finally:
        store.close()


def test_a_batch_an_older_kliqued_left_prepared_is_committed_at_start(
    tmp_path: Path, prepared_pg_url: str
) -> None:
    """Its two-phase commit stopped between the phases: PostgreSQL is the truth now, so the
    batch is committed (logged by ``kliqued serve``) and the file catches up with it."""
    store = open_store(tmp_path / "l.duckdb", prepared_pg_url)
    store.commit_sync(Batch(rows=rows(2)))
    store.close()
    gid = "kliqued-0a1b2c3d-left-behind"
    prepare_by_hand(prepared_pg_url, 3, gid)
    store = open_store(tmp_path / "l.duckdb", prepared_pg_url)
    try:
        assert store.recovered == [(gid, True)]
        assert store.log.pending() == []
        assert store.last_seq() == 3 and store.caught_up == 1
    finally:
        store.close()
    assert local_seqs(tmp_path / "l.duckdb") == [1, 2, 3]
