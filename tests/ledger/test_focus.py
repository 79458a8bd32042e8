"""The FOCUS export (issue 17, item 1): one billing period of the ledger as a FOCUS dataset,
checked by the FOCUS Foundation's validator for the 1.0 rules and here against the 1.2
specification's column list (tests/ledger/focus_spec.py) for what 1.1 and 1.2 added."""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import replace
from datetime import date
from decimal import Decimal

import pytest

from kliqued.ledger import close_intervals, open_intervals
from kliqued.ledger.export import csv_to_parquet, parquet_columns
from kliqued.ledger.focus import COLUMNS, NoPrice, focus_csv, parse_period

from . import focus_spec
from .conftest import ms, row, set_prices

NOV = date(2026, 11, 1)


@pytest.fixture
def nov(db):
    """November 2026: a price change on the 15th, an interval crossing into November from
    October, one crossing out into December, fractional GPUs, a list price above the
    contracted one for one period, an interval with no project, and two teams of two
    business units."""
    set_prices(
        db,
        ("h100", "2.35", "2026-01-01"),
        ("h100", "1.95", "2026-11-15"),
        ("l4", "0.35", "2026-01-01"),
    )
    db.execute(
        "UPDATE prices SET list_per_gpu_hour = 3.10 WHERE gpu_type = 'h100' "
        "AND effective_from = TIMESTAMP '2026-11-15'"
    )
    a, b = "north/ml/team-a", "south/ops/team-b"
    open_intervals(
        db,
        [
            row(1, "2026-10-31T22:00", group_path=a),  # crosses in
            replace(
                row(2, "2026-11-03T09:00:00.250", gpus_milli=500, group_path=a, project=None),
                channel="pipeline",
            ),
            row(3, "2026-11-20T10:00", user="bob", group="team-b", group_path=b, gpus_milli=2000),
            row(4, "2026-11-30T23:30", gpu_type="l4", group_path=a),  # crosses out
            row(5, "2026-12-02T00:00", group_path=a),  # December only
        ],
    )
    close_intervals(
        db,
        [
            ("t-1#1", ms("2026-11-01T01:00"), "finished"),
            ("t-2#1", ms("2026-11-03T10:30:00.750"), "failed"),
            ("t-3#1", ms("2026-11-20T13:00"), "finished"),
            ("t-4#1", ms("2026-12-01T00:30"), "finished"),
            ("t-5#1", ms("2026-12-02T01:00"), "finished"),
        ],
    )
    return db


def rows_of(conn, period=NOV, groups=None) -> list[dict]:
    return list(csv.DictReader(io.StringIO("".join(focus_csv(conn, period, groups=groups)))))


def test_one_row_per_piece_of_the_period_with_its_real_meaning(nov):
    rows = rows_of(nov)
    assert [r["x_IntervalId"] for r in rows] == ["t-1#1", "t-2#1", "t-3#1", "t-4#1"]
    r1, r2, r3, r4 = rows
    # charge periods inside the billing period: the crossing pieces are cut at the month
    assert r1["ChargePeriodStart"] == "2026-11-01T00:00:00Z"
    assert r1["ChargePeriodEnd"] == "2026-11-01T01:00:00Z"
    assert r4["ChargePeriodEnd"] == "2026-12-01T00:00:00Z"
    assert {r["BillingPeriodStart"] for r in rows} == {"2026-11-01T00:00:00Z"}
    assert {r["BillingPeriodEnd"] for r in rows} == {"2026-12-01T00:00:00Z"}
    # whole seconds that cover the charge (FOCUS has no fraction of a second)
    assert r2["ChargePeriodStart"] == "2026-11-03T09:00:00Z"
    assert r2["ChargePeriodEnd"] == "2026-11-03T10:30:01Z"
    # quantities exact from the milliseconds: 0.5 GPU x 1.5 h + 0.5 s
    assert r2["x_ChargeMs"] == str(90 * 60_000 + 500)
    assert Decimal(r2["ConsumedQuantity"]) == Decimal("0.750069")
    assert r2["PricingQuantity"] == r2["ConsumedQuantity"]
    assert r2["ConsumedUnit"] == r2["PricingUnit"] == "GPU-Hours"
    # the price in force at the piece's start; list = contracted unless the estate says
    assert r1["ContractedUnitPrice"] == "2.350000" and r1["ListUnitPrice"] == "2.350000"
    assert r1["BilledCost"] == r1["EffectiveCost"] == r1["ContractedCost"] == "2.350000"
    assert r1["ListCost"] == "2.350000"
    assert r3["ContractedUnitPrice"] == "1.950000" and r3["ListUnitPrice"] == "3.100000"
    assert r3["BilledCost"] == "11.700000" and r3["ListCost"] == "18.600000"
    assert r3["SkuPriceId"] == "h100@2026-11-15T00:00:00Z" and r3["SkuId"] == "h100"
    # accounts: the top group, the team with its path; the invoice is the team's month
    assert (r1["BillingAccountId"], r3["BillingAccountId"]) == ("north", "south")
    assert r3["SubAccountId"] == "south/ops/team-b" and r3["SubAccountName"] == "team-b"
    assert r3["InvoiceId"] == "2026-11/south/ops/team-b"
    assert (r3["x_BusinessUnit"], r3["x_Department"]) == ("south", "ops")
    tags = json.loads(r2["Tags"])
    assert tags == {
        "klique/user": "alice",
        "klique/project": None,
        "klique/pool": "onprem-k8s",
        "klique/gpu_type": "h100",
        "klique/policy": "team-a",
        "klique/profile": "standard",
        "klique/group": "team-a",
        "klique/channel": "pipeline",
    }
    assert r4["BillingCurrency"] == "EUR" and r4["ChargeCategory"] == "Usage"
    assert r4["ResourceId"] == "t-4" and r4["ChargeFrequency"] == "Usage-Based"


def test_costs_add_up_to_the_ledgers_month_pieces(nov):
    rows = rows_of(nov)
    total = sum(Decimal(r["BilledCost"]) for r in rows)
    ledger = nov.execute(
        "SELECT sum(cost) FROM usage_by_month WHERE month = DATE '2026-11-01'"
    ).fetchone()[0]
    assert total == ledger


def test_a_group_admin_gets_their_subtree_only(nov):
    assert {r["SubAccountId"] for r in rows_of(nov, groups=["ops"])} == {"south/ops/team-b"}


def test_usage_without_a_price_names_the_gpu_types(nov):
    nov.execute("DELETE FROM prices WHERE gpu_type = 'l4'")
    with pytest.raises(NoPrice) as exc:
        rows_of(nov)
    assert exc.value.gpu_types == ["l4"]
    assert "l4" in str(exc.value) and "2026-11" in str(exc.value)
    assert rows_of(nov, date(2026, 10, 1))  # October has only h100: fine


@pytest.mark.parametrize("text", ["2026-13", "2026-1", "nov", "2026-11-01", ""])
def test_a_bad_period_says_the_form(text):
    with pytest.raises(ValueError, match="YYYY-MM"):
        parse_period(text)


# --- the FOCUS 1.2 specification's columns and the rules 1.1 and 1.2 added -------------------

SPEC = {c: (level, typ, nulls) for c, level, typ, nulls, _ in focus_spec.COLUMNS_1_2}
DECIMAL = re.compile(r"^-?\d+(\.\d+)?$")
DATETIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")


def test_every_column_is_a_focus_1_2_column_or_a_custom_x_column():
    names = [n for n, _, _ in COLUMNS]
    assert len(names) == len(set(names))
    for name in names:
        assert name in SPEC or name.startswith("x_"), name


def test_every_mandatory_1_2_column_is_present_and_filled(nov):
    rows = rows_of(nov)
    for name, (level, typ, nulls) in SPEC.items():
        if level != "Mandatory":
            continue
        assert name in rows[0], f"mandatory FOCUS 1.2 column {name} is missing"
        if not nulls:
            assert all(r[name] != "" for r in rows), name


def test_values_have_their_focus_types(nov):
    for r in rows_of(nov):
        for name, value in r.items():
            if name not in SPEC or value == "":
                continue
            typ = SPEC[name][1]
            if typ == "Decimal":
                assert DECIMAL.match(value), (name, value)
            elif typ == "Date/Time":
                assert DATETIME.match(value), (name, value)
            elif typ == "JSON":
                assert isinstance(json.loads(value), dict), (name, value)


def test_the_columns_1_1_and_1_2_added_follow_their_rules(nov):
    rows = rows_of(nov)
    present = set(rows[0])
    # 1.1 ServiceSubcategory: one of the allowed values, under its one parent category
    assert {
        "ServiceSubcategory",
        "SkuMeter",
        "SkuPriceDetails",
        "BillingAccountType",
        "SubAccountType",
        "InvoiceId",
    } <= present
    assert present & focus_spec.ADDED_AFTER_1_0 >= {
        "CapacityReservationId",
        "CapacityReservationStatus",
    }
    for r in rows:
        assert (r["ServiceCategory"], r["ServiceSubcategory"]) in focus_spec.SERVICE_SUBCATEGORIES
        # 1.1 SkuMeter: null exactly when SkuId is null
        assert (r["SkuMeter"] == "") == (r["SkuId"] == "")
        # 1.1 SkuPriceDetails: null when SkuPriceId is; keys FOCUS-defined or x_
        details = json.loads(r["SkuPriceDetails"])
        assert r["SkuPriceId"] != "" and all(k.startswith("x_") for k in details)
        # 1.2 BillingAccountType / SubAccountType: not null when their id is not
        assert r["BillingAccountType"] != "" and r["SubAccountType"] != ""
        # 1.2 InvoiceId: a string naming the billing period (the team's statement)
        assert r["InvoiceId"].startswith("2026-11/")
        # 1.1 capacity reservations: usage rows are related to none (status null with id)
        assert r["CapacityReservationId"] == "" and r["CapacityReservationStatus"] == ""
        # 1.1 CommitmentDiscountQuantity/Unit and 1.2 PricingCurrency*: Klique has neither
        # commitment discounts nor a second currency, so they are absent, as FOCUS allows
    assert not present & {
        "CommitmentDiscountQuantity",
        "CommitmentDiscountUnit",
        "PricingCurrency",
        "PricingCurrencyEffectiveCost",
    }


def test_parquet_keeps_the_focus_types(nov, tmp_path):
    src = tmp_path / "focus.csv"
    src.write_text("".join(focus_csv(nov, NOV)))
    assert csv_to_parquet(src, tmp_path / "focus.parquet", parquet_columns("focus")) == 4
    import duckdb

    con = duckdb.connect()
    types = {
        r[0]: r[1]
        for r in con.execute(f"DESCRIBE SELECT * FROM '{tmp_path / 'focus.parquet'}'").fetchall()
    }
    assert types["BilledCost"] == "DECIMAL(18,6)"
    assert types["ChargePeriodStart"] == "TIMESTAMP WITH TIME ZONE"  # UTC instants
    total = con.execute(f"SELECT sum(BilledCost) FROM '{tmp_path / 'focus.parquet'}'").fetchone()
    assert total[0] == sum(Decimal(r["BilledCost"]) for r in rows_of(nov))


# --- the FOCUS Foundation's validator, for the 1.0 rules -------------------------------------


def test_the_focus_validator_accepts_the_export(nov, tmp_path):
    from tests.ledger.focus_validate import validate

    path = tmp_path / "focus.csv"
    path.write_text("".join(focus_csv(nov, NOV)))
    failures = validate(path)
    assert failures == [], "\n".join(failures)


def test_the_validator_catches_a_broken_export(nov, tmp_path):
    """The validator run above can fail: a bad currency and a missing mandatory column."""
    from tests.ledger.focus_validate import validate

    rows = rows_of(nov)
    for r in rows:
        r["BillingCurrency"] = "EURO"
        del r["BilledCost"]
    path = tmp_path / "broken.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    failures = validate(path)
    assert any(f.startswith("BilledCost_Required") for f in failures), failures
    assert any(f.startswith("BillingCurrency_IsCurrencyCode") for f in failures), failures


def test_the_focus_validator_accepts_the_parquet_export(nov, tmp_path):
    """The Parquet export too, not only the CSV (issue 32): the validator reads its types."""
    from tests.ledger.focus_validate import PARQUET_DECIMAL, validate

    src = tmp_path / "focus.csv"
    src.write_text("".join(focus_csv(nov, NOV)))
    out = tmp_path / "focus.parquet"
    csv_to_parquet(src, out, parquet_columns("focus"))
    failures = validate(out)
    assert failures == [], "\n".join(failures)
    # what replaces the validator's float-only *_IsDecimal checks (focus_validate.py): each
    # of those columns is FOCUS's Decimal, exactly, in the file
    import duckdb

    described = duckdb.sql(f"DESCRIBE SELECT * FROM '{out}'").fetchall()
    types = {r[0]: r[1] for r in described}
    assert all(types[c].startswith("DECIMAL(") for c in PARQUET_DECIMAL), types
