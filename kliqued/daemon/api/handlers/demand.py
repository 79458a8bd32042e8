"""``GET /v1/demand``: the work submitted in a window, as a trace (klique_util/demand.py).

What ``kliqued plan --what-if-from URL`` replays on the base and head estates: every task
submitted since ``since``, with its submission time, compute resource, size and the time it
was placed, summed over its attempts. Read from the daemon's task records (what the event
log rebuilds at start), so the export costs no database read. For admins and the read-only
``planner`` role CI holds: it names users and projects, never a command or payload.
"""

from __future__ import annotations

import re
from typing import Iterable, Iterator

from aiohttp import web

from compiler.units import parse_duration
from klique_util.demand import DemandRow, to_csv
from klique_util.excerpt import excerpt
from klique_util.units import SECOND_MS

from kliqued.daemon.state import history
from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.errors import ApiError, bad_request
from kliqued.daemon.records import TaskRecord
from kliqued.daemon.api.request import ctx
from kliqued.daemon.api.schema_rules import SINCE_PATTERN
from kliqued.daemon.api.routes import Route
from kliqued.daemon.units import parse_iso

DEFAULT_SINCE = "14d"
_SINCE = re.compile(SINCE_PATTERN)


class NotADate(ValueError):
    """``since`` has the form of a time the calendar refuses."""


def since_ms(text: str | None, now: int) -> int:
    """``14d`` (a duration back from ``now``) or an RFC 3339 time; ValueError says why
    (:class:`NotADate` for a well-formed time that is none)."""
    text = DEFAULT_SINCE if text is None else text
    if not _SINCE.match(text):
        raise ValueError(
            "since: expected a duration back from now (14d, 36h) or an RFC 3339 "
            f"time, found {excerpt(text)}"
        )
    if "T" in text:
        try:
            return parse_iso(text)
        except ValueError as exc:
            raise NotADate(f"since: {exc}") from None
    try:
        return now - parse_duration(text) * SECOND_MS
    except ValueError:
        raise ValueError(
            "since: expected a duration back from now (14d, 36h) or an RFC 3339 "
            f"time, found {excerpt(text)}"
        ) from None


def status(rec: TaskRecord) -> str:
    if rec.state == "placed":
        return "running"
    if rec.state == "queued":
        return "queued"
    if rec.ended_by is not None or rec.end_reason == "cancelled":
        return "cancelled"
    return "finished" if rec.end_reason == "finished" else "failed"


def placed_ms(rec: TaskRecord, now: int) -> int:
    """The time the task was placed, over every attempt (the simulator's ``runtime``): the
    closed intervals' GPU time over its size, plus the open one."""
    ms = rec.gpu_ms // rec.size if rec.size else 0
    if rec.state == "placed" and rec.placed_at is not None:
        ms += max(0, now - rec.placed_at)
    return ms


def demand_rows(
    d: Daemon, start: int, now: int, stored: Iterable[TaskRecord] = ()
) -> Iterator[DemandRow]:
    """The tasks submitted at or after ``start``, in submission order (id order): those in
    memory and ``stored``, the ended ones that left it (history.py)."""
    records = d.records
    recs = [r for r in (records.get(i) for i in d.ids) if r is not None and r.submitted_at >= start]
    recs += [r for r in stored if r.id not in records]
    recs.sort(key=lambda r: r.id)
    for rec in recs:
        yield DemandRow(
            rec.id,
            rec.submitted_at,
            rec.resource,
            rec.user,
            rec.project,
            rec.gpus_milli,
            placed_ms(rec, now),
            rec.channel,
            status(rec),
        )


async def demand(request: web.Request) -> web.Response:
    d = ctx(request).daemon
    now = d.clock.now()
    try:
        start = since_ms(request.query.get("since"), now)
    except NotADate as exc:
        raise ApiError(422, "invalid-field", str(exc), {"field": "since"}) from None
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    if start > now:  # the clock's, not the form's
        raise ApiError(
            422, "invalid-field", "since: the window starts in the future", {"field": "since"}
        )
    headers = {
        "X-Klique-Revision": d.estate.revision,
        "Content-Disposition": 'attachment; filename="demand.csv"',
    }
    if d.estate.commit:
        headers["X-Klique-Commit"] = d.estate.commit
    stored = await ctx(request).store.read(
        lambda cur: history.page(cur, None, 2**62, submitted_from=start)
    )
    return web.Response(
        text=to_csv(demand_rows(d, start, now, stored)),
        content_type="text/csv",
        charset="utf-8",
        headers=headers,
    )


ROUTES = [
    Route(
        "GET",
        "/v1/demand",
        demand,
        "getDemand",
        ("admin", "planner"),
        hint="CI's `kliqued plan --what-if-from` holds a role:planner token",
    ),
]
