"""Conversions at the API's edge: RFC 3339 UTC text <-> integer ms, JSON GPU numbers <->
integer milli-GPUs (``klique_util.units`` does the arithmetic). The engine only ever sees
integers."""

from __future__ import annotations

from functools import lru_cache

from compiler.units import parse_time
from klique_util import units
from klique_util.excerpt import excerpt
from klique_util.units import milli_to_gpus, to_ms
from kliqued.engine.periods import format_time


def iso(ms: int | None) -> str | None:
    return None if ms is None else _formatted(ms)


@lru_cache(maxsize=4096)
def _formatted(ms: int) -> str:
    """``format_time`` remembered: a task's view gives several times, the tasks of one
    commit share theirs, and a datetime's strftime was 2.5% of the daemon's CPU under 800
    submissions a second (issue 29)."""
    return format_time(ms)


def parse_iso(text: str) -> int:
    """RFC 3339 with an offset (``Z`` or ``+00:00``); raises ValueError otherwise."""
    if not isinstance(text, str) or "T" not in text:
        raise ValueError(f"not an RFC 3339 time: {excerpt(text)}")
    try:
        return to_ms(parse_time(text))
    except Exception as exc:  # the compiler's parser says why
        raise ValueError(str(exc)) from None


def gpus(milli: int | None) -> int | float | None:
    """Milli-GPUs as a JSON number (at most 3 decimals, so exact in a float's text)."""
    return None if milli is None else milli_to_gpus(milli)


def to_milli(value: object, what: str = "gpus") -> int:
    """A JSON number >= 0 with at most 3 decimals as integer thousandths (text refused)."""
    return units.to_milli(value, what, numbers_only=True, maximum=units.MAX_MILLI)
