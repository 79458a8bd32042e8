"""Chargeback statements (issue 17, item 2): lines by team, project, user, GPU type and
price; the total to the cent against the ledger; the rounding rule; CSV and HTML."""

from __future__ import annotations

import csv
import io
from datetime import date
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kliqued.ledger import close_intervals, open_intervals
from kliqued.ledger.render import statement_csv, statement_html
from kliqued.ledger.statement import UnknownGroup, allocate_cents, build, round_cent

from .conftest import ms, row, set_prices

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


@pytest.fixture
def ledger(db):
    """Thirds of a cent everywhere: 1/3 GPU for 1 h at 0.01/GPU-hour is 0.00333..."""
    set_prices(
        db,
        ("h100", "2.35", "2026-01-01"),
        ("h100", "1.95", "2026-11-15"),
        ("l4", "0.01", "2026-01-01"),
    )
    a, b, c = PATHS["team-a"], PATHS["team-b"], PATHS["team-c"]
    rows = [
        row(1, "2026-10-31T23:00", group_path=a),  # crosses in
        row(2, "2026-11-02T08:00", group_path=a, project="rlhf", gpus_milli=333),
        row(3, "2026-11-16T08:00", group_path=a, project="rlhf", gpus_milli=333),
        row(
            4,
            "2026-11-03T00:00",
            user="bob",
            group="team-b",
            group_path=b,
            gpu_type="l4",
            gpus_milli=333,
        ),
        row(
            5,
            "2026-11-04T00:00",
            user="bob",
            group="team-b",
            group_path=b,
            gpu_type="l4",
            gpus_milli=333,
            project=None,
        ),
        row(6, "2026-11-05T00:00", user="carl", group="team-c", group_path=c),
        row(7, "2026-11-29T00:00", group_path=a, project="rlhf"),  # open
    ]
    open_intervals(db, rows)
    close_intervals(
        db,
        [
            ("t-1#1", ms("2026-11-01T02:00"), "finished"),
            ("t-2#1", ms("2026-11-02T09:00:00.001"), "finished"),
            ("t-3#1", ms("2026-11-16T09:00:00.001"), "finished"),
            ("t-4#1", ms("2026-11-03T01:00"), "finished"),
            ("t-5#1", ms("2026-11-04T01:00"), "finished"),
            ("t-6#1", ms("2026-11-05T03:00"), "finished"),
        ],
    )
    return db


def statement(db, group, **kw):
    return build(db, group, NOV, PATHS, "EUR", **kw).to_json()


def ledger_total(db, group) -> Decimal:
    """The ledger's own figure: usage_monthly's exact month total, rounded half up once."""
    exact = db.execute(
        "SELECT sum(cost) FROM usage_monthly WHERE month = DATE '2026-11-01' "
        "AND list_contains(string_split(group_path, '/'), ?)",
        [group],
    ).fetchone()[0]
    return exact.quantize(Decimal("0.01"), ROUND_HALF_UP)


@pytest.mark.parametrize("group", ["team-a", "ml", "north", "south", "ops"])
def test_the_total_is_the_ledgers_to_the_cent(ledger, group):
    st_ = statement(ledger, group)
    assert Decimal(st_["total"]) == ledger_total(ledger, group)
    assert sum(Decimal(x["cost"]) for x in st_["lines"]) == Decimal(st_["total"])


def test_lines_by_team_project_user_gpu_type_and_price(ledger):
    st_ = statement(ledger, "ml")
    keys = [
        (x["group"], x["project"], x["user"], x["gpu_type"], x["per_gpu_hour"])
        for x in st_["lines"]
    ]
    assert keys == [
        ("team-a", "llm", "alice", "h100", "2.350000"),
        ("team-a", "rlhf", "alice", "h100", "2.350000"),
        ("team-a", "rlhf", "alice", "h100", "1.950000"),  # the price changed on the 15th
        ("team-b", None, "bob", "l4", "0.010000"),
        ("team-b", "llm", "bob", "l4", "0.010000"),
    ]
    first = st_["lines"][0]
    assert first["gpu_hours"] == "2.000000" and first["cost"] == "4.70"  # the November part
    assert st_["path"] == "north/ml" and st_["period"] == "2026-11"
    assert st_["period_start"] == "2026-11-01T00:00:00Z"
    assert st_["period_end"] == "2026-12-01T00:00:00Z"


def test_cents_lost_to_rounding_go_to_the_largest_remainders(ledger):
    st_ = statement(ledger, "team-b")
    # two lines of 0.333 GPU-hours at 0.01: 0.00333 each, 0.00666 in all -> 0.01
    assert [x["cost"] for x in st_["lines"]] == ["0.01", "0.00"]
    assert st_["total"] == "0.01"


def test_allocate_cents_examples():
    third = Fraction(1, 300)  # a third of a cent, three times: one cent, to the first line
    assert allocate_cents([third, third, third]) == (
        [Decimal("0.01"), Decimal("0.00"), Decimal("0.00")],
        Decimal("0.01"),
    )
    assert allocate_cents([Fraction(5, 1000)]) == ([Decimal("0.01")], Decimal("0.01"))
    lines, total = allocate_cents([Fraction(4, 1000)] * 3)  # 0.012 -> 0.01: one line 0.01
    assert total == Decimal("0.01") and sorted(lines) == [Decimal(0), Decimal(0), Decimal("0.01")]
    assert round_cent(Fraction(1, 200)) == Decimal("0.01")  # half up
    assert round_cent(Fraction(4999, 1_000_000)) == Decimal("0.00")


@given(st.lists(st.fractions(min_value=0, max_value=10_000, max_denominator=10**9), max_size=40))
def test_the_rounding_rule_holds_for_any_lines(exact):
    lines, total = allocate_cents(exact)
    assert sum(lines, Decimal(0)) == total
    assert total == round_cent(sum(exact, Fraction(0)))
    for x, line in zip(exact, lines):
        assert abs(Fraction(str(line)) - x) < Fraction(1, 100)
        assert line >= 0


def test_an_unknown_group_is_a_clear_error(ledger):
    with pytest.raises(UnknownGroup, match="unknown group 'team-z'.*team-a"):
        statement(ledger, "team-z")


def test_a_group_gone_from_the_estate_still_has_its_history(ledger):
    paths = {k: v for k, v in PATHS.items() if k != "team-c"}
    st_ = build(ledger, "team-c", NOV, paths, "EUR").to_json()
    assert st_["path"] == "south/ops/team-c" and st_["total"] == "7.05"


def test_budgets_used(ledger):
    pol = SimpleNamespace(
        name="team-a", group="team-a", budget=SimpleNamespace(hours_milli=100_000, period="month")
    )
    other = SimpleNamespace(
        name="team-c", group="team-c", budget=SimpleNamespace(hours_milli=5_000, period="month")
    )
    st_ = statement(ledger, "ml", policies=[pol, other])
    assert [b["policy"] for b in st_["budgets"]] == ["team-a"]  # team-c is not under ml
    assert st_["budgets"][0]["hours"] == "100"
    assert Decimal(st_["budgets"][0]["used_hours"]) > 2


def test_csv_and_html_show_the_same_numbers(ledger):
    st_ = statement(ledger, "ml")
    rows = list(csv.DictReader(io.StringIO(statement_csv(st_))))
    assert [r["kind"] for r in rows] == ["line"] * len(st_["lines"]) + ["total"]
    assert rows[-1]["cost"] == st_["total"]
    assert sum(Decimal(r["cost"]) for r in rows[:-1]) == Decimal(rows[-1]["cost"])
    assert {r["statement_group"] for r in rows} == {"north/ml"}
    html = statement_html(st_)
    assert html.startswith("<!DOCTYPE html>") and "@page" in html
    assert f"{st_['total']} EUR" in html and "north/ml" in html
    for line in st_["lines"]:
        assert f'<td class="n">{line["cost"]}</td>' in html


def test_html_escapes_names(ledger):
    st_ = statement(ledger, "ml")
    st_["lines"][0]["user"] = "<script>alert(1)</script>"
    assert "<script>alert" not in statement_html(st_)
