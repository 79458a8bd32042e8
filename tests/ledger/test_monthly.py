"""ledger_monthly (kept up to date by the writer) and usage_monthly agree with usage_by_month
(computed from the ledger at query time), through closes, batches and price changes."""

from __future__ import annotations

import random
from decimal import Decimal
from types import SimpleNamespace


from kliqued.ledger import (
    close_interval,
    close_intervals,
    ensure_schema,
    open_intervals,
    replace_prices,
)
from kliqued.ledger import writer
from kliqued.ledger.schema import flush_monthly, rebuild_monthly

from .conftest import H, ms, row

COMPARE = """
WITH live AS (
    SELECT month, "group", coalesce(project, '-') AS project, "user", pool, gpu_type,
           sum(ms) AS ms, count(*) AS pieces,
           sum(gpu_hours) AS gpu_hours, sum(budget_hours) AS budget_hours, sum(cost) AS cost
    FROM usage_by_month GROUP BY ALL),
kept AS (
    SELECT month, "group", coalesce(project, '-') AS project, "user", pool, gpu_type,
           sum(ms) AS ms,
           sum(gpu_hours) AS gpu_hours, sum(budget_hours) AS budget_hours, sum(cost) AS cost
    FROM usage_monthly GROUP BY ALL)
SELECT * FROM live FULL JOIN kept USING (month, "group", project, "user", pool, gpu_type)
WHERE live.ms IS DISTINCT FROM kept.ms
   OR abs(live.gpu_hours - kept.gpu_hours) > 0.0000005 * (live.pieces + 1)
   OR abs(live.budget_hours - kept.budget_hours) > 0.0000005 * (live.pieces + 1)
   OR abs(coalesce(live.cost, 0) - coalesce(kept.cost, 0)) > 0.000005 * (live.pieces + 1)
   OR (live.cost IS NULL) <> (kept.cost IS NULL)"""
"""usage_by_month rounds each piece's hours to the millionth (and its cost, the rounded
GPU-hours times the price, again), usage_monthly the month's exact totals: their sums differ
by at most half a millionth of an hour per piece, and of a cost by that times the price plus
half a millionth."""


def estate(*prices):
    return SimpleNamespace(
        settings=SimpleNamespace(currency="EUR"),
        pricing=[
            SimpleNamespace(gpu_type=g, per_gpu_hour=p, effective_from=f, list_per_gpu_hour=None)
            for g, p, f in prices
        ],
    )


def mismatches(db):
    return db.execute(COMPARE).fetchall()


def test_monthly_follows_closes_and_price_changes(db):
    replace_prices(
        db, estate(("h100", "2.35", "2026-01-01T00:00:00Z"), ("l4", "0.35", "2026-01-01T00:00:00Z"))
    )
    rnd = random.Random(11)
    t0 = ms("2026-01-01T00:00")
    rows = []
    for i in range(400):
        start = t0 + rnd.randrange(0, 300 * 24 * H)
        rows.append(
            row(
                i,
                start,
                user=rnd.choice(["alice", "bob"]),
                project=rnd.choice(["llm", None]),
                gpu_type=rnd.choice(["h100", "l4", "b200"]),
                gpus_milli=rnd.choice([250, 1000, 8000]),
                weight_milli=rnd.choice([0, 1000, 2500]),
            )
        )
    open_intervals(db, rows)
    assert mismatches(db) == []  # all open: computed live
    ends = {r.interval_id: r.start_ms + rnd.choice([0, H, 50 * H, 45 * 24 * H]) for r in rows}
    ids = list(ends)
    close_intervals(db, [(k, ends[k], "finished") for k in ids[:300]])  # a batch
    for k in ids[300:350]:  # one by one
        assert close_interval(db, k, ends[k], "reclaimed by team-b")
    close_intervals(db, [(k, ends[k], "x") for k in ids[:10]])  # already closed
    assert not close_interval(db, ids[0], ends[ids[0]], "x")
    assert mismatches(db) == []  # closed ones pending, computed live
    assert db.execute("SELECT count(*) FROM ledger_monthly_pending").fetchone()[0] == 350
    assert flush_monthly(db) == 350
    assert mismatches(db) == []
    assert (
        db.execute("SELECT sum(pieces) FROM ledger_monthly").fetchone()[0]
        == db.execute("SELECT count(*) FROM usage_by_month WHERE end_at IS NOT NULL").fetchone()[0]
    )
    # a new price period in the middle: the affected GPU type's rows are rebuilt
    replace_prices(
        db,
        estate(
            ("h100", "2.35", "2026-01-01T00:00:00Z"),
            ("h100", "1.95", "2026-04-17T06:30:00Z"),
            ("l4", "0.35", "2026-01-01T00:00:00Z"),
            ("b200", "4.10", "2026-03-01T00:00:00Z"),
        ),
    )
    assert mismatches(db) == []
    # a changed amount needs no rebuild: it is joined at query time
    replace_prices(
        db,
        estate(
            ("h100", "2.00", "2026-01-01T00:00:00Z"),
            ("h100", "1.95", "2026-04-17T06:30:00Z"),
            ("l4", "0.40", "2026-01-01T00:00:00Z"),
            ("b200", "4.10", "2026-03-01T00:00:00Z"),
        ),
    )
    assert mismatches(db) == []
    kept = db.execute("SELECT * FROM ledger_monthly ORDER BY ALL").fetchall()
    rebuild_monthly(db)
    assert db.execute("SELECT * FROM ledger_monthly ORDER BY ALL").fetchall() == kept


def test_monthly_is_built_for_an_older_database(db):
    open_intervals(db, [row(1, "2026-06-30T12:00"), row(2, "2026-07-03T00:00")])
    close_interval(db, "t-1#1", ms("2026-07-02T00:00"), "finished")
    db.execute("DROP VIEW usage_monthly")
    db.execute("DROP TABLE ledger_monthly")
    ensure_schema(db)
    got = db.execute("SELECT month, ms FROM ledger_monthly ORDER BY month").fetchall()
    assert [(str(m), v) for m, v in got] == [("2026-06-01", 12 * H), ("2026-07-01", 24 * H)]
    assert mismatches(db) == []


def test_usage_monthly_columns(db):
    open_intervals(
        db, [row(1, "2026-06-30T12:00", project=None, gpus_milli=2000, weight_milli=1500)]
    )
    close_interval(db, "t-1#1", ms("2026-06-30T14:00"), "finished")
    cur = db.execute("SELECT * FROM usage_monthly")
    cols = [d[0] for d in cur.description]
    r = dict(zip(cols, cur.fetchone()))
    assert cols == [
        "month",
        "group",
        "group_path",
        "business_unit",
        "department",
        "project",
        "user",
        "channel",
        "policy",
        "profile",
        "resource",
        "pool",
        "gpu_type",
        "pieces",
        "ms",
        "hours",
        "gpu_hours",
        "budget_hours",
        "currency",
        "cost",
    ]
    assert r["project"] is None and r["hours"] == 2.0 and r["gpu_hours"] == 4.0
    assert r["group_path"] is None and r["business_unit"] is None  # the row has no path
    assert r["budget_hours"] == Decimal("3.000000") and r["cost"] is None and r["pieces"] == 1


def test_pending_closes_are_folded_in_every_flush_at(db, monkeypatch):
    monkeypatch.setattr(writer, "FLUSH_AT", 5)
    open_intervals(db, [row(i, "2026-03-01T00:00") for i in range(12)])
    for i in range(4):
        close_interval(db, f"t-{i}#1", ms("2026-03-01T01:00"), "finished")
    pending = "SELECT count(*) FROM ledger_monthly_pending"
    assert db.execute(pending).fetchone()[0] == 4
    close_intervals(db, [(f"t-{i}#1", ms("2026-03-01T02:00"), "finished") for i in range(4, 8)])
    assert db.execute(pending).fetchone()[0] == 0
    assert db.execute("SELECT pieces, ms FROM ledger_monthly").fetchall() == [(8, 12 * H)]
    assert mismatches(db) == []
    close_intervals(db, [(f"t-{i}#1", ms("2026-03-01T02:00"), "finished") for i in range(8, 10)])
    ensure_schema(db)  # a start folds pending ones in
    assert db.execute(pending).fetchone()[0] == 0
    assert mismatches(db) == []


def test_the_fold_comes_at_flush_at_with_closes_one_by_one(db, monkeypatch):
    """The pending closes are counted in the table only when this connection's tally says
    they may have reached ``FLUSH_AT`` (issue 29: one statement less in most commits); the
    fold still comes on the close that makes the table's count reach it, and a close made
    through another path (``close_interval``, which the tally does not see) moves it
    earlier, since the table's count decides."""
    monkeypatch.setattr(writer, "FLUSH_AT", 4)
    open_intervals(db, [row(i, "2026-03-01T00:00") for i in range(12)])
    pending = "SELECT count(*) FROM ledger_monthly_pending"
    at = ms("2026-03-01T01:00")
    seen = []
    for i in range(4):
        close_intervals(db, [(f"t-{i}#1", at, "finished")])
        seen.append(db.execute(pending).fetchone()[0])
    assert seen == [1, 2, 3, 0]  # folded on the fourth
    close_interval(db, "t-4#1", at, "finished")  # behind the tally's back: 1 pending
    close_interval(db, "t-5#1", at, "finished")  # 2
    close_intervals(db, [("t-6#1", at, "finished")])  # 3 pending; the tally says 1
    close_intervals(db, [("t-7#1", at, "finished"), ("t-8#1", at, "finished")])
    assert db.execute(pending).fetchone()[0] == 5  # tally 3 < 4: not looked at yet
    close_intervals(db, [("t-9#1", at, "finished")])  # the tally reaches 4: counted, 6
    assert db.execute(pending).fetchone()[0] == 0
    assert mismatches(db) == []
