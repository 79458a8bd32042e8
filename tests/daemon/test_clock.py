"""The daemon's clock (kliqued/daemon/clock.py) against a wall clock and a monotonic clock
the test steps: a step of the wall clock is seen once, in its direction and size, and the
daemon's time neither jumps nor stops; a restart's replay continues from the log's time."""

from __future__ import annotations

from kliqued.daemon.clock import SLEW, Clock

HOUR = 3_600_000
T0 = 1_800_000_000_000  # 2027-01-15: any instant does


class Clocks:
    """A wall clock (ms) and a monotonic clock (ns) that move only when told."""

    def __init__(self) -> None:
        self.wall_ms = T0
        self.mono_ns = 10**12

    def wall(self) -> int:
        return self.wall_ms

    def mono(self) -> int:
        return self.mono_ns

    def run(self, ms: int) -> None:
        """Real time passes: both clocks move."""
        self.wall_ms += ms
        self.mono_ns += ms * 1_000_000


def test_a_forward_step_is_seen_once_and_not_taken() -> None:
    c = Clocks()
    clock = Clock(c.wall, c.mono)
    c.run(1000)
    assert clock.check() is None and clock.now() == T0 + 1000
    c.wall_ms += HOUR  # date -s "+1 hour"
    step = clock.check()
    assert step is not None and step.direction == "forward" and step.step_ms == HOUR
    assert clock.now() == T0 + 1000  # no jump: nothing is charged for the step
    c.run(5000)
    assert T0 + 6000 <= clock.now() <= T0 + 6000 + 5000 * SLEW + 1  # slewed, at most 500 ppm
    assert clock.check() is None  # logged once
    assert clock.steps == {"forward": 1, "backward": 0}
    assert HOUR - 10 < clock.offset_ms <= HOUR


def test_a_backward_step_neither_freezes_nor_reverses_the_time() -> None:
    c = Clocks()
    clock = Clock(c.wall, c.mono)
    c.run(2000)
    before = clock.now()
    c.wall_ms -= HOUR
    step = clock.check()
    assert step is not None and step.direction == "backward" and step.step_ms == -HOUR
    c.run(5000)
    after = clock.now()
    assert 5000 - 5000 * SLEW - 1 <= after - before <= 5000  # a 5 s task is charged ~5 s
    assert clock.check() is None
    assert clock.steps == {"forward": 0, "backward": 1}


def test_the_daemon_time_meets_the_wall_clock_by_slewing_without_a_jump() -> None:
    c = Clocks()
    clock = Clock(c.wall, c.mono)
    c.wall_ms += 3000  # a small step: 3 s
    assert clock.check() is not None
    last = clock.now()
    for _ in range(7000):  # 7000 looks a second apart: 3.5 s of slew at 500 ppm
        c.run(1000)
        clock.check()
        t = clock.now()
        assert 1000 <= t - last <= 1000 + 1000 * SLEW + 1
        last = t
    assert abs(clock.offset_ms) <= 2


def test_a_replay_continues_from_the_log_on_the_monotonic_clock() -> None:
    """A wall clock set back across a restart: the log's last time is ahead of it; the time
    runs on from the log's (before, it stood still until the wall clock caught up)."""
    c = Clocks()
    clock = Clock(c.wall, c.mono)
    clock.at_least(T0 + HOUR)  # the last event's time
    c.run(5000)
    assert clock.now() == T0 + HOUR + 5000
    step = clock.check()  # the wall clock behind the log: said once, at start
    assert step is not None and step.direction == "backward"
