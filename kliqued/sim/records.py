"""A demand trace's records: its tasks and the trace itself (read by ``trace.py``, reported
on by ``report.py``). Apart from both so that the report names a trace without importing the
reader that builds the report (no import cycle: issue 27).
"""

from __future__ import annotations

from dataclasses import dataclass

from klique_util.units import DAY_MS

HORIZON_SLACK_MS = 31 * DAY_MS


@dataclass(slots=True)
class TraceTask:
    line: int
    id: str
    at: int
    """Submission, milliseconds since the epoch."""
    resource: str
    user: str
    project: str | None
    gpus_milli: int | None
    runtime_ms: int
    checkpoint_ms: int | None
    group: str


@dataclass
class Trace:
    file: str
    start: int
    tasks: list[TraceTask]

    def default_until(self) -> int:
        """The replay's default horizon: the last submission plus the longest runtime plus
        31 days (the longest budget period), so that every task could run its course and
        every budget resets at least once after the last submission. Work that can never
        finish (a task longer than its budget allows, without a checkpoint) stops there."""
        if not self.tasks:
            return self.start
        return self.tasks[-1].at + max(t.runtime_ms for t in self.tasks) + HORIZON_SLACK_MS
