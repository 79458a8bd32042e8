"""The demand file: the work a window of real submissions asked for, as a trace CSV.

One format, written by the daemon (``GET /v1/demand``) and read by ``kliqued plan
--what-if``: the columns of a trace (scenarios.md: ``id,submit,resource,user,project,gpus,
runtime``, so ``kliqued simulate --trace`` replays the file as it is) plus ``channel`` (how the
task was sent: cli, sdk, api, mcp, schedule, pipeline, session) and ``status`` (what became of it). ``runtime`` is the time the
task was placed, summed over its attempts, in seconds: what it needed for a finished task,
what it had run so far for any other (``status`` says which). Standard library only, since
the daemon, the SDK and the what-if all read or write it.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Iterable

COLUMNS = ("id", "submit", "resource", "user", "project", "gpus", "runtime", "channel", "status")
"""The header, in this order; the first seven are a trace's."""

STATUSES = ("finished", "failed", "cancelled", "running", "queued")
"""``finished``: the runtime is what the task needed; ``failed``: what it ran until it
failed; ``cancelled``: what it ran before the cancellation (0 if it never ran); ``running``:
placed at the export, the runtime is what it ran so far; ``queued``: waiting, never placed
(runtime 0) or preempted and waiting again (what it ran)."""

COMPLETE = frozenset({"finished", "failed"})
"""Statuses whose runtime is the whole of the task's run."""


@dataclass(frozen=True, slots=True)
class DemandRow:
    id: str
    submit_ms: int
    resource: str
    user: str
    project: str | None
    gpus_milli: int | None
    """The size asked for (a ``from_task`` profile), else None: the profile decides."""
    runtime_ms: int
    channel: str
    status: str


def iso_ms(ms: int) -> str:
    """An RFC 3339 UTC time with milliseconds, as the trace's ``submit`` column reads it."""
    dt = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def _seconds(ms: int) -> str:
    whole, rest = divmod(ms, 1000)
    return str(whole) if rest == 0 else f"{whole}.{rest:03d}".rstrip("0")


def _gpus(milli: int | None) -> str:
    if milli is None:
        return ""
    return _seconds(milli)  # thousandths as a decimal, the same way


def to_csv(rows: Iterable[DemandRow]) -> str:
    """The demand as CSV text (header first, rows in the order given: by submission)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    for r in rows:
        w.writerow(
            [
                r.id,
                iso_ms(r.submit_ms),
                r.resource,
                r.user,
                r.project or "",
                _gpus(r.gpus_milli),
                _seconds(r.runtime_ms),
                r.channel,
                r.status,
            ]
        )
    return buf.getvalue()
