"""Compute resources and their queues."""

from __future__ import annotations

from itertools import islice
from typing import Any

from aiohttp import web

from klique_util.excerpt import excerpt

from kliqued.daemon.api import views
from kliqued.daemon.auth import Principal
from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.errors import forbidden, not_found
from kliqued.daemon.api.request import ctx, principal, reply
from kliqued.daemon.api.routes import Route
from kliqued.daemon.units import gpus, iso
from kliqued.daemon.api.handlers.params import int_param


async def list_resources(request: web.Request) -> web.Response:
    return reply(resources_of(ctx(request).daemon, principal(request)))


def resources_of(d: Daemon, p: Principal) -> dict[str, Any]:
    """``listResources`` for ``p``: the compute resources they may see (a user: their groups'),
    each saying whether they may submit to it (the MCP tools answer with it too)."""
    idx = d.idx()
    if p.is_user:
        acc = d.acc()
        names = sorted(n for n, cr in idx.resources.items() if acc.sees_group(p, cr.group))
    else:
        names = sorted(idx.resources)
    rooms: dict = {}
    return {"resources": [views.resource(d, n, p, rooms) for n in names]}


async def queue(request: web.Request) -> web.Response:
    d = ctx(request).daemon
    p = principal(request)
    name = f"{request.match_info['policy']}/{request.match_info['profile']}"
    limit = int_param(request, "limit", 1000, 1, 10000)
    cr = d.idx().resources.get(name)
    if cr is None:
        raise not_found(f"no compute resource {excerpt(name, quoted=False)}")
    if not d.acc().sees_group(p, cr.group):
        raise forbidden(f"{p.text} is not in group {cr.group}")
    q = d.st().queues.get(name)
    tasks = list(islice(iter(q), limit)) if q is not None else []
    entries = []
    many = len(tasks) > 20
    for pos, t in enumerate(tasks, 1):
        rec = d.records[t.id]
        entries.append(
            {
                "id": t.id,
                "user": t.user,
                "position": pos,
                "gpus": gpus(t.size),
                "waiting_reason": views.reason_json(d.reason(rec, many)),
                "submitted_at": iso(t.submitted_at),
            }
        )
    return reply({"resource": name, "queued": q.live if q is not None else 0, "queue": entries})


ROUTES = [
    Route(
        "GET",
        "/v1/resources",
        list_resources,
        "listResources",
        ("admin", "finance", "user"),
        rule="a user: their groups' compute resources",
    ),
    Route(
        "GET",
        "/v1/resources/{policy}/{profile}/queue",
        queue,
        "getQueue",
        ("admin", "user"),
        rule="a user: the queues of groups they are in or administer",
    ),
]
