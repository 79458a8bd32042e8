"""A contracted price below the list price (issue 17, item 3): ``list_per_gpu_hour`` beside
``per_gpu_hour`` in pricing.yaml, compiled, and copied to the ledger's prices."""

from __future__ import annotations

from decimal import Decimal

import duckdb

from kliqued.ledger import ensure_schema, replace_prices
from tests.harness.typed import present

from .helpers import MINIMAL, codes, compile_text

PRICE = '{gpu_type: h100, per_gpu_hour: 2.5, effective_from: "2026-01-01T00:00:00Z"}'


def test_a_list_price_compiles_and_reaches_the_ledger() -> None:
    res = compile_text(MINIMAL.replace(PRICE, PRICE[:-1] + ", list_per_gpu_hour: 3.40}"))
    assert res.ok, res.diagnostics
    assert present(res.estate).pricing[0].list_per_gpu_hour == "3.4"
    conn = duckdb.connect()
    ensure_schema(conn)
    replace_prices(conn, present(res.estate))
    assert conn.execute("SELECT per_gpu_hour, list_per_gpu_hour FROM prices").fetchall() == [
        (Decimal("2.5"), Decimal("3.4"))
    ]


def test_without_a_list_price_the_revision_is_unchanged() -> None:
    plain = present(compile_text(MINIMAL).estate)
    assert plain.pricing[0].list_per_gpu_hour is None
    assert "list_per_gpu_hour" not in plain.canonical_json()


def test_a_list_price_below_the_price_is_an_error_at_its_place() -> None:
    res = compile_text(MINIMAL.replace(PRICE, PRICE[:-1] + ", list_per_gpu_hour: 2.0}"))
    assert codes(res) == ["list-below-price"]
    d = res.diagnostics[0]
    assert d.pos is not None
    assert d.pos.line == MINIMAL.splitlines().index("pricing:") + 2 and d.pos.col > 60
    assert "list_per_gpu_hour 2.0 is below per_gpu_hour 2.5" in d.message


def test_attribution_settings_compile() -> None:
    text = MINIMAL + "settings:\n  attribution: {reserved_idle: group, overhead_account: it-ovh}\n"
    res = compile_text(text)
    assert res.ok, res.diagnostics
    a = present(present(res.estate).settings.attribution)
    assert (a.reserved_idle, a.overhead_account) == ("group", "it-ovh")
    assert present(compile_text(MINIMAL).estate).settings.attribution is None
    assert "attribution" not in present(compile_text(MINIMAL).estate).canonical_json()


def test_an_overhead_account_named_like_a_group_is_an_error() -> None:
    res = compile_text(MINIMAL + "settings:\n  attribution: {overhead_account: team-a}\n")
    assert codes(res) == ["invalid-value"]
    assert "'team-a' is a group" in res.diagnostics[0].message
    assert present(res.diagnostics[0].pos).line == len(MINIMAL.splitlines()) + 2
    res = compile_text(MINIMAL + "settings:\n  attribution: {reserved_idle: everyone}\n")
    assert not res.ok and "reserved_idle" in str(res.diagnostics[0].message) + str(
        res.diagnostics[0].pos
    )


def test_borrowed_attribution_compiles_and_defaults_to_the_borrower() -> None:
    res = compile_text(MINIMAL + "settings:\n  attribution: {borrowed: split}\n")
    assert res.ok, res.diagnostics
    assert present(present(res.estate).settings.attribution).borrowed == "split"
    assert '"borrowed": "split"' in present(res.estate).canonical_json()
    plain = compile_text(MINIMAL + "settings:\n  attribution: {reserved_idle: group}\n")
    assert present(present(plain.estate).settings.attribution).borrowed == "borrower"
    # the default is left out of the canonical JSON: estates from before it keep their revision
    assert "borrowed" not in present(plain.estate).canonical_json()


def test_an_unknown_borrowed_attribution_is_an_error_at_its_place() -> None:
    res = compile_text(MINIMAL + "settings:\n  attribution:\n    borrowed: lender\n")
    assert not res.ok
    d = res.diagnostics[0]
    assert "borrowed" in d.message + str(d.pos) and "'borrower' or 'split'" in d.message
    assert present(d.pos).line == len(MINIMAL.splitlines()) + 3
