"""Conversions at the API's edge: RFC 3339 UTC text <-> integer ms, JSON GPU numbers <->
integer milli-GPUs. The engine only ever sees integers."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from compiler.units import parse_time
from kliqued.engine.periods import format_time, to_ms


def iso(ms: int | None) -> str | None:
    return None if ms is None else format_time(ms)


def parse_iso(text: str) -> int:
    """RFC 3339 with an offset (``Z`` or ``+00:00``); raises ValueError otherwise."""
    if not isinstance(text, str) or "T" not in text:
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    try:
        return to_ms(parse_time(text))
    except Exception as exc:  # the compiler's parser says why
        raise ValueError(str(exc)) from None


def gpus(milli: int | None) -> float | None:
    """Milli-GPUs as a JSON number (at most 3 decimals, so exact in a float's text)."""
    if milli is None:
        return None
    return milli / 1000 if milli % 1000 else milli // 1000


def to_milli(value: object, what: str = "gpus") -> int:
    """A JSON number >= 0 with at most 3 decimals as integer thousandths."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a number")
    try:
        d = Decimal(str(value))
    except InvalidOperation:
        raise ValueError(f"{what} must be a number") from None
    if not d.is_finite():
        raise ValueError(f"{what} must be a finite number")
    if d < 0:
        raise ValueError(f"{what} must be >= 0")
    scaled = d * 1000
    if scaled != scaled.to_integral_value():
        raise ValueError(f"{what} has more than 3 decimal places: {value}")
    if scaled > 10**15:
        raise ValueError(f"{what} is too large: {value}")
    return int(scaled)
