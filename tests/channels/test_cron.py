"""When a schedule runs, as a pure function of time (kliqued/schedule/cron.py): the daemon
loop asks ``due`` at its own ``now``, so every case here is a time, not a wait."""

from __future__ import annotations

from datetime import datetime, timezone, tzinfo

import pytest

from kliqued.schedule import cron


def ms(
    year: int,
    month: int,
    day: int,
    hour: int = 0,
    minute: int = 0,
    second: int = 0,
    tz: tzinfo = timezone.utc,
) -> int:
    return int(datetime(year, month, day, hour, minute, second, tzinfo=tz).timestamp() * 1000)


def test_next_run_of_a_nightly_cron() -> None:
    assert cron.check("0 2 * * *", "UTC", ms(2026, 12, 1, 10, 0)) == ms(2026, 12, 2, 2, 0)
    assert cron.after("0 2 * * *", "UTC", ms(2026, 12, 1, 10, 0), 3) == [
        ms(2026, 12, 2, 2),
        ms(2026, 12, 3, 2),
        ms(2026, 12, 4, 2),
    ]


def test_the_time_zone_is_the_schedules() -> None:
    # 02:00 in Paris is 01:00 UTC in winter
    assert cron.check("0 2 * * *", "Europe/Paris", ms(2026, 12, 1, 10)) == ms(2026, 12, 2, 1)


@pytest.mark.parametrize(
    "expr, words",
    [
        ("0 0 30 2 *", "never fire"),  # February 30th
        ("0 0 31 4,6 *", "never fire"),  # April and June have 30 days
        ("* * */20 * 1L", "never fires"),  # nothing matches within 50 years
        ("61 * * * *", "Bad minute"),
        ("0 2 * *", "expected 5 fields"),
        ("*/5 * * * * *", "expected 5 fields"),  # seconds: not standard cron
    ],
)
def test_an_expression_that_cannot_make_a_schedule_is_refused(expr: str, words: str) -> None:
    with pytest.raises(cron.CronError, match=words):
        cron.check(expr, "UTC", ms(2026, 12, 1))


def test_an_unknown_time_zone_is_refused() -> None:
    with pytest.raises(cron.CronError, match="unknown time zone 'Mars/Olympus'"):
        cron.check("0 2 * * *", "Mars/Olympus", ms(2026, 12, 1))


def test_nothing_is_due_before_the_time() -> None:
    d = cron.due(
        "0 2 * * *", "UTC", ms(2026, 12, 1, 10), ms(2026, 12, 2, 1, 59, 59), "run-once", None
    )
    assert d == cron.Due(None, 0, None, ms(2026, 12, 1, 10))


def test_due_on_time_runs_that_due_time() -> None:
    d = cron.due(
        "0 2 * * *", "UTC", ms(2026, 12, 1, 10), ms(2026, 12, 2, 2, 0, 1), "run-once", None
    )
    assert d == cron.Due(ms(2026, 12, 2, 2), 0, None, ms(2026, 12, 2, 2))
    # asked again at the same or a later moment with the new cursor: nothing more
    again = cron.due("0 2 * * *", "UTC", d.cursor, ms(2026, 12, 2, 2, 0, 5), "run-once", None)
    assert again.run is None and again.missed == 0


def test_down_over_three_due_times_run_once_runs_the_latest_once() -> None:
    d = cron.due("0 2 * * *", "UTC", ms(2026, 12, 1, 10), ms(2026, 12, 4, 9), "run-once", None)
    assert d.run == ms(2026, 12, 4, 2)
    assert d.missed == 2 and d.first_missed == ms(2026, 12, 2, 2)


def test_run_once_past_its_deadline_runs_nothing() -> None:
    d = cron.due(
        "0 2 * * *", "UTC", ms(2026, 12, 1, 10), ms(2026, 12, 4, 9), "run-once", 3600 * 1000
    )
    assert d.run is None and d.missed == 3 and d.cursor == ms(2026, 12, 4, 2)
    ok = cron.due(
        "0 2 * * *", "UTC", ms(2026, 12, 1, 10), ms(2026, 12, 4, 2, 59), "run-once", 3600 * 1000
    )
    assert ok.run == ms(2026, 12, 4, 2)


def test_skip_runs_only_what_is_on_time() -> None:
    late = cron.due("0 2 * * *", "UTC", ms(2026, 12, 1, 10), ms(2026, 12, 2, 2, 5), "skip", None)
    assert late.run is None and late.missed == 1 and late.cursor == ms(2026, 12, 2, 2)
    on_time = cron.due(
        "0 2 * * *", "UTC", ms(2026, 12, 1, 10), ms(2026, 12, 2, 2, 0, 30), "skip", None
    )
    assert on_time.run == ms(2026, 12, 2, 2)


def test_a_week_down_on_a_minutely_schedule_counts_without_running_each() -> None:
    d = cron.due("* * * * *", "UTC", ms(2026, 12, 1), ms(2026, 12, 8), "run-once", None)
    assert d.run == ms(2026, 12, 8)
    assert d.missed == cron.MAX_COUNTED  # counted up to the cap, not run
