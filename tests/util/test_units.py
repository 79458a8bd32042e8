"""klique_util.units: milli-GPUs, hours and milliseconds in one place."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from klique_util import units
from klique_util.units import (
    HOUR_MS,
    MILLI,
    UNITS_PER_HOUR,
    from_milli,
    gpus_to_milli,
    milli_str,
    milli_to_gpus,
    to_milli,
    unit_hours,
)


def test_constants() -> None:
    assert (MILLI, units.SECOND_MS, HOUR_MS, units.DAY_MS) == (1000, 1000, 3_600_000, 86_400_000)
    assert UNITS_PER_HOUR == 3.6e9
    assert unit_hours(2 * 1000 * HOUR_MS) == 2.0  # two GPUs for one hour, in GPU-hours
    assert units.ms_to_hours(90 * 60 * 1000) == 1.5


def test_to_milli_is_exact_and_refuses_more_than_three_decimals() -> None:
    assert to_milli("0.25") == 250 and to_milli(Decimal("8")) == 8000 and to_milli(0.57) == 570
    with pytest.raises(ValueError, match="more than 3 decimal places: 0.1234"):
        to_milli(0.1234, "capacity")
    with pytest.raises(ValueError, match="capacity must be >= 0, found -1"):
        to_milli(-1, "capacity")


def test_to_milli_for_json_requests() -> None:
    """``numbers_only`` and ``maximum``: the daemon's rules for a request's ``gpus``."""
    assert to_milli(2, "gpus", numbers_only=True) == 2000
    for bad in ("2", True, None, [1]):
        with pytest.raises(ValueError, match="^gpus must be a number$"):
            to_milli(bad, "gpus", numbers_only=True)
    with pytest.raises(ValueError, match="gpus: expected a finite number"):
        to_milli(float("inf"), "gpus", numbers_only=True)
    with pytest.raises(ValueError, match="gpus is too large"):
        to_milli(10**13, "gpus", numbers_only=True, maximum=units.MAX_MILLI)


def test_gpus_to_milli_rounds_what_went_through_a_float() -> None:
    """A lease's ``gpus`` is milli / 1000 as a float: 1001 / 1000 * 1000 is 1000.99..., which
    int() would truncate to 1000; the nearest thousandth is the amount the daemon meant."""
    assert int(1001 / 1000 * 1000) == 1000
    assert gpus_to_milli(1001 / 1000) == 1001 and gpus_to_milli(1.001) == 1001
    assert gpus_to_milli(None) == 0 and gpus_to_milli(2) == 2000


@given(st.integers(min_value=0, max_value=10**12))
def test_round_trips(milli: int) -> None:
    assert gpus_to_milli(milli_to_gpus(milli)) == milli
    assert to_milli(milli_str(milli)) == milli
    assert to_milli(milli_to_gpus(milli), numbers_only=True) == milli
    assert from_milli(milli) == milli / 1000


def test_milli_to_gpus_is_an_int_when_whole() -> None:
    assert milli_to_gpus(2000) == 2 and isinstance(milli_to_gpus(2000), int)
    assert milli_to_gpus(250) == 0.25


def test_the_api_edge_binds_the_json_rules() -> None:
    """The daemon's ``gpus`` of a request: the same function, numbers only, bounded."""
    from kliqued.daemon.units import gpus, to_milli as api_to_milli

    assert api_to_milli(0.25) == 250 and gpus(250) == 0.25 and gpus(None) is None
    for bad, text in (
        ("2", "gpus must be a number"),
        (-1, "gpus must be >= 0, found -1"),
        (1.0005, "gpus has more than 3 decimal places: 1.0005"),
        (10**13, "gpus is too large"),
    ):
        with pytest.raises(ValueError, match=text):
            api_to_milli(bad)


def test_to_ms_is_exact() -> None:
    from datetime import datetime, timedelta, timezone

    t = datetime(2026, 3, 1, 12, 0, 0, 1000, tzinfo=timezone.utc)
    assert units.to_ms(t) == 1772366400001
    assert units.to_ms(t.astimezone(timezone(timedelta(hours=2)))) == 1772366400001
    assert units.to_ms(datetime(1969, 12, 31, 23, 59, 59, tzinfo=timezone.utc)) == -1000


def test_unit_hours_micro_rounds_half_up_as_the_ledger() -> None:
    """963 ms of one GPU is 0.0002675 h exactly: the statement says 0.000268, and a task's
    ``gpu_hours`` said 0.000267 (``round`` on the float) until both rounded alike."""
    assert units.unit_hours_micro(963 * units.MILLI) == 0.000268
    assert round(units.unit_hours(963 * units.MILLI), 6) == 0.000267  # the old, different way
    assert units.unit_hours_micro(-963 * units.MILLI) == -0.000268
    assert units.unit_hours_micro(0) == 0.0


@given(st.integers(min_value=0, max_value=10**18))
def test_unit_hours_micro_reads_as_the_statement(n: int) -> None:
    from fractions import Fraction

    from kliqued.ledger.statement import round_micro

    expected = round_micro(Fraction(n, units.UNITS_PER_HOUR))
    assert Decimal(str(units.unit_hours_micro(n))).quantize(Decimal("0.000001")) == expected
