"""The daemon's look at its wall clock, once a second: a step is logged once, counted
(``klique_clock_steps_total``) and raised as a ``clock_step`` alert to IT through the
sequencer (clock.py decides what a step is; this module only reports it).

Also the tests' wall clock: ``KLIQUED_TEST_CLOCK_OFFSET_MS`` (a fixed offset, read at start)
and ``KLIQUED_TEST_CLOCK_FILE`` (a file holding an offset in ms, read at every look: a test
steps the running daemon's wall clock by writing it). Both are logged when set.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Callable

from kliqued.daemon.clock import Clock, ClockStep, wall_ms
from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.state.prepared import Prepared
from kliqued.daemon.events import Event
from kliqued.daemon.state.loop import Sequencer

log = logging.getLogger(__name__)

LOOK_S = 1.0
"""How often the wall clock is compared with the daemon's time."""

CLOCK_OFFSET_ENV = "KLIQUED_TEST_CLOCK_OFFSET_MS"
"""For tests only: the wall clock runs this many ms ahead of the system's (a cron schedule
due a second after start, without waiting for the minute)."""

CLOCK_FILE_ENV = "KLIQUED_TEST_CLOCK_FILE"
"""For tests only: a file whose content (whole ms, may be negative; empty or absent: 0) is
added to the wall clock at each look: writing it steps the running daemon's wall clock."""


def _offset_env() -> int:
    raw = os.environ.get(CLOCK_OFFSET_ENV)
    if not raw:
        return 0
    try:
        offset = int(raw)
    except ValueError:
        log.warning("%s=%r is not whole milliseconds: ignored", CLOCK_OFFSET_ENV, raw)
        return 0
    log.warning(
        "%s: the clock runs %d ms off the wall clock (tests only)", CLOCK_OFFSET_ENV, offset
    )
    return offset


def _file_offset(path: Path) -> int:
    try:
        raw = path.read_text(encoding="utf-8").strip()
        return int(raw) if raw else 0
    except (OSError, ValueError):
        return 0


def injected_wall() -> Callable[[], int] | None:
    """The wall clock the tests' variables make, or None without them (the system's)."""
    offset = _offset_env()
    name = os.environ.get(CLOCK_FILE_ENV)
    if not name:
        return None if offset == 0 else (lambda: wall_ms() + offset)
    path = Path(name)
    log.warning(
        "%s=%s: the wall clock is moved by the offset in that file (tests only)",
        CLOCK_FILE_ENV,
        name,
    )
    return lambda: wall_ms() + offset + _file_offset(path)


def make_clock() -> Clock:
    """The daemon's clock: on the system's wall clock, or the tests' (``injected_wall``)."""
    wall = injected_wall()
    return Clock() if wall is None else Clock(wall=wall)


def step_event(d: Daemon, step: ClockStep) -> Event:
    return Event(
        "clock_step",
        None,
        "kliqued",
        d.estate.revision,
        None,
        None,
        {
            "direction": step.direction,
            "step_ms": step.step_ms,
            "offset_ms": step.offset_ms,
            "wall_ms": step.wall_ms,
        },
    )


def look(d: Daemon) -> ClockStep | None:
    """One look; a step is logged here (once: the next look compares with this one)."""
    step = d.clock.check()
    if step is not None:
        log.warning("clock: %s", step.describe())
    return step


async def watch_clock(
    d: Daemon, seq: Sequencer, stop: asyncio.Event, every_s: float = LOOK_S
) -> None:
    """Looks at the wall clock every ``every_s`` until ``stop``; a step is recorded as a
    ``clock_step`` alert."""
    while not stop.is_set():
        step = look(d)
        if step is not None:
            ev = step_event(d, step)
            try:
                await seq.submit(lambda now, ov: Prepared(events=[ev]))
            except Exception as exc:  # shutting down: logged above, counted in /metrics
                log.debug("clock step not recorded: %s", exc)
        try:
            await asyncio.wait_for(stop.wait(), every_s)
            return
        except asyncio.TimeoutError:
            pass
