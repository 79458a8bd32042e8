"""One rule for hours and costs (issue 10, bugs 10 and 14)."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from klique_util.fmt import amount, percent


@pytest.mark.parametrize(
    "value,text",
    [
        (0, "0"),
        (-0.0, "0"),
        (None, "-"),
        (12.0, "12"),
        (1234.56, "1235"),
        (12.345, "12.3"),
        (0.04, "0.04"),
        (0.0004, "0.0004"),
        (-0.0004, "-0.0004"),
        (2.2e-05, "0.000022"),
        (0.1834, "0.183"),
        (-0.02, "-0.02"),
        (99.96, "100"),
        ("3.490", "3.49"),
        ("n/a", "n/a"),
        (1000, "1000"),
        (0.25, "0.25"),
    ],
)
def test_amount(value, text) -> None:
    assert amount(value) == text


@given(st.floats(min_value=-1e9, max_value=1e9, allow_nan=False))
def test_amount_is_never_minus_zero_nor_an_exponent(x: float) -> None:
    text = amount(x)
    assert text != "-0" and "e" not in text.lower()
    assert (float(text) == 0) == (x == 0)  # a non-zero amount never reads 0


def test_percent_rounds_down() -> None:
    assert percent(0.18, 0.1) == "180%" and percent(0.8999, 1) == "89%"
    assert percent(0.9, 1) == "90%" and percent(0, 0) == "100%"  # a budget of 0 h


def test_grouped_for_report_tables() -> None:
    assert amount(12345.6, grouped=True) == "12,346" and amount(0.04, grouped=True) == "0.04"
    assert amount(1234.5678, grouped=True) == "1,235"
