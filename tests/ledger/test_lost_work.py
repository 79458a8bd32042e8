"""Lost work in statements (issue 28, ``settings.attribution.lost_work``): the GPU-hours a
reclaim or rebalance threw away stay the owner's (the default: statements as before), move to
the taker (the owner credited, the taker billed) or to overhead (the owner credited), at the
price in force at the preemption; a budget's lost work stays the owner's. Figures by hand."""

from __future__ import annotations

from datetime import date
from decimal import Decimal
from fractions import Fraction

import pytest

from kliqued.ledger import close_intervals, open_intervals
from kliqued.ledger.lost import PreemptionRow, write_duck
from kliqued.ledger.render import statement_csv, statement_html
from kliqued.ledger.statement import LOST_TAKEN, build

from .conftest import H, ms, row, set_prices

NOV = date(2026, 11, 1)
PATHS = {
    "north": "north",
    "ml": "north/ml",
    "team-a": "north/ml/team-a",
    "team-b": "north/ml/team-b",
    "south": "south",
    "ops": "south/ops",
    "team-c": "south/ops/team-c",
}


def preemption(
    n: int,
    at: str,
    lost_ms: int,
    gpus_milli: int,
    taker: str | None,
    project: str = "llm",
    kind: str = "reclaimed",
) -> PreemptionRow:
    return PreemptionRow(
        interval_id=f"t-{n}#1",
        task=f"t-{n}",
        user="alice",
        project=project,
        group="team-a",
        group_path=PATHS["team-a"],
        policy="team-a",
        pool="onprem-k8s",
        gpu_type="h100",
        gpus_milli=gpus_milli,
        at_ms=ms(at),
        kind=kind,
        reason=f"reclaimed by {taker}" if taker else "budget used up",
        taker=taker,
        taker_path=PATHS.get(taker or ""),
        lost_ms=lost_ms,
        revision="sha256:test",
    )


@pytest.fixture
def ledger(db):
    """h100 at 2.35 until 2026-11-15, then 1.95. team-a's three placements, each preempted:
    by team-c (2 GPUs, 90 min lost: 3 GPU-hours at 2.35 = 7.05), by team-b after the price
    change (1 GPU, 30 min: 0.5 at 1.95 = 0.975), and by its budget (1 GPU, 1 h at 1.95: no
    taker). team-c ran 2 GPU-hours of its own (4.70)."""
    set_prices(db, ("h100", "2.35", "2026-01-01"), ("h100", "1.95", "2026-11-15"))
    rows = [
        row(1, "2026-11-10T08:00", gpus_milli=2000, group_path=PATHS["team-a"]),
        row(2, "2026-11-20T08:00", project="rlhf", group_path=PATHS["team-a"]),
        row(3, "2026-11-21T08:00", group_path=PATHS["team-a"]),
        row(
            4,
            "2026-11-10T09:30",
            user="carl",
            group="team-c",
            gpus_milli=2000,
            group_path=PATHS["team-c"],
        ),
    ]
    open_intervals(db, rows)
    close_intervals(
        db,
        [
            ("t-1#1", ms("2026-11-10T09:30"), "reclaimed by team-c"),
            ("t-2#1", ms("2026-11-20T08:30"), "reclaimed by team-b"),
            ("t-3#1", ms("2026-11-21T09:00"), "budget used up"),
            ("t-4#1", ms("2026-11-10T10:30"), "finished"),
        ],
    )
    write_duck(
        db,
        [
            preemption(1, "2026-11-10T09:30", 90 * 60_000, 2000, "team-c"),
            preemption(2, "2026-11-20T08:30", 30 * 60_000, 1000, "team-b", project="rlhf"),
            preemption(3, "2026-11-21T09:00", H, 1000, None, kind="budget"),
        ],
    )
    return db


def statement(db, group: str, lost_work: str) -> dict:
    return build(db, group, NOV, PATHS, "EUR", lost_work=lost_work).to_json()


def lost(st: dict) -> list[tuple[str, str | None, str, str, str]]:
    return [
        (x["kind"], x["project"], x["group"], x["gpu_hours"], x["cost"])
        for x in st["lines"]
        if x["kind"].startswith("lost_work")
    ]


def test_owner_is_the_default_and_keeps_statements_as_they_were(ledger) -> None:
    st = build(ledger, "team-a", NOV, PATHS, "EUR").to_json()
    assert st["lost_work"] == "owner" and lost(st) == []
    # usage only: 2 GPUs x 1.5 h x 2.35 + 0.5 h x 1.95 + 1 h x 1.95
    assert st["total"] == "9.98" and Decimal(st["exact_total"]) == Decimal("9.975")


def test_taker_credits_the_owner_and_bills_the_taker(ledger) -> None:
    a = statement(ledger, "team-a", "taker")
    assert lost(a) == [
        ("lost_work_credit", "llm", "team-a", "3.000000", "-7.05"),
        ("lost_work_credit", "rlhf", "team-a", "0.500000", "-0.97"),
    ]
    assert Decimal(a["exact_total"]) == Decimal("9.975") - Decimal("7.05") - Decimal("0.975")
    assert a["total"] == "1.95"  # the budget's hour stays team-a's
    c = statement(ledger, "team-c", "taker")
    assert lost(c) == [("lost_work_taken", LOST_TAKEN, "team-c", "3.000000", "7.05")]
    assert c["total"] == str(Decimal("4.70") + Decimal("7.05"))  # its own 2 GPU-hours too
    b = statement(ledger, "team-b", "taker")
    assert lost(b) == [("lost_work_taken", LOST_TAKEN, "team-b", "0.500000", "0.98")]
    # team-a and team-b share "ml": team-b's take nets out, team-c's is outside
    ml = statement(ledger, "ml", "taker")
    assert Fraction(ml["exact_total"]) == Fraction("9.975") - Fraction("7.05")
    # the taker's line names none of the owner's users or projects
    assert {x["user"] for x in c["lines"] if x["kind"] == "lost_work_taken"} == {""}


def test_overhead_credits_the_owner_and_bills_no_group(ledger) -> None:
    a = statement(ledger, "team-a", "overhead")
    assert [x[:2] for x in lost(a)] == [("lost_work_credit", "llm"), ("lost_work_credit", "rlhf")]
    assert a["total"] == "1.95"
    assert lost(statement(ledger, "team-c", "overhead")) == []
    assert statement(ledger, "team-c", "overhead")["total"] == "4.70"


def test_a_group_admin_sees_the_lines_of_their_subtree_only(ledger) -> None:
    c = build(ledger, "team-c", NOV, PATHS, "EUR", lost_work="taker", visible=["team-a"]).to_json()
    assert lost(c) == []


def test_csv_and_html_say_who_pays(ledger) -> None:
    st = statement(ledger, "team-a", "taker")
    text = statement_csv(st)
    assert ",lost_work_credit,team-a,llm,alice,h100,2.350000," in text
    assert "billed to the group that took the GPUs back" in statement_html(st)
