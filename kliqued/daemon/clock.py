"""The daemon's time: wall-clock milliseconds that run on the monotonic clock.

Why it is shaped this way (issue 26, docs/decisions.md "Clock steps"): the engine charges
budgets, the ledger dates intervals and cron decides due times from one ``now`` in integer
ms that must never go back. Read straight from the wall clock, a step of it (an operator's
``date -s``, NTP stepping a clock that was far off, a VM restored) was taken at face value:
a forward hour charged every running GPU an hour nobody used and expired tokens at once; a
backward hour froze the daemon's time for an hour. So ``now()`` is a wall-clock *anchor*
plus the *monotonic* time elapsed since, which neither jumps nor goes back. ``check()``,
called about once a second, compares it with the wall clock: a difference that changes by
more than ``STEP_MS`` at once is a step (returned, so its caller logs, counts and alerts it
once); any remaining difference is slewed away at ``SLEW`` (500 ppm, the bound NTP's own slew
keeps to), so the daemon's time meets the wall clock again without ever jumping, and a charge
differs from the real elapsed time by at most 0.05 %.

The wall clock is a parameter: tests step it (``server.CLOCK_FILE_ENV``); everything here is
arithmetic on the two readings.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

STEP_MS = 2000
"""A change of the wall clock's offset from the daemon's time larger than this at one look
is a step (NTP steps only past 128 ms; a second of scheduling jitter is not a step)."""

SLEW = 0.0005
"""How much faster or slower than the monotonic clock the daemon's time may run while it
closes a difference with the wall clock: 500 ppm, 1.8 s an hour (a 1 h step is closed in
about 83 days; a restart re-anchors at once, never backwards)."""

SETTLED_MS = 1
"""A difference this small is no difference (no slew)."""


def wall_ms() -> int:
    """The system's wall clock, in ms since the epoch."""
    return time.time_ns() // 1_000_000


def mono_ns() -> int:
    """The system's monotonic clock, in ns (CLOCK_MONOTONIC: steps of the wall clock do not
    move it)."""
    return time.monotonic_ns()


@dataclass(frozen=True)
class ClockStep:
    """A step of the wall clock, as one look saw it."""

    at_ms: int
    """The daemon's time of the look."""
    wall_ms: int
    """The wall clock's reading at that look."""
    step_ms: int
    """How far the wall clock jumped against the monotonic clock: > 0 forward, < 0 back."""

    @property
    def direction(self) -> str:
        return "forward" if self.step_ms > 0 else "backward"

    @property
    def offset_ms(self) -> int:
        """Wall clock minus the daemon's time after the step."""
        return self.wall_ms - self.at_ms

    def describe(self) -> str:
        return (
            f"the wall clock stepped {self.direction} by {abs(self.step_ms) / 1000:.1f} s "
            f"(now {self.offset_ms / 1000:+.1f} s off the daemon's time, which keeps "
            f"running on the monotonic clock and closes the difference at "
            f"{SLEW * 1e6:.0f} ppm; budgets charge the real elapsed time, not the step)"
        )


class Clock:
    """Wall-clock ms that never go back nor jump: an anchor plus monotonic elapsed time,
    slewed toward the wall clock (see the module docstring)."""

    def __init__(
        self,
        wall: Callable[[], int] = wall_ms,
        mono: Callable[[], int] = mono_ns,
        step_ms: int = STEP_MS,
        slew: float = SLEW,
    ) -> None:
        self.wall, self.mono = wall, mono
        self.step_threshold_ms, self.slew = step_ms, slew
        self._base_ms = float(wall())
        """The daemon's time at ``_base_ns`` (the anchor, moved at each look), with the
        fraction of a ms the slew adds (dropped, 0.5 ms a second would be lost at each look)."""
        self._base_ns = mono()
        self._rate = 0.0
        """The slew in force since ``_base_ns``: -slew, 0 or +slew."""
        self._seen_offset = 0
        """Wall minus daemon at the last look: a step is a change of it."""
        self.last = int(self._base_ms)
        """The latest time handed out (a snapshot records it)."""
        self.offset_ms = 0
        """Wall minus the daemon's time at the last look (``klique_clock_offset_seconds``)."""
        self.steps = {"forward": 0, "backward": 0}
        """Steps seen since start, by direction (``klique_clock_steps_total``)."""

    def _at(self, ns: int) -> float:
        elapsed_ms = (ns - self._base_ns) / 1_000_000
        return self._base_ms + elapsed_ms * (1.0 + self._rate)

    def now(self) -> int:
        t = int(self._at(self.mono()))
        if t > self.last:
            self.last = t
        return self.last

    def at_least(self, t: int) -> None:
        """Times from the log (replay, a snapshot, a replica): the daemon's time continues
        from the latest, on the monotonic clock (a wall clock set back across a restart does
        not freeze it)."""
        if t > self.now():
            self._base_ms, self._base_ns, self.last = float(t), self.mono(), t

    def check(self) -> ClockStep | None:
        """One look at the wall clock: re-bases the anchor, sets the slew toward the wall
        clock, and returns the step when the wall clock jumped since the last look."""
        ns = self.mono()
        exact = max(self._at(ns), float(self.last))
        daemon = int(exact)
        wall = self.wall()
        offset = wall - daemon
        self._base_ms, self._base_ns, self.last = exact, ns, daemon
        step = None
        if abs(offset - self._seen_offset) > self.step_threshold_ms:
            step = ClockStep(daemon, wall, offset - self._seen_offset)
            self.steps[step.direction] += 1
        self._seen_offset = offset
        self.offset_ms = offset
        self._rate = (
            self.slew if offset > SETTLED_MS else -self.slew if offset < -SETTLED_MS else 0.0
        )
        return step
