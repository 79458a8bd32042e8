"""The event and audit log: who started what, on which compute resource and pool, under
which estate revision, why it was preempted. Read from DuckDB (committed events only)."""

from __future__ import annotations

from aiohttp import web

from klique_util.excerpt import excerpt

from kliqued.daemon import limits
from kliqued.daemon.api import views
from kliqued.daemon.state import history
from kliqued.daemon.auth import Principal
from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.errors import not_found
from kliqued.daemon.api.request import ctx, principal, reply
from kliqued.daemon.api.routes import Route
from kliqued.daemon.api.handlers.params import int_param, str_param


def scope(d: Daemon, p: Principal) -> tuple[list[str], list]:
    """The SQL conditions (and their parameters) on ``events`` that keep what ``p`` may read:
    everything for admins and finance; for a user, their tasks and their admin groups' events,
    budget alerts included (the route's rule; the web UI's event log and audit trail use it
    too). A group's budget alerts are for its admins, who can act on them, not for every
    member (``Access.fixes_budget``, issue 32)."""
    if not p.is_user:
        return [], []
    admin = sorted(d.acc().admin_of(p.name))
    return (["(usr = ? OR list_contains(?::VARCHAR[], grp))"], [p.name, admin])


async def list_events(request: web.Request) -> web.Response:
    c = ctx(request)
    d = c.daemon
    p = principal(request)
    task = str_param(request, "task")
    kind = str_param(request, "kind")
    since = int_param(request, "since", 0, 0, 2**62)
    limit = int_param(request, "limit", 100, 1, 1000)
    assert limit is not None
    where: list[str] = ["seq > ?"]
    params: list = [since]
    if task is not None:
        rec = await history.recall(c.store, d, task)
        if (
            rec is None
            or not d.acc().sees_task(p, rec.user, rec.group)
            and not (p.is_admin or p.is_finance)
        ):
            # as GET /tasks/{id}: another user's task is not disclosed, and an empty log
            # would read as "nothing happened"
            raise not_found(f"no task {excerpt(task, quoted=False)}")
        where.append("task = ?")
        params.append(task)
    if kind is not None:
        where.append("kind = ?")
        params.append(kind)
    cond, args = scope(d, p)
    where += cond
    params += args
    rows, more = await c.store.read(
        lambda cur: c.store.page_events(cur, where, params, limit, limits.MAX_PAGE_BYTES)
    )
    return reply(
        {
            "events": [views.event(r) for r in rows],
            "next": rows[-1]["seq"] if more and rows else None,
        }
    )


ROUTES = [
    Route(
        "GET",
        "/v1/events",
        list_events,
        "listEvents",
        ("admin", "finance", "user"),
        rule="a user: their tasks, and their admin groups' tasks and budget alerts",
    ),
]
