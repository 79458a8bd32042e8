"""usage, usage_priced (ASOF) and usage_by_month (split at UTC month ends)."""

from __future__ import annotations

import random
from decimal import Decimal
from datetime import datetime, timezone


from kliqued.ledger import close_interval, close_intervals, open_intervals

from .conftest import H, ms, row, set_prices


def one(db, sql, *params):
    cur = db.execute(sql, list(params))
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def test_usage_hours(db):
    open_intervals(
        db,
        [
            row(1, "2026-03-01T00:00", gpus_milli=2500, weight_milli=1500),
            row(2, "2026-03-01T00:00"),
        ],
    )
    close_interval(db, "t-1#1", ms("2026-03-01T04:00"), "finished")
    u = {r["interval_id"]: r for r in one(db, "SELECT * FROM usage")}
    assert u["t-1#1"]["ms"] == 4 * H
    assert u["t-1#1"]["hours"] == 4.0
    assert u["t-1#1"]["gpu_hours"] == 10.0
    assert u["t-1#1"]["budget_hours"] == 6.0
    # an open interval runs to now
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    assert abs((u["t-2#1"]["until_at"] - now).total_seconds()) < 60
    assert u["t-2#1"]["hours"] > 0 and u["t-2#1"]["end_at"] is None


def test_open_interval_starting_after_now_counts_zero(db):
    open_intervals(db, [row(1, "2999-01-01T00:00")])
    (u,) = one(db, "SELECT * FROM usage")
    assert u["hours"] == 0
    (m,) = one(db, "SELECT * FROM usage_by_month")
    assert m["hours"] == 0 and str(m["month"]) == "2999-01-01"


def test_usage_priced_asof_picks_the_price_in_effect_at_start(db):
    set_prices(
        db,
        ("h100", "2.35", "2026-01-01"),
        ("h100", "1.95", "2026-07-01"),
        ("l4", "0.35", "2026-01-01"),
    )
    open_intervals(
        db,
        [
            row(1, "2026-06-30T20:00"),  # before the change: old price
            row(2, "2026-07-01T00:00"),  # exactly at the change: new price
            row(3, "2026-08-01T00:00", gpus_milli=2000),  # later: new price
            row(4, "2025-12-31T23:00"),  # before any price: unpriced
            row(5, "2026-07-05T00:00", gpu_type="l4"),  # another type: its own price
            row(6, "2026-07-05T00:00", gpu_type="b200"),  # a type without a price
        ],
    )
    close_intervals(
        db,
        [
            (f"t-{i}#1", ms(s), "finished")
            for i, s in [
                (1, "2026-07-01T08:00"),
                (2, "2026-07-01T02:00"),
                (3, "2026-08-01T01:00"),
                (4, "2026-01-01T01:00"),
                (5, "2026-07-05T10:00"),
                (6, "2026-07-05T01:00"),
            ]
        ],
    )
    p = {r["interval_id"]: r for r in one(db, "SELECT * FROM usage_priced")}
    assert str(p["t-1#1"]["per_gpu_hour"]) == "2.350000"
    assert p["t-1#1"]["cost"] == Decimal("28.200000")  # whole interval at the start price
    assert str(p["t-2#1"]["per_gpu_hour"]) == "1.950000"
    assert p["t-3#1"]["cost"] == Decimal("3.900000")
    assert p["t-4#1"]["per_gpu_hour"] is None and p["t-4#1"]["cost"] is None
    assert p["t-5#1"]["cost"] == Decimal("3.500000") and p["t-5#1"]["currency"] == "EUR"
    assert p["t-6#1"]["cost"] is None and p["t-6#1"]["gpu_hours"] == 1.0


def test_usage_by_month_splits_at_month_ends(db):
    set_prices(db, ("h100", "2.35", "2026-01-01"), ("h100", "1.95", "2026-07-01"))
    open_intervals(
        db,
        [
            row(1, "2026-06-30T12:00", gpus_milli=2000),  # June 12 h, July 24 h
            row(2, "2026-06-30T12:00"),  # ends exactly at the month end
            row(3, "2026-01-15T00:00"),  # Jan, all of Feb, part of Mar
            row(4, "2026-05-10T00:00"),  # zero length
            row(5, "2026-12-31T23:00"),  # across a year end
        ],
    )
    close_intervals(
        db,
        [
            (f"t-{i}#1", ms(s), "finished")
            for i, s in [
                (1, "2026-07-02T00:00"),
                (2, "2026-07-01T00:00"),
                (3, "2026-03-10T00:00"),
                (4, "2026-05-10T00:00"),
                (5, "2027-01-01T01:00"),
            ]
        ],
    )
    rows = one(
        db,
        "SELECT interval_id, month, piece_start, piece_end, hours, gpu_hours, "
        "per_gpu_hour, cost FROM usage_by_month ORDER BY interval_id, month",
    )
    got = [(r["interval_id"], str(r["month"]), r["hours"]) for r in rows]
    assert got == [
        ("t-1#1", "2026-06-01", 12.0),
        ("t-1#1", "2026-07-01", 24.0),
        ("t-2#1", "2026-06-01", 12.0),
        ("t-3#1", "2026-01-01", 17 * 24.0),
        ("t-3#1", "2026-02-01", 28 * 24.0),
        ("t-3#1", "2026-03-01", 9 * 24.0),
        ("t-4#1", "2026-05-01", 0.0),
        ("t-5#1", "2026-12-01", 1.0),
        ("t-5#1", "2027-01-01", 1.0),
    ]
    june, july = rows[0], rows[1]
    # each piece is priced by the price in effect at its own start
    assert june["cost"] == Decimal("56.400000")
    assert july["cost"] == Decimal("93.600000")
    assert july["piece_start"].isoformat() == "2026-07-01T00:00:00"


def test_open_interval_across_months_runs_to_now(db):
    open_intervals(db, [row(1, "2026-01-20T00:00")])
    pieces = one(db, "SELECT month, piece_start, piece_end FROM usage_by_month ORDER BY month")
    now = datetime.now(timezone.utc)
    months = (now.year - 2026) * 12 + now.month  # January 2026 .. this month
    assert len(pieces) == months
    assert abs((pieces[-1]["piece_end"] - now.replace(tzinfo=None)).total_seconds()) < 60


def test_pieces_add_up_and_agree_with_usage_priced(db):
    """Random intervals: the month pieces of each interval add up to its duration exactly, and
    for intervals inside one month, usage_by_month and usage_priced (ASOF) give the same
    price."""
    set_prices(
        db,
        ("h100", "2.35", "2026-01-01"),
        ("h100", "1.95", "2026-04-17T06:30"),
        ("h100", "2.05", "2026-09-01"),
        ("l4", "0.35", "2026-02-01"),
    )
    rnd = random.Random(7)
    t0 = ms("2026-01-01T00:00")
    rows, closes = [], []
    for i in range(300):
        start = t0 + rnd.randrange(0, 330 * 24 * H)
        rows.append(
            row(
                i,
                start,
                gpu_type=rnd.choice(["h100", "l4"]),
                gpus_milli=rnd.choice([250, 1000, 8000]),
            )
        )
        closes.append(
            (
                f"t-{i}#1",
                start + rnd.choice([0, H, 30 * H, 40 * 24 * H, rnd.randrange(90 * 24 * H)]),
                "finished",
            )
        )
    open_intervals(db, rows)
    close_intervals(db, closes)
    bad = db.execute("""
        SELECT u.interval_id FROM usage u
        JOIN (SELECT interval_id, sum(ms) AS ms, count(*) AS n FROM usage_by_month
              GROUP BY ALL) m USING (interval_id)
        WHERE u.ms <> m.ms""").fetchall()
    assert bad == []
    assert db.execute("SELECT count(DISTINCT interval_id) FROM usage_by_month").fetchone()[0] == 300
    differ = db.execute("""
        SELECT p.interval_id FROM usage_priced p JOIN usage_by_month m USING (interval_id)
        WHERE date_trunc('month', p.start_at) = date_trunc('month', p.until_at)
          AND (p.per_gpu_hour IS DISTINCT FROM m.per_gpu_hour
               OR abs(coalesce(p.cost, 0) - coalesce(m.cost, 0)) > 1e-9)""").fetchall()
    assert differ == []


def test_hours_and_costs_are_exact_decimals(db):
    """Issue 10, bug 1: hours and costs were DOUBLE, so 3.49 h came back 3.4899999... and a
    query's round() acted on an inexact value. They are DECIMAL, rounded once to the
    millionth from exact integers."""
    set_prices(db, ("h100", "1.850000", "2026-01-01"))
    # 3.49 h on 1.5 GPUs at 1.85 = 9.68475; 1.44 s on one GPU = 0.0004 h
    open_intervals(
        db,
        [
            row(1, "2026-03-01T00:00", gpus_milli=1500, weight_milli=2500),
            row(2, "2026-03-02T00:00"),
        ],
    )
    close_intervals(
        db,
        [
            ("t-1#1", ms("2026-03-01T00:00") + 3490 * H // 1000, "finished"),
            ("t-2#1", ms("2026-03-02T00:00") + 1440, "finished"),
        ],
    )
    for view in ("usage_priced", "usage_by_month"):
        cur = db.execute(
            f"SELECT interval_id, hours, gpu_hours, budget_hours, cost FROM {view} "
            "ORDER BY interval_id"
        )
        assert [d[1] for d in cur.description][1:] == ["DECIMAL(18,6)"] * 4, view
        assert cur.fetchall() == [
            (
                "t-1#1",
                Decimal("3.490000"),
                Decimal("5.235000"),
                Decimal("8.725000"),
                Decimal("9.684750"),
            ),
            (
                "t-2#1",
                Decimal("0.000400"),
                Decimal("0.000400"),
                Decimal("0.000400"),
                Decimal("0.000740"),
            ),
        ]
    cur = db.execute(
        "SELECT hours, gpu_hours, budget_hours, cost, round(cost, 2) AS eur FROM usage_monthly"
    )
    assert [str(d[1]) for d in cur.description] == ["DECIMAL(38,6)"] * 4 + ["DECIMAL(38,2)"]
    assert cur.fetchall() == [
        (
            Decimal("3.490400"),
            Decimal("5.235400"),
            Decimal("8.725400"),
            Decimal("9.685490"),
            Decimal("9.69"),
        )
    ]


def test_a_cost_too_large_for_64_bits_in_millionths_is_still_exact(db):
    # a year on 1,000 GPUs at 2,000.000001 a GPU-hour: GPU-hours times price in millionths
    # passes 2**63, so the cost is computed in 128 bits
    set_prices(db, ("h100", "2000.000001", "2026-01-01"))
    open_intervals(db, [row(1, "2026-01-01T00:00", gpus_milli=1_000_000)])
    close_intervals(db, [("t-1#1", ms("2027-01-01T00:00"), "finished")])
    (r,) = one(db, "SELECT gpu_hours, cost FROM usage_priced")
    assert r == {"gpu_hours": Decimal("8760000.000000"), "cost": Decimal("17520000008.760000")}
