"""When a task reported by its worker really ended, on the control plane's clock.

A worker reports an end with the time it happened (``at``, RFC 3339, the worker's clock).
The report can come long after: the worker was down (it reports from its wrapper's exit
record once restarted), its disk was full, the network was cut. Charging the ledger and the
budget meters up to the report's arrival would charge the time nothing ran; charging up to
``at`` as given would trust the worker's clock. So the end charged is ``at``, kept within
what the control plane itself knows (docs/decisions.md, "The ledger charges what ran"):

- never after ``now`` (a worker's clock ahead, or a made-up time, charges no more than
  waiting for the report did);
- never before the placement (the interval's start), nor before the last heartbeat that
  listed the task running: that heartbeat proved it ran until then, whatever the worker's
  clock says (a clock behind gives back at most the time since that heartbeat).

Pure: the caller passes the times; the result goes in the ``ended`` event (``ran_until``),
so replay charges the same.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any


def parse_at(value: Any) -> int | None:
    """A report's ``at`` (RFC 3339, ``Z`` or an offset; a naive time is UTC) in ms since
    the epoch; None for a missing or unreadable one (the end is then the report's
    arrival)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return int(t.timestamp() * 1000)


def ran_until(
    reported_at: Any, placed_at: int | None, seen_running_at: int | None, now: int
) -> int:
    """The end to charge: the report's ``at`` within [the placement and the last heartbeat
    that listed the task running, ``now``]; ``now`` when ``at`` is missing or unreadable."""
    at = parse_at(reported_at)
    if at is None:
        return now
    end = min(at, now)
    floors = [x for x in (placed_at, seen_running_at) if x is not None]
    if floors:
        end = max(end, min(max(floors), now))
    return end
