"""UTC calendar periods on integer milliseconds.

Budgets reset on the UTC calendar (engine.md "Time budgets"), so a period start must be exact
and independent of any local clock or time zone; the engine works on integer milliseconds since
the Unix epoch, and every period is a whole number of UTC days, which is what lets the budget
meter keep its charges in per-day buckets and sum any period from them.
"""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone
from functools import lru_cache
from typing import Literal

from klique_util.units import DAY_MS, SECOND_MS

Period = Literal["day", "week", "month"]

_EPOCH = date(1970, 1, 1)


def day_of(t_ms: int) -> int:
    """The UTC day number (days since 1970-01-01) that contains ``t_ms``."""
    return t_ms // DAY_MS


def _date(day: int) -> date:
    return _EPOCH + timedelta(days=day)


def _day(d: date) -> int:
    return (d - _EPOCH).days


@lru_cache(maxsize=64)
def period_start_day(period: Period, day: int) -> int:
    """First UTC day of the period containing ``day``: the day itself, the Monday of its
    week, or the 1st of its month."""
    if period == "day":
        return day
    if period == "week":
        return day - (day + 3) % 7  # 1970-01-01 was a Thursday (weekday 3, Monday = 0)
    d = _date(day)
    return _day(d.replace(day=1))


@lru_cache(maxsize=64)
def next_period_start_day(period: Period, day: int) -> int:
    """First UTC day of the period after the one containing ``day``."""
    if period == "day":
        return day + 1
    if period == "week":
        return period_start_day("week", day) + 7
    d = _date(day)
    if d.month == 12:
        return _day(date(d.year + 1, 1, 1))
    return _day(date(d.year, d.month + 1, 1))


def period_start(period: Period, t_ms: int) -> int:
    return period_start_day(period, day_of(t_ms)) * DAY_MS


def next_period_start(period: Period, t_ms: int) -> int:
    return next_period_start_day(period, day_of(t_ms)) * DAY_MS


def format_minute(t_ms: int) -> str:
    """``2026-12-01T00:00Z``: the form engine.md's reasons use for a reset time."""
    dt = datetime.fromtimestamp(t_ms // SECOND_MS, tz=timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%MZ")


def format_time(t_ms: int) -> str:
    """RFC 3339 UTC, with milliseconds only when there are any."""
    dt = datetime.fromtimestamp(t_ms // SECOND_MS, tz=timezone.utc)
    ms = t_ms % SECOND_MS
    if ms:
        return dt.strftime("%Y-%m-%dT%H:%M:%S") + f".{ms:03d}Z"
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")
