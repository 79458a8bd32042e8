"""Schema and writer against a real DuckDB file."""

from __future__ import annotations

from decimal import Decimal

import duckdb
import pytest

from compiler.api import compile_dir
from kliqued.ledger import (
    close_interval,
    close_intervals,
    ensure_schema,
    open_interval,
    open_intervals,
    replace_prices,
)
from kliqued.ledger.schema import LEDGER_COLUMNS, VIEWS
from tests.conftest import ESTATE

from .conftest import H, ms, row


def test_schema_is_idempotent_and_keeps_data(db):
    open_interval(db, row(1, "2026-03-01T00:00"))
    ensure_schema(db)
    ensure_schema(db)
    assert db.execute("SELECT count(*) FROM ledger").fetchone()[0] == 1
    names = {
        r[0] for r in db.execute("SELECT table_name FROM information_schema.tables").fetchall()
    }
    assert {"ledger", "prices", *VIEWS} <= names
    cols = db.execute(
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_name = 'ledger' ORDER BY ordinal_position"
    ).fetchall()
    assert cols == [(n, t) for n, t in LEDGER_COLUMNS]


def test_schema_inside_a_transaction(db):
    db.execute("BEGIN")
    ensure_schema(db)
    db.execute("COMMIT")


def test_open_and_close_exact_values(db):
    start = ms("2026-03-01T10:00") + 123
    open_interval(db, row(1, start, gpus_milli=250, weight_milli=1500, project=None))
    got = db.execute(
        "SELECT gpus, time_weight, start_at, end_at, end_reason, project FROM ledger"
    ).fetchone()
    assert got[0] == Decimal("0.250") and got[1] == Decimal("1.500")
    assert got[2].isoformat() == "2026-03-01T10:00:00.123000"
    assert got[3] is None and got[4] is None and got[5] is None
    assert close_interval(db, "t-1#1", start + 2 * H, "finished") is True
    assert close_interval(db, "t-1#1", start + 5 * H, "again") is False  # closed once only
    assert close_interval(db, "nope#1", start, "x") is False
    end, reason = db.execute("SELECT end_at, end_reason FROM ledger").fetchone()
    assert end.isoformat() == "2026-03-01T12:00:00.123000" and reason == "finished"


@pytest.mark.parametrize("n", [3, 60])  # the VALUES path and the list path
def test_batches(db, n):
    t0 = ms("2026-03-01T00:00")
    assert open_intervals(db, [row(i, t0 + i, gpus_milli=i) for i in range(n)]) == n
    assert open_intervals(db, []) == 0
    assert db.execute("SELECT sum(gpus) FROM ledger").fetchone()[0] == Decimal(sum(range(n))) / 1000
    items = [(f"t-{i}#1", t0 + H, "reclaimed by team-b") for i in range(0, n, 2)]
    items.append(items[0])  # a repeated id counts once
    assert close_intervals(db, items) == len(range(0, n, 2))
    assert close_intervals(db, items) == 0
    assert db.execute("SELECT count(*) FROM ledger WHERE end_at IS NULL").fetchone()[0] == n - len(
        range(0, n, 2)
    )


def test_duplicate_interval_raises_in_the_callers_transaction(db):
    db.execute("BEGIN")
    open_interval(db, row(1, "2026-03-01T00:00"))
    with pytest.raises(duckdb.ConstraintException):
        open_intervals(db, [row(2, "2026-03-01T00:00"), row(1, "2026-03-01T00:00")])
    db.execute("ROLLBACK")
    assert db.execute("SELECT count(*) FROM ledger").fetchone()[0] == 0


def test_writer_does_not_commit(db):
    db.execute("BEGIN")
    open_intervals(db, [row(i, "2026-03-01T00:00") for i in range(30)])
    close_intervals(db, [("t-1#1", ms("2026-03-01T01:00"), "finished")] * 3)
    db.execute("ROLLBACK")
    assert db.execute("SELECT count(*) FROM ledger").fetchone()[0] == 0


def test_replace_prices_from_the_estate(db):
    est = compile_dir(str(ESTATE)).estate
    assert replace_prices(db, est) == len(est.pricing)
    assert replace_prices(db, est) == len(est.pricing)  # replaced, not appended
    rows = db.execute(
        "SELECT gpu_type, per_gpu_hour, currency, effective_from FROM prices "
        "WHERE gpu_type = 'h100-80gb-neocloud' ORDER BY effective_from"
    ).fetchall()
    assert [(r[1], r[2], r[3].isoformat()) for r in rows] == [
        (Decimal("2.35"), "EUR", "2026-01-01T00:00:00"),
        (Decimal("1.95"), "EUR", "2026-07-01T00:00:00"),
    ]
