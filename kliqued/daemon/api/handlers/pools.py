"""Pools: capacity, used, borrowed and free; an autoscaled cloud pool's nodes, spend and
scaling (the autoscaler's calls: cloud.py)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from kliqued.daemon.api import views
from kliqued.daemon.fleet import autoscalers, cloud
from kliqued.daemon.auth import Principal
from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.errors import bad_request
from kliqued.daemon.api.request import ctx, principal, read_json, reply
from kliqued.daemon.api.routes import ANY, Route

ADMIN = ("admin",)
REASON_MAX = 500


async def list_pools(request: web.Request) -> web.Response:
    return reply(pools_of(ctx(request).daemon, principal(request)))


def pools_of(d: Daemon, p: Principal) -> dict[str, Any]:
    """``listPools`` for ``p`` (a worker: its own pool only; ``by_level``: the use of the
    groups ``p`` may see, as for policies: a department head sees their teams on each
    pool; ``capacity_truth`` and its warnings for those who can fix a pool or a machine)."""
    acc = d.acc()

    def sees(group: str) -> bool:
        return p.is_finance or acc.sees_group(p, group)

    only = p.name if p.is_worker else None
    return {"pools": views.pools(d, only, sees, truth=acc.fixes_pools(p))}


async def node_started(request: web.Request) -> web.Response:
    """``POST /v1/pools/{pool}/nodes``: a node the autoscaler started (201), or the same
    node again (200)."""
    c = ctx(request)
    p = principal(request)
    pool = request.match_info["pool"]
    body = await read_json(request, "CloudNodeStart")
    node, created = await c.seq.submit(
        lambda now, ov: cloud.prepare_started(c.daemon, p, pool, body, now, ov), barrier=True
    )
    return reply(node, 201 if created else 200)


async def node_ended(request: web.Request) -> web.Response:
    """``DELETE /v1/pools/{pool}/nodes/{node}?reason=``: a node the autoscaler released."""
    c = ctx(request)
    p = principal(request)
    pool, node = request.match_info["pool"], request.match_info["node"]
    reason = request.query.get("reason") or "released"
    if len(reason) > REASON_MAX:
        raise bad_request(
            f"reason: at most {REASON_MAX} characters, found {len(reason)}", {"field": "reason"}
        )
    answer = await c.seq.submit(
        lambda now, ov: cloud.prepare_ended(c.daemon, p, pool, node, reason, now, ov), barrier=True
    )
    return reply(answer)


async def scaling(request: web.Request) -> web.Response:
    """``POST /v1/pools/{pool}/scaling``: why placed work waits for a node, or that it no
    longer does (``cause: null``); answers the pool's ``cloud`` view."""
    c = ctx(request)
    p = principal(request)
    pool = request.match_info["pool"]
    body = await read_json(request, "ScalingReport")
    answer = await c.seq.submit(
        lambda now, ov: cloud.prepare_scaling(c.daemon, p, pool, body, now, ov), barrier=True
    )
    return reply(answer)


async def autoscaler_heartbeat(request: web.Request) -> web.Response:
    """``POST /v1/pools/{pool}/autoscaler``: the pool's autoscaler runs (every round); an
    autoscaled pool with no live worker takes work only while it does (autoscalers.py)."""
    c = ctx(request)
    p = principal(request)
    pool = request.match_info["pool"]
    body = await read_json(request, "AutoscalerHeartbeat")
    answer = await c.seq.submit(
        lambda now, ov: autoscalers.prepare_heartbeat(c.daemon, p, pool, body, now, ov)
    )
    return reply(answer)


ROUTES = [
    Route(
        "GET",
        "/v1/pools",
        list_pools,
        "listPools",
        ANY,
        rule="a worker: its own pool; `by_level`: the groups the caller sees, as for policies",
    ),
    Route(
        "POST",
        "/v1/pools/{pool}/nodes",
        node_started,
        "recordCloudNode",
        ADMIN,
        rule="an autoscaled cloud pool",
    ),
    Route(
        "DELETE",
        "/v1/pools/{pool}/nodes/{node}",
        node_ended,
        "endCloudNode",
        ADMIN,
        rule="a node recorded in that pool",
    ),
    Route(
        "POST",
        "/v1/pools/{pool}/scaling",
        scaling,
        "reportScaling",
        ADMIN,
        rule="an autoscaled cloud pool",
    ),
    Route(
        "POST",
        "/v1/pools/{pool}/autoscaler",
        autoscaler_heartbeat,
        "autoscalerHeartbeat",
        ADMIN,
        rule="an autoscaled cloud pool",
    ),
]
