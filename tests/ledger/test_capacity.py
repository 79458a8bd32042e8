"""Capacity over estate revisions, idle cost and the CIO's views (issue 17, items 3 and 5):
reserved + used + unreserved idle adds up to the capacity's cost."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal
from types import SimpleNamespace

import pytest

from kliqued.ledger import close_intervals, open_intervals
from kliqued.ledger.capacity import record_estate

from .conftest import ms, row, set_prices


def estate(revision: str, capacity_milli: int, reservation_milli: int = 2000):
    pool = SimpleNamespace(
        name="p1", kind="kubernetes", gpu_type="h100", capacity_milli=capacity_milli
    )
    return SimpleNamespace(
        revision=revision,
        pools=[pool],
        profiles=[SimpleNamespace(name="one", pools=["p1"])],
        groups=[
            SimpleNamespace(name="ml", ancestors=[]),
            SimpleNamespace(name="team-a", ancestors=["ml"]),
        ],
        policies=[
            SimpleNamespace(
                name="team-a",
                group="team-a",
                envelope=False,
                reservation_milli=reservation_milli,
                profiles=["one"],
            )
        ],
    )


@pytest.fixture
def nov(db):
    """November 2025: 4 GPUs, 8 from the 16th; team-a reserves 2 and uses 1 GPU for 10 h,
    then 3 GPUs (one borrowed) for 2 h."""
    set_prices(db, ("h100", "2.00", "2025-01-01"))
    assert record_estate(db, estate("sha256:a", 4000), ms("2025-11-01T00:00"))
    assert not record_estate(db, estate("sha256:a", 4000), ms("2025-11-05T00:00"))  # same
    assert record_estate(db, estate("sha256:b", 8000), ms("2025-11-16T00:00"))
    open_intervals(
        db,
        [
            replace(row(1, "2025-11-02T00:00", group="team-a", group_path="ml/team-a"), pool="p1"),
            replace(
                row(2, "2025-11-03T00:00", group="team-a", group_path="ml/team-a", gpus_milli=3000),
                pool="p1",
            ),
        ],
    )
    close_intervals(
        db,
        [
            ("t-1#1", ms("2025-11-02T10:00"), "finished"),
            ("t-2#1", ms("2025-11-03T02:00"), "finished"),
        ],
    )
    return db


def one(db, sql):
    return db.execute(sql).fetchone()


def test_capacity_follows_the_revisions(nov):
    hours, cost = one(
        nov,
        "SELECT sum(gpu_hours), sum(cost) FROM capacity_by_month WHERE month = DATE '2025-11-01'",
    )
    assert hours == 4 * 15 * 24 + 8 * 15 * 24 and cost == 2 * hours


def test_reserved_idle_is_integrated_over_time(nov):
    r = one(
        nov,
        "SELECT reserved_hours, idle_hours, idle_cost, business_unit, department "
        "FROM reserved_idle WHERE month = DATE '2025-11-01' AND policy = 'team-a'",
    )
    # 2 GPUs x 30 days reserved; 1 used for 10 h, 2 (of 3) for 2 h
    assert r == (Decimal(1440), Decimal(1440 - 10 - 4), Decimal(2 * 1426), None, "ml")


def test_reserved_used_and_idle_add_up_to_the_capacity(nov):
    r = one(
        nov,
        "SELECT capacity_hours, used_hours, reserved_idle_hours, "
        "unreserved_idle_hours, capacity_cost, used_cost, reserved_idle_cost, "
        "unreserved_idle_cost FROM idle_cost WHERE month = DATE '2025-11-01'",
    )
    cap_h, used_h, res_h, unres_h, cap_c, used_c, res_c, unres_c = r
    assert (cap_h, used_h, res_h, unres_h) == (4320, 16, 1426, 4320 - 16 - 1426)
    assert used_h + res_h + unres_h == cap_h and used_c + res_c + unres_c == cap_c
    assert (cap_c, used_c, res_c) == (8640, 32, 2852)


def test_estate_use_per_pool(nov):
    r = one(
        nov,
        "SELECT pool, kind, capacity_hours, gpu_hours, idle_hours, used_pct "
        "FROM estate_use WHERE month = DATE '2025-11-01'",
    )
    assert r == ("p1", "kubernetes", 4320, 16, 4304, Decimal("0.4"))


def test_in_use_now(nov):
    open_intervals(nov, [replace(row(3, "2025-11-20T00:00", gpus_milli=2500), pool="p1")])
    r = one(nov, "SELECT pool, kind, capacity, gpus_in_use, tasks, cost_per_hour FROM in_use_now")
    assert r == ("p1", "kubernetes", 8, Decimal("2.5"), 1, 5)


def test_an_idle_pool_in_use_now_says_its_currency(nov):
    """No task open on p1: cost 0 in the currency of its GPU type's price, not NULL."""
    r = one(nov, "SELECT pool, gpus_in_use, tasks, cost_per_hour, currency FROM in_use_now")
    assert r == ("p1", 0, 0, 0, "EUR")


def test_a_statement_bills_reserved_idle_to_the_reserving_group(nov):
    from datetime import date

    from kliqued.ledger.statement import RESERVED_IDLE, build

    paths = {"ml": "ml", "team-a": "ml/team-a"}
    plain = build(nov, "ml", date(2025, 11, 1), paths, "EUR").to_json()
    assert plain["total"] == "32.00"
    st = build(nov, "ml", date(2025, 11, 1), paths, "EUR", reserved_idle=True).to_json()
    idle = [x for x in st["lines"] if x["kind"] == "reserved_idle"]
    assert [(x["group"], x["project"], x["gpu_hours"], x["cost"]) for x in idle] == [
        ("team-a", RESERVED_IDLE, "1426.000000", "2852.00")
    ]
    assert st["total"] == "2884.00"
    assert sum(Decimal(x["cost"]) for x in st["lines"]) == Decimal(st["total"])
