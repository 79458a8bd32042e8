"""When a schedule runs: a pure function of its cron expression, its time zone and time.

Cron is parsed and iterated by cronsim (Debian cron's semantics, DST included), never by
hand. Times are integer ms since the epoch, like everywhere in the daemon; the expression is
read in the schedule's IANA time zone. What the daemon loop does at ``now`` is ``due``: the
scheduler has no clock of its own, so tests drive it with any time.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from klique_util.excerpt import excerpt
from klique_util.units import SECOND_MS

Missed = Literal["run-once", "skip"]
MISSED: tuple[str, ...] = ("run-once", "skip")

LATE_GRACE_MS = 60 * SECOND_MS
"""How late a run may start and still be on time (the loop's own delay, a quick restart).
With ``missed: skip`` this is the starting deadline; with ``run-once`` the schedule's
``deadline`` is (at least this)."""


class CronError(ValueError):
    """An expression or time zone that cannot make a schedule (the message says which)."""


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise CronError(
            f"unknown time zone {excerpt(name)}: use an IANA name such as UTC or Europe/Paris"
        ) from None


def _dt(ms: int, tz: ZoneInfo) -> datetime:
    return datetime.fromtimestamp(ms / SECOND_MS, timezone.utc).astimezone(tz)


def _ms(dt: datetime) -> int:
    return int(dt.timestamp() * SECOND_MS)


def _sim(expr: str, start: datetime, reverse: bool = False) -> CronSim:
    try:
        return CronSim(expr, start, reverse=reverse)
    except CronSimError as exc:
        text = str(exc)
        if "day-of-month" in text:
            text += (
                " (out of range, or a day none of its months has: such a schedule would never fire)"
            )
        raise CronError(f"cron {excerpt(expr)}: {text}") from None


def check(expr: str, tz_name: str, now_ms: int) -> int:
    """The first run after ``now_ms``; a ``CronError`` for an expression that does not parse,
    that has seconds or a macro (standard 5-field cron only), or that never fires (cronsim
    looks 50 years ahead, which holds every real calendar cycle, Feb 29 included)."""
    tz = zone(tz_name)
    fields = expr.split()
    if len(fields) != 5:
        raise CronError(
            f"cron {excerpt(expr)}: expected 5 fields (minute hour day-of-month "
            f"month day-of-week), found {len(fields)}"
        )
    try:
        return _ms(next(_sim(expr, _dt(now_ms, tz))))
    except StopIteration:
        raise CronError(
            f"cron {excerpt(expr)} never fires (no matching time in the next 50 years)"
        ) from None


def after(expr: str, tz_name: str, t_ms: int, n: int = 1) -> list[int]:
    """The next ``n`` run times strictly after ``t_ms``."""
    out: list[int] = []
    try:
        for dt in _sim(expr, _dt(t_ms, zone(tz_name))):
            out.append(_ms(dt))
            if len(out) == n:
                break
    except StopIteration:
        pass
    return out


def latest(expr: str, tz_name: str, t_ms: int) -> int | None:
    """The last run time at or before ``t_ms``."""
    try:
        return _ms(next(_sim(expr, _dt(t_ms + 1, zone(tz_name)), reverse=True)))
    except StopIteration:
        return None


@dataclass(frozen=True, slots=True)
class Due:
    """What a schedule does at ``now``: ``run`` the due time to run (None: nothing now),
    how many earlier due times it ``missed`` (the daemon was down, or they were too late)
    and the first of them, and the new ``cursor`` (the last due time dealt with)."""

    run: int | None
    missed: int
    first_missed: int | None
    cursor: int


MAX_COUNTED = 10_000
"""Missed due times counted at most (a minutely schedule after a week's outage)."""


def due(
    expr: str, tz_name: str, cursor_ms: int, now_ms: int, missed: str, deadline_ms: int | None
) -> Due:
    """The due times in (``cursor_ms``, ``now_ms``]: the latest one runs when it is at most
    its starting deadline late (``run-once``: ``deadline_ms``, None meaning any lateness;
    ``skip``: ``LATE_GRACE_MS``); every earlier one, and a latest one past its deadline,
    is missed. So a daemon down over several due times runs once (or not at all), never
    once per missed time."""
    last = latest(expr, tz_name, now_ms)
    if last is None or last <= cursor_ms:
        return Due(None, 0, None, cursor_ms)
    earlier = 0
    first: int | None = None
    try:
        for dt in _sim(expr, _dt(cursor_ms, zone(tz_name))):
            t = _ms(dt)
            if t >= last or earlier == MAX_COUNTED:
                break
            first = t if first is None else first
            earlier += 1
    except StopIteration:
        pass
    if missed == "skip":
        limit: int | None = LATE_GRACE_MS
    else:
        limit = None if deadline_ms is None else max(deadline_ms, LATE_GRACE_MS)
    if limit is not None and now_ms - last > limit:
        return Due(None, earlier + 1, last if first is None else first, last)
    return Due(last, earlier, first, last)
