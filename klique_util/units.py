"""Klique's units, in one place: milli-GPUs, milliseconds and hours.

- **milli-GPUs.** GPU amounts and weights are integer thousandths (``MILLI``), so that no sum
  over a month of placements ever drifts; the compiled estate, the engine and the worker
  protocol only carry integers, or JSON numbers of at most 3 decimals made from them.
- **milliseconds.** Times are integer ms since the epoch; durations in the estate are
  seconds. ``SECOND_MS``, ``HOUR_MS``, ``DAY_MS``.
- **units.** The engine charges ``weight (milli) x ms`` per placement; one GPU-hour (or one
  budget hour) is ``UNITS_PER_HOUR`` (``MILLI * HOUR_MS`` = 3.6e9) of them, and a budget of
  ``hours_milli`` is ``hours_milli * HOUR_MS`` units.

Two ways in from the outside, on purpose:

- :func:`to_milli` reads an amount a person wrote (the estate, a scenario, an API request)
  exactly, and refuses more than 3 decimals: ``0.1234`` GPUs is an error, not ``0.123``.
- :func:`gpus_to_milli` reads back a number Klique itself wrote from milli-GPUs (a lease's
  ``gpus``, a live-state figure). It rounds to the nearest thousandth, because that number
  went through a float: ``1.001 * 1000`` is ``1000.999...``, and truncating would lose a
  milli-GPU. Rounding never changes a value of at most 3 decimals.

Standard library only: the compiler, the engine, the daemon and a worker host all import it.
"""

from __future__ import annotations

from datetime import datetime, timezone
from decimal import Decimal, InvalidOperation

MILLI = 1000
"""milli-GPUs (or milli-hours, milli-weights) in one."""

SECOND_MS = 1000
MINUTE_S = 60
HOUR_S = 3600
DAY_S = 24 * HOUR_S
WEEK_S = 7 * DAY_S
HOUR_MS = HOUR_S * SECOND_MS
DAY_MS = DAY_S * SECOND_MS

UNIT_SECONDS: dict[str, int] = {"s": 1, "m": MINUTE_S, "h": HOUR_S, "d": DAY_S, "w": WEEK_S}
"""Seconds in each duration unit people write (``30s``, ``15m``, ``2h``, ``1d``, ``1w``); each
parser's own pattern says which of them it accepts."""

UNITS_PER_HOUR = MILLI * HOUR_MS
"""Engine charge units (milli-GPU x ms, or weight milli x ms) in one GPU-hour."""

MAX_MILLI = 10**15
"""Above any real amount; bounds what a request may ask so integers stay exact in JSON."""


def to_decimal(value: object) -> Decimal:
    """A YAML number or numeric string as an exact decimal (floats via their shortest repr)."""
    if isinstance(value, bool):
        raise ValueError("expected a number, found a boolean")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError("expected a finite number")
        return Decimal(repr(value))
    if isinstance(value, Decimal):
        return value
    if isinstance(value, str):
        try:
            d = Decimal(value.strip())
        except InvalidOperation:
            raise ValueError(f"expected a number, found {value!r}") from None
        if not d.is_finite():
            raise ValueError("expected a finite number")
        return d
    raise ValueError(f"expected a number, found {type(value).__name__}")


def to_milli(
    value: object, what: str = "amount", *, numbers_only: bool = False, maximum: int | None = None
) -> int:
    """A decimal >= 0 with at most 3 decimal places, as integer thousandths, exactly.

    ``numbers_only`` refuses text and anything but an int or a float (a JSON request's
    ``"gpus": "2"`` is an error there, while YAML and CSV amounts may be numeric text);
    ``maximum`` (in milli) refuses larger amounts. Errors are ``ValueError`` naming ``what``.
    """
    if numbers_only and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ValueError(f"{what} must be a number")
    try:
        d = to_decimal(value)
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}" if numbers_only else str(exc)) from None
    if d < 0:
        raise ValueError(f"{what} must be >= 0, found {d}")
    scaled = d * MILLI
    if scaled != scaled.to_integral_value():
        raise ValueError(f"{what} has more than 3 decimal places: {d}")
    if maximum is not None and scaled > maximum:
        raise ValueError(f"{what} is too large: {d}")
    return int(scaled)


def gpus_to_milli(gpus: float | int | None) -> int:
    """A GPU number Klique wrote from milli-GPUs (at most 3 decimals, but through a float)
    back to milli-GPUs, to the nearest thousandth (see the module's docstring); None is 0
    (a lease without GPUs)."""
    return round(float(gpus or 0) * MILLI)


def milli_to_gpus(milli: int) -> int | float:
    """Milli-GPUs as a JSON number: an int when whole (``2``, not ``2.0``), else a float of
    at most 3 decimals (exact in its shortest text)."""
    return milli // MILLI if milli % MILLI == 0 else milli / MILLI


def from_milli(milli: int) -> float:
    """Thousandths as a float (budget hours, thresholds, burn rates in the API)."""
    return milli / MILLI


def milli_str(milli: int) -> str:
    """Integer thousandths back to the shortest decimal text: 64000 -> '64', 250 -> '0.25'."""
    sign = "-" if milli < 0 else ""
    whole, frac = divmod(abs(milli), MILLI)
    if frac == 0:
        return f"{sign}{whole}"
    return f"{sign}{whole}.{frac:03d}".rstrip("0")


def duration_str(seconds: int) -> str:
    """Seconds as the largest exact unit: 900 -> '15m', 86400 -> '1d'."""
    for unit in ("w", "d", "h", "m"):
        size = UNIT_SECONDS[unit]
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def unit_hours(units: int | float) -> float:
    """Engine charge units (milli x ms) as hours: GPU-hours, budget hours used or left."""
    return units / UNITS_PER_HOUR


def unit_hours_micro(units: int) -> float:
    """Engine charge units as hours rounded half up to the millionth, in integers, as the
    ledger rounds its statements: a task's ``gpu_hours`` then reads what its statement line
    reads (``round()`` on the float rounds ``0.0002675`` down, the ledger up)."""
    whole, rest = divmod(abs(units) * 1_000_000, UNITS_PER_HOUR)
    if 2 * rest >= UNITS_PER_HOUR:
        whole += 1
    return (whole if units >= 0 else -whole) / 1_000_000


def ms_to_hours(ms: int | float) -> float:
    """A duration in ms as hours."""
    return ms / HOUR_MS


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def to_ms(dt: datetime) -> int:
    """An aware datetime as integer milliseconds since the epoch, exactly (integer
    arithmetic on the timedelta, not ``timestamp() * 1000`` through a float)."""
    delta = dt.astimezone(timezone.utc) - _EPOCH
    return (delta.days * DAY_S + delta.seconds) * SECOND_MS + delta.microseconds // 1000
