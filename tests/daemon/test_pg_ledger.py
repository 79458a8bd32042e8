"""The ledger in PostgreSQL (kliqued/ledger/pgschema.py, pgwriter.py) behind the Store, against
a real PostgreSQL 15 (skipped, saying why, where none is installed): the same writes give the
same rows in every relation finance reads as in the DuckDB file (a parity test of each view),
written in the batch's PostgreSQL transaction, and a deployment's existing DuckDB ledger is
copied once into an empty PostgreSQL one."""

from __future__ import annotations

from datetime import date, datetime, timezone
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest

from compiler.api import compile_dir
from kliqued.daemon.events import Event
from kliqued.daemon.storage.pglog import PgLog
from kliqued.daemon.storage.store import Batch, Store
from kliqued.ledger import export, feed, focus, ops, pgwriter, sandbox
from kliqued.ledger import writer
from kliqued.ledger.writer import IntervalRow
from tests.harness.daemon import ROOT
from tests.harness.typed import present

ESTATE = ROOT / "tests" / "daemon" / "estate_org"

UNTIL_NOW = ("capacity_by_month", "reserved_idle", "estate_use", "idle_cost")
"""Views whose current month runs up to now (each backend's own clock): compared on the
months before it."""


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp() * 1000)


def row(
    n: int,
    group: str,
    user: str,
    start: str,
    gpus: int = 1000,
    path: str | None = "",
    channel: str | None = "cli",
) -> IntervalRow:
    paths = {"team-a": "north/ml/team-a", "team-b": "north/ml/team-b", "team-c": "south/ops/team-c"}
    return IntervalRow(
        f"T-{n}#1",
        f"T-{n}",
        user,
        "p1" if n % 2 else None,
        group,
        group,
        "default",
        f"{group}/one",
        "pool-1",
        "h100-80gb",
        gpus,
        1500 * (n % 3),
        ms(start),
        "r1",
        paths[group] if path == "" else path,
        channel,
    )


def norm(value) -> str:
    """A value as both databases' drivers give it, compared by what it means: a number by
    its value (DuckDB's DECIMAL(38,9) zero and PostgreSQL's integer zero are one figure)."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, (int, Decimal)):
        return format(Decimal(value).normalize(), "f")
    return str(value)


def numbers(value):
    """A JSON answer with every decimal text as its value (``"0"`` and ``"0.000000"`` alike)."""
    if isinstance(value, dict):
        return {k: numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [numbers(v) for v in value]
    if isinstance(value, str):
        try:
            return Decimal(value)
        except ArithmeticError:
            return value
    return value


def duck_rows(store: Store, sql: str) -> tuple[list[str], list[tuple]]:
    """The file's rows, once it has every batch committed (``Store.read_sync``: the file
    thread applies them after PostgreSQL's commit)."""

    def run(cur) -> tuple[list[str], list[tuple]]:
        cur.execute(sql)
        cols = [d[0] for d in cur.description]
        return cols, sorted(tuple(norm(v) for v in r) for r in cur.fetchall())

    return store.read_sync(run)


def pg_rows(url: str, sql: str) -> tuple[list[str], list[tuple]]:
    with psycopg.connect(url) as conn:
        cur = conn.execute(sql)
        cols = [d.name for d in present(cur.description)]
        return cols, sorted(tuple(norm(v) for v in r) for r in cur.fetchall())


@pytest.fixture
def estate():
    result = compile_dir(ESTATE)
    assert result.estate is not None, result.diagnostics
    return result.estate


def history(estate) -> list[Batch]:
    """A few months of a small organisation: prices and capacity, intervals across month
    ends, one closed twice, one without a path filled later, cloud nodes."""
    at = ms("2026-08-01T00:00:00")
    return [
        Batch(ops=[ops.ReplacePrices(estate), ops.RecordEstate(estate, at)]),
        Batch(
            ops=[
                ops.opens(
                    [
                        row(1, "team-a", "alice", "2026-08-03T10:00:00"),
                        row(2, "team-b", "bob", "2026-08-31T22:30:00.250", gpus=2500),
                        row(3, "team-c", "carl", "2026-09-15T08:00:00"),
                        row(
                            4, "team-a", "alice", "2026-09-30T23:59:59.999", path=None, channel=None
                        ),
                    ]
                )
            ]
        ),
        Batch(
            ops=[
                ops.closes(
                    [
                        ("T-1#1", ms("2026-08-03T18:00:00.5"), "finished"),
                        ("T-2#1", ms("2026-10-02T01:00:00"), "preempted"),
                    ]
                )
            ]
        ),
        Batch(
            ops=[
                ops.opens(
                    [
                        row(5, "team-b", "bob", "2026-10-05T00:00:00", gpus=500),
                        row(6, "team-c", "carl", "2026-10-06T00:00:00", gpus=8000),
                    ]
                ),
                ops.closes(
                    [
                        ("T-3#1", ms("2026-11-01T00:00:00"), "finished"),
                        ("T-3#1", ms("2026-11-02T00:00:00"), "twice"),
                        ("T-5#1", ms("2026-10-05T12:00:00"), "cancelled"),
                    ]
                ),
            ]
        ),
        Batch(
            ops=[
                ops.closes(
                    [
                        ("T-4#1", ms("2026-10-01T00:00:10"), "finished"),
                        ("T-6#1", ms("2026-10-07T00:00:00"), "finished"),
                        ("T-6#1", ms("2026-10-08T00:00:00"), "again"),
                    ]
                ),
                ops.FillGroupPaths(writer.group_paths(estate)),
                ops.OpenCloudNode(
                    {
                        "node": "n1",
                        "pool": "pool-1",
                        "provider": "aws",
                        "instance_type": "p5.48xlarge",
                        "lifecycle": "spot",
                        "gpus": 8,
                        "per_hour": "31.464",
                        "currency": "EUR",
                    },
                    ms("2026-09-30T20:00:00"),
                    "r1",
                ),
                ops.CloseCloudNode("n1", ms("2026-10-01T03:15:00"), "idle"),
            ]
        ),
    ]


def test_every_view_finance_reads_is_the_same_in_postgresql_and_duckdb(
    tmp_path: Path, pg_url: str, estate, monkeypatch: pytest.MonkeyPatch
) -> None:
    # fold the pending closed intervals into the monthly aggregate every few closes, so
    # that both the aggregate and the pending rows hold some
    monkeypatch.setattr(writer, "FLUSH_AT", 3)
    monkeypatch.setattr(pgwriter, "FLUSH_AT", 3)
    store = Store(str(tmp_path / "l.duckdb"), PgLog(pg_url))
    store.ensure_schema()
    try:
        for seq, batch in enumerate(history(estate), 1):
            batch.rows.append(Event("tick").row(seq, 1000 + seq))
            store.commit_sync(batch)
        store.read_sync(lambda cur: None)  # the file thread has applied every batch
        assert pg_rows(pg_url, "SELECT count(*) FROM ledger_monthly")[1] != [("0",)]
        month = datetime.now(timezone.utc).strftime("%Y-%m-01")
        compared = 0
        for name in sandbox.RELATIONS:
            sql = f"SELECT * FROM {name}"
            if name in UNTIL_NOW:
                sql += f" WHERE month < DATE '{month}'"
            duck, pg = duck_rows(store, sql), pg_rows(pg_url, sql)
            assert pg[0] == duck[0], f"{name}: columns differ"
            assert pg[1] == duck[1], f"{name}: rows differ"
            compared += len(duck[1])
        assert compared > 60
        # borrowing and lending are exercised: team-b and team-c borrow, reservations lend
        lent = "SELECT count(*) AS n FROM borrowed_usage WHERE lent_hours > 0"
        assert pg_rows(pg_url, lent)[1] != [("0",)]
        # the CSV export: the same text, byte for byte
        a, b = ms("2026-08-15T00:00:00"), ms("2026-10-06T06:00:00")
        duck_csv = "".join(export.export_csv(store.conn.cursor(), a, b, chunk_rows=2))
        with psycopg.connect(pg_url) as conn:
            pg_csv = "".join(export.export_csv(conn, a, b, chunk_rows=2, pg=True))
        assert pg_csv == duck_csv and duck_csv.count("\n") == 6, duck_csv
        # FOCUS: the same dataset, month by month
        for period in (date(2026, 8, 1), date(2026, 9, 1), date(2026, 10, 1)):
            duck_focus = "".join(focus.focus_csv(store.conn.cursor(), period, chunk_rows=2))
            with psycopg.connect(pg_url) as conn:
                pg_focus = "".join(focus.focus_csv(conn, period, chunk_rows=2, pg=True))
            assert pg_focus == duck_focus and duck_focus.count("\n") > 2, period
        # the billing feed: the same rows in the same order, page by page
        after = {"duck": 0, "pg": 0}
        with psycopg.connect(pg_url, autocommit=True) as conn:
            for _ in range(4):
                d = feed.pull(store.conn.cursor(), after["duck"], 2)
                p = feed.pull(conn, after["pg"], 2, pg=True)
                assert p == d
                after = {"duck": int(d["cursor"]), "pg": int(p["cursor"])}
            assert after["duck"] == 6 and d["more"] is False
        # the internal monthly aggregate, its pending rows and the feed match too
        for sql in (
            "SELECT * FROM ledger_monthly",
            "SELECT * FROM ledger_monthly_pending",
            "SELECT * FROM ledger_feed",
        ):
            assert pg_rows(pg_url, sql) == duck_rows(store, sql), sql
    finally:
        store.close()


def test_ledger_rows_commit_with_their_batch_in_postgresql(
    tmp_path: Path, pg_url: str, estate
) -> None:
    store = Store(str(tmp_path / "l.duckdb"), PgLog(pg_url))
    store.ensure_schema()
    try:
        opened = ops.opens([row(1, "team-a", "alice", "2026-08-03T10:00:00")])
        store.commit_sync(Batch(rows=[Event("tick").row(1, 1)], ops=[opened]))
        with pytest.raises(ValueError, match="PostgreSQL refused the data"):
            # the same interval opened again: the whole batch, its event included, is undone
            store.commit_sync(
                Batch(
                    rows=[Event("tick").row(2, 2)],
                    ops=[ops.opens([row(2, "team-b", "bob", "2026-08-03T11:00:00")]), opened],
                )
            )
        with psycopg.connect(pg_url) as conn:
            assert conn.execute("SELECT max(seq) FROM events").fetchone() == (1,)
            assert conn.execute("SELECT interval_id FROM ledger").fetchall() == [("T-1#1",)]
    finally:
        store.close()


def test_an_existing_duckdb_ledger_is_copied_once_into_an_empty_postgresql_one(
    tmp_path: Path, pg_url: str, estate
) -> None:
    local = tmp_path / "l.duckdb"
    alone = Store(str(local))  # a ledger kept only in the file, as before
    alone.ensure_schema()
    for batch in history(estate):
        alone.commit_sync(batch)
    alone.close()
    store = Store(str(local), PgLog(pg_url))
    store.ensure_schema()
    try:
        assert store.seeded == 6
        for name in ("usage_monthly", "cloud_spend_monthly", "capacity_periods", "usage"):
            assert pg_rows(pg_url, f"SELECT * FROM {name}") == duck_rows(
                store, f"SELECT * FROM {name}"
            ), name
        # the feed's numbers continue after the copied ones
        store.commit_sync(
            Batch(
                rows=[Event("tick").row(1, 1)],
                ops=[
                    ops.opens([row(9, "team-a", "alice", "2026-11-03T10:00:00")]),
                    ops.closes([("T-9#1", ms("2026-11-03T11:00:00"), "finished")]),
                ],
            )
        )
        assert pg_rows(pg_url, "SELECT max(seq) AS s, count(*) AS n FROM ledger_feed") == duck_rows(
            store, "SELECT max(seq) AS s, count(*) AS n FROM ledger_feed"
        )
    finally:
        store.close()
    again = Store(str(local), PgLog(pg_url))
    again.ensure_schema()  # not copied twice
    assert again.seeded == 0
    again.close()


def test_a_new_local_file_gets_postgresqls_ledger(tmp_path: Path, pg_url: str, estate) -> None:
    first = Store(str(tmp_path / "first.duckdb"), PgLog(pg_url))
    first.ensure_schema()
    for seq, batch in enumerate(history(estate), 1):
        batch.rows.append(Event("tick").row(seq, 1000 + seq))
        first.commit_sync(batch)
    first.close()
    # a daemon started on another machine: a new file beside the same database
    store = Store(str(tmp_path / "second.duckdb"), PgLog(pg_url))
    store.ensure_schema()
    try:
        assert (store.caught_up, store.seeded_file) == (5, 6)
        for name in sandbox.RELATIONS:
            if name not in UNTIL_NOW:
                assert pg_rows(pg_url, f"SELECT * FROM {name}") == duck_rows(
                    store, f"SELECT * FROM {name}"
                ), name
        store.commit_sync(
            Batch(
                rows=[Event("tick").row(6, 6)],
                ops=[
                    ops.opens([row(9, "team-a", "alice", "2026-11-03T10:00:00")]),
                    ops.closes([("T-9#1", ms("2026-11-03T11:00:00"), "finished")]),
                ],
            )
        )
        sql = "SELECT * FROM ledger_feed"
        assert pg_rows(pg_url, sql) == duck_rows(store, sql)
    finally:
        store.close()


def test_a_file_behind_another_daemons_lead_gets_postgresqls_ledger_again(
    tmp_path: Path, pg_url: str, estate
) -> None:
    batches = history(estate)
    for seq, batch in enumerate(batches, 1):
        batch.rows.append(Event("tick").row(seq, 1000 + seq))
    first = Store(str(tmp_path / "a.duckdb"), PgLog(pg_url))
    first.ensure_schema()
    for batch in batches[:3]:
        first.commit_sync(batch)
    first.close()
    other = Store(str(tmp_path / "b.duckdb"), PgLog(pg_url))  # another daemon leads
    other.ensure_schema()
    for batch in batches[3:]:
        other.commit_sync(batch)
    other.close()
    store = Store(str(tmp_path / "a.duckdb"), PgLog(pg_url))  # the first leads again
    store.ensure_schema()
    try:
        assert store.seeded_file == 6
        for name in sandbox.RELATIONS:
            if name not in UNTIL_NOW:
                assert pg_rows(pg_url, f"SELECT * FROM {name}") == duck_rows(
                    store, f"SELECT * FROM {name}"
                ), name
    finally:
        store.close()
