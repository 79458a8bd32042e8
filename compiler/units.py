"""Exact units of the estate: GPU amounts, durations, times, money.

GPU amounts and weights are kept as integer thousandths (``milli``) so that no sum over a
month of placements ever drifts; the compiled estate and the engine only see integers. The
milli-GPU conversions themselves are Klique's one units module, ``klique_util.units``
(re-exported here for the compiler's own modules); this module adds what only the estate's
text has: durations, UTC times and prices.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

from klique_util.units import MILLI, UNIT_SECONDS, duration_str, milli_str, to_decimal, to_milli

__all__ = [
    "MILLI",
    "duration_str",
    "milli_str",
    "money_str",
    "parse_duration",
    "parse_time",
    "time_str",
    "to_decimal",
    "to_milli",
]

_DURATION = re.compile(r"^(?P<n>\d+)(?P<unit>s|m|h|d|w)?$")


def parse_duration(value: object) -> int:
    """`30s`, `15m`, `2h`, `1d`, `1w` or a whole number of seconds, as seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 30s, 15m, 2h or 1d, found a boolean")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a duration must be >= 0, found {value}")
        return value
    if isinstance(value, str):
        m = _DURATION.match(value.strip())
        if m:
            return int(m["n"]) * UNIT_SECONDS[m["unit"] or "s"]
    raise ValueError(f"expected a duration such as 30s, 15m, 2h or 1d, found {value!r}")


def parse_time(value: object) -> datetime:
    """An RFC 3339 time in UTC (a `Z` or `+00:00` offset), as an aware datetime."""
    if isinstance(value, datetime):
        dt = value
    elif isinstance(value, str):
        text = value.strip()
        if not re.match(
            r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?([Zz]|[+-]\d{2}:\d{2})$", text
        ):
            raise ValueError(
                f"expected an RFC 3339 time such as 2026-01-01T00:00:00Z, found {value!r}"
            )
        try:
            dt = datetime.fromisoformat(text.replace("z", "Z").replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"not a valid time: {value!r}") from None
    else:
        raise ValueError(f"expected an RFC 3339 time, found {type(value).__name__}")
    if dt.tzinfo is None:
        raise ValueError("a time needs a UTC offset, e.g. 2026-01-01T00:00:00Z")
    if dt.utcoffset() != timezone.utc.utcoffset(None):
        raise ValueError(
            f"times are UTC: write {dt.astimezone(timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')}"
        )
    return dt.astimezone(timezone.utc)


def time_str(dt: datetime) -> str:
    """Canonical UTC text: 2026-01-01T00:00:00Z (fractions of a second kept when present)."""
    dt = dt.astimezone(timezone.utc)
    if dt.microsecond:
        return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")


def money_str(value: object) -> str:
    """A price as canonical decimal text (no exponent, no trailing zeros past the point)."""
    d = to_decimal(value)
    if d < 0:
        raise ValueError(f"a price must be >= 0, found {d}")
    text = format(d.normalize(), "f")
    return text
