"""Borrowed and lent GPU-hours (issue 17, item 3: ``settings.attribution.borrowed``).

A small estate computed by hand: pool p1 has 4 H100s at 2.35 an hour in November 2025; in
department ml, team-a reserves 2 and team-b 1.

- team-b: t-1 (1 GPU) 00:00-10:00 on the 2nd, within its reservation; t-2 (2 GPUs)
  02:00-08:00, its newest placement, so borrowed: 12 GPU-hours.
- team-a: t-3 (1 GPU) 04:00-06:00, leaving 2 reserved GPUs idle, 1 from 04:00 to 06:00.
- lent (borrowed GPUs on team-a's idle reservation): 2 x 2 h + 1 x 2 h + 2 x 2 h = 10 GPU-h;
  the other 2 borrowed GPU-hours ran on the unreserved GPU.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import date
from decimal import Decimal
from fractions import Fraction
from types import SimpleNamespace

import pytest

from kliqued.ledger import close_intervals, open_intervals
from kliqued.ledger.capacity import record_estate
from kliqued.ledger.statement import build

from .conftest import ms, row, set_prices

PRICE = Decimal("2.35")
PATHS = {"ml": "ml", "team-a": "ml/team-a", "team-b": "ml/team-b"}
NOV = date(2025, 11, 1)
HOURS = 30 * 24


def estate(reservations: dict[str, int], capacity_milli: int = 4000, revision="sha256:a"):
    pool = SimpleNamespace(
        name="p1", kind="kubernetes", gpu_type="h100", capacity_milli=capacity_milli
    )
    return SimpleNamespace(
        revision=revision,
        pools=[pool],
        profiles=[SimpleNamespace(name="one", pools=["p1"])],
        groups=[SimpleNamespace(name="ml", ancestors=[])]
        + [SimpleNamespace(name=g, ancestors=["ml"]) for g in reservations],
        policies=[
            SimpleNamespace(name=g, group=g, envelope=False, reservation_milli=r, profiles=["one"])
            for g, r in reservations.items()
        ],
    )


def iv(n: int, group: str, start: str, gpus: int = 1):
    return replace(
        row(n, start, group=group, group_path=f"ml/{group}", gpus_milli=gpus * 1000), pool="p1"
    )


@pytest.fixture
def lent(db):
    set_prices(db, ("h100", str(PRICE), "2025-01-01"))
    assert record_estate(db, estate({"team-a": 2000, "team-b": 1000}), ms("2025-11-01T00:00"))
    open_intervals(
        db,
        [
            iv(1, "team-b", "2025-11-02T00:00"),
            iv(2, "team-b", "2025-11-02T02:00", gpus=2),
            iv(3, "team-a", "2025-11-02T04:00"),
        ],
    )
    close_intervals(
        db,
        [
            ("t-1#1", ms("2025-11-02T10:00"), "finished"),
            ("t-2#1", ms("2025-11-02T08:00"), "finished"),
            ("t-3#1", ms("2025-11-02T06:00"), "finished"),
        ],
    )
    return db


def rows(db, sql):
    return db.execute(sql).fetchall()


def test_the_newest_placements_are_the_borrowed_ones_and_lent_from_idle_reservations(lent):
    assert rows(
        lent,
        'SELECT interval_id, "group", department, borrowed_hours, lent_hours, '
        "lent_cost FROM borrowed_usage ORDER BY interval_id",
    ) == [("t-2#1", "team-b", "ml", 12, 10, 10 * PRICE)]


def test_reserved_idle_leaves_out_what_was_lent(lent):
    assert rows(
        lent,
        "SELECT policy, reserved_hours, idle_hours, lent_hours, idle_cost, "
        "lent_cost FROM reserved_idle WHERE month = DATE '2025-11-01' "
        "ORDER BY policy",
    ) == [
        ("team-a", 2 * HOURS, 2 * HOURS - 2 - 10, 10, (2 * HOURS - 12) * PRICE, 10 * PRICE),
        ("team-b", HOURS, HOURS - 10, 0, (HOURS - 10) * PRICE, 0),
    ]


def test_no_gpu_hour_is_counted_twice_and_the_capacity_adds_up(lent):
    (
        (cap_h, used_h, res_h, unres_h, cap_c, used_c, res_c, unres_c, borrowed_h, lent_h, lent_c),
    ) = rows(
        lent,
        "SELECT capacity_hours, used_hours, reserved_idle_hours, "
        "unreserved_idle_hours, capacity_cost, used_cost, "
        "reserved_idle_cost, unreserved_idle_cost, borrowed_hours, "
        "lent_hours, lent_cost FROM idle_cost "
        "WHERE month = DATE '2025-11-01'",
    )
    assert (cap_h, used_h, borrowed_h, lent_h) == (4 * HOURS, 24, 12, 10)
    # unreserved: 1 GPU all month less the 2 borrowed GPU-hours that ran on it
    assert (res_h, unres_h) == ((2 * HOURS - 12) + (HOURS - 10), HOURS - 2)
    assert used_h + res_h + unres_h == cap_h and used_c + res_c + unres_c == cap_c
    assert unres_c == (HOURS - 2) * PRICE and lent_c == 10 * PRICE


def _total(db, group, **kw):
    return build(db, group, NOV, PATHS, "EUR", **kw).to_json()


def test_borrower_pays_by_default(lent):
    b, a = _total(lent, "team-b"), _total(lent, "team-a")
    assert b["total"] == str((22 * PRICE).quantize(Decimal("0.01")))  # 10 + 12 GPU-h
    assert a["total"] == str((2 * PRICE).quantize(Decimal("0.01")))
    assert all(x["kind"] == "usage" for x in b["lines"] + a["lines"])


def test_split_halves_the_lent_hours_between_borrower_and_lender(lent):
    half_lent = 10 * PRICE / 2  # 11.75
    b = _total(lent, "team-b", borrowed="split")
    a = _total(lent, "team-a", borrowed="split")
    assert Decimal(b["total"]) == 22 * PRICE - half_lent == Decimal("39.95")
    assert Decimal(a["total"]) == 2 * PRICE + half_lent == Decimal("16.45")
    credit = [x for x in b["lines"] if x["kind"] == "borrowed_split"]
    share = [x for x in a["lines"] if x["kind"] == "lent_split"]
    assert [(x["project"], x["user"], x["gpu_hours"], x["cost"]) for x in credit] == [
        ("llm", "alice", "10.000000", "-11.75")
    ]
    assert [(x["project"], x["gpu_hours"], x["cost"]) for x in share] == [
        ("(lent: half of what others borrowed)", "10.000000", "11.75")
    ]
    # the department pays the same either way: its teams' credits and shares cancel out
    assert (
        _total(lent, "ml", borrowed="split")["total"]
        == _total(lent, "ml")["total"]
        == str((24 * PRICE).quantize(Decimal("0.01")))
    )
    for st in (a, b):
        assert sum(Decimal(x["cost"]) for x in st["lines"]) == Decimal(st["total"])


def test_split_statement_matches_the_ledger_views_to_the_cent(lent):
    """The statement's figures against the views finance queries."""
    b = _total(lent, "team-b", borrowed="split", reserved_idle=True)
    ((usage,),) = rows(lent, "SELECT sum(cost) FROM usage_monthly WHERE \"group\" = 'team-b'")
    ((lent_cost,),) = rows(
        lent, "SELECT sum(lent_cost) FROM borrowed_usage WHERE \"group\" = 'team-b'"
    )
    ((idle,),) = rows(
        lent,
        "SELECT idle_cost FROM reserved_idle WHERE policy = 'team-b' AND month = DATE '2025-11-01'",
    )
    assert Decimal(b["total"]) == (usage - lent_cost / 2 + idle).quantize(Decimal("0.01"))
    a = _total(lent, "team-a", borrowed="split", reserved_idle=True)
    ((lent_a, idle_a),) = rows(
        lent,
        "SELECT lent_cost, idle_cost FROM reserved_idle "
        "WHERE policy = 'team-a' AND month = DATE '2025-11-01'",
    )
    assert Decimal(a["total"]) == (2 * PRICE + lent_a / 2 + idle_a).quantize(Decimal("0.01"))


def test_pro_rata_shares(db):
    """Three lenders with 1, 2 and 4 idle GPUs and two borrowers (no reservation) with 3 and
    6: 7 lent GPUs are shared 1:2:4 among the lenders and 1:2 among the borrowers, each share
    in whole thousandths of a GPU-millisecond within half a unit of exact."""
    set_prices(db, ("h100", "3.00", "2025-01-01"))
    record_estate(
        db, estate({"a": 1000, "b": 2000, "c": 4000}, capacity_milli=16000), ms("2025-11-01T00:00")
    )
    open_intervals(
        db, [iv(1, "x", "2025-11-02T00:00", gpus=3), iv(2, "y", "2025-11-02T00:00", gpus=6)]
    )
    close_intervals(
        db,
        [
            ("t-1#1", ms("2025-11-02T00:00") + 1001, "finished"),
            ("t-2#1", ms("2025-11-02T00:00") + 1001, "finished"),
        ],
    )
    got = dict(
        rows(
            db,
            "SELECT coalesce(interval_id, policy), sum(lent_mms) FROM "
            "lending_pieces WHERE lent_mms > 0 GROUP BY ALL",
        )
    )
    whole = 7000 * 1001
    exact = {
        "a": Fraction(whole, 7),
        "b": Fraction(2 * whole, 7),
        "c": Fraction(4 * whole, 7),
        "t-1#1": Fraction(whole, 3),
        "t-2#1": Fraction(2 * whole, 3),
    }
    assert set(got) == set(exact)
    assert all(abs(got[k] - v) <= Fraction(1, 2) for k, v in exact.items())
    assert abs(sum(got[k] for k in "abc") - whole) <= 1
    assert abs(sum(got[k] for k in ("t-1#1", "t-2#1")) - whole) <= 1


def test_no_reservation_recorded_no_borrowing_said(db):
    """Before any estate snapshot the reservations are unknown: nothing is derived."""
    set_prices(db, ("h100", "2.00", "2025-01-01"))
    open_intervals(db, [iv(1, "team-b", "2025-11-02T00:00", gpus=2)])
    assert rows(db, "SELECT count(*) FROM borrowed_usage") == [(0,)]


def test_finance_sql_reads_the_new_view_and_not_the_internal_one(lent):
    from kliqued.ledger import LedgerSqlError, run_readonly

    res = run_readonly(lent.cursor(), "SELECT interval_id, lent_hours FROM borrowed_usage")
    assert res.rows == [["t-2#1", "10.000000"]] or [list(r) for r in res.rows] == [
        ["t-2#1", Decimal(10)]
    ]
    with pytest.raises(LedgerSqlError, match="lending_pieces"):
        run_readonly(lent.cursor(), "SELECT * FROM lending_pieces")


def test_a_group_admin_sees_what_their_team_lent_but_not_the_borrower(lent):
    """The lending is derived over the whole estate, then the admin's rows are kept: team-a's
    admin sees the 10 GPU-hours team-a lent, not team-b's intervals."""
    from kliqued.ledger import run_readonly

    q = (
        "SELECT (SELECT count(*) FROM borrowed_usage), (SELECT lent_hours FROM reserved_idle "
        "WHERE month = DATE '2025-11-01' AND policy = 'team-a'), (SELECT count(*) FROM "
        "reserved_idle WHERE policy = 'team-b')"
    )
    res = run_readonly(lent.cursor(), q, groups=["team-a"])
    assert [str(v) for v in res.rows[0]] == ["0", "10.000000", "0"]
    st = build(lent, "team-a", NOV, PATHS, "EUR", visible=["team-a"], borrowed="split")
    assert st.to_json()["total"] == "16.45"


def test_split_lines_in_the_csv_and_the_printable_page(lent):
    from kliqued.ledger.render import statement_csv, statement_html

    b = _total(lent, "team-b", borrowed="split")
    assert b["borrowed"] == "split" and b["gpu_hours"] == "22.000000"  # usage only
    csv_text = statement_csv(b)
    assert "2025-11,ml/team-b,EUR,borrowed_split,team-b,llm,alice,h100,2.350000," in csv_text
    assert csv_text.rstrip().endswith(",22.000000,16.000000,39.95")
    page = statement_html(b)
    assert "llm (borrowed: half paid by the lenders)" in page and "-11.75" in page


def _focus(db, **kw):
    import csv
    import io

    from kliqued.ledger.focus import focus_csv

    return list(csv.DictReader(io.StringIO("".join(focus_csv(db, NOV, **kw)))))


def test_focus_with_split_credits_the_borrower_and_charges_the_lender(lent):
    assert {r["ChargeCategory"] for r in _focus(lent)} == {"Usage"}  # borrower: as before
    rows = _focus(lent, borrowed="split")
    split = [r for r in rows if r["ChargeCategory"] != "Usage"]
    assert [
        (
            r["ChargeCategory"],
            r["SubAccountId"],
            r["ResourceId"],
            r["PricingQuantity"],
            r["BilledCost"],
            r["EffectiveCost"],
            r["ConsumedQuantity"],
        )
        for r in split
    ] == [
        ("Credit", "ml/team-b", "t-2", "10.000000", "-11.750000", "-11.750000", ""),
        ("Adjustment", "ml/team-a", "team-a", "10.000000", "11.750000", "11.750000", ""),
    ]
    assert split[0]["x_IntervalId"] == "t-2#1" and split[0]["InvoiceId"] == "2025-11/ml/team-b"
    assert (split[0]["ChargePeriodStart"], split[0]["ChargePeriodEnd"]) == (
        "2025-11-01T00:00:00Z",
        "2025-12-01T00:00:00Z",
    )
    # each team's FOCUS charges add up to its statement
    for team in ("team-a", "team-b"):
        billed = sum(Decimal(r["BilledCost"]) for r in rows if r["SubAccountName"] == team)
        assert billed.quantize(Decimal("0.01")) == Decimal(
            _total(lent, team, borrowed="split")["total"]
        )
    assert {r["SubAccountName"] for r in _focus(lent, borrowed="split", groups=["team-a"])} == {
        "team-a"
    }


def test_the_focus_validator_accepts_the_split_rows(lent, tmp_path):
    from kliqued.ledger.focus import focus_csv
    from tests.ledger.focus_validate import validate

    path = tmp_path / "focus.csv"
    path.write_text("".join(focus_csv(lent, NOV, borrowed="split")))
    failures = validate(path)
    assert failures == [], "\n".join(failures)


def test_the_cio_figures_show_who_borrowed_and_who_lent(lent):
    from kliqued.ledger.cio import figures

    out = figures(lent, NOV)
    assert [
        (r["group"], str(r["borrowed_hours"]), str(r["borrowed_lent_hours"]), str(r["lent_hours"]))
        for r in out["lending"]
    ] == [
        ("team-a", "0.000000", "0.000000", "10.000000"),
        ("team-b", "12.000000", "10.000000", "0.000000"),
    ]
    assert (str(out["idle"]["borrowed_hours"]), str(out["idle"]["lent_hours"])) == (
        "12.000000",
        "10.000000",
    )


def test_a_months_pieces_alone_are_the_views_pieces_of_that_month(lent):
    """Statements and exports derive only their month (lending.month_pieces): the same
    pieces as the whole ledger's view, also for intervals that cross the month's ends."""
    from kliqued.ledger.lending import month_pieces

    open_intervals(
        lent,
        [iv(4, "team-b", "2025-10-31T20:00", gpus=3), iv(5, "team-a", "2025-11-30T22:00", gpus=4)],
    )
    close_intervals(
        lent,
        [
            ("t-4#1", ms("2025-11-01T03:00"), "finished"),
            ("t-5#1", ms("2025-12-01T02:00"), "finished"),
        ],
    )
    q = (
        "SELECT side, coalesce(interval_id, policy), piece_start, borrowed_mms, idle_mms, "
        "reserved_mms, lent_mms FROM {} WHERE month = DATE '2025-11-01' ORDER BY ALL"
    )
    view = rows(lent, q.format("lending_pieces"))
    with month_pieces(lent, NOV) as pieces:
        assert rows(lent, q.format(pieces)) == view
    assert {r[1] for r in view if r[3]} == {"t-2#1", "t-4#1", "t-5#1"}


@pytest.mark.parametrize("borrowed", ["borrower", "split"])
def test_the_statements_and_overhead_add_up_to_the_capacity(lent, borrowed):
    """Whoever pays for lent GPU-hours, the department's statement (usage, reserved idle,
    split lines) and the overhead (unreserved idle) bill the capacity's cost once."""
    st = _total(lent, "ml", borrowed=borrowed, reserved_idle=True)
    ((capacity, unreserved),) = rows(
        lent,
        "SELECT capacity_cost, unreserved_idle_cost FROM idle_cost WHERE month = DATE '2025-11-01'",
    )
    assert capacity == 4 * HOURS * PRICE
    assert Decimal(st["total"]) + unreserved == capacity


@pytest.mark.slow  # long on its own: make test, not make check
def test_the_cio_figures_derive_the_month_alone_with_the_same_answer(lent):
    """figures() reads the month's lending pieces only; finance's SQL, the whole ledger's."""
    from kliqued.ledger import run_readonly
    from kliqued.ledger.cio import QUERIES, figures

    month = "DATE '2025-11-01'"
    for groups in (None, ["team-a"]):
        out = figures(lent, NOV, groups=groups)
        for name in ("idle", "lending"):
            res = run_readonly(lent.cursor(), QUERIES[name].format(month=month), groups=groups)
            whole = [dict(zip(res.columns, r)) for r in res.rows]
            assert (out[name] if name == "lending" else [out[name]]) == whole
