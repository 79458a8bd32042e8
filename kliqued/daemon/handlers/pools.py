"""Pools: capacity, used, borrowed and free."""

from __future__ import annotations

from aiohttp import web

from .. import views
from ..request import ctx, principal, reply
from ..routes import ANY, Route


async def list_pools(request: web.Request) -> web.Response:
    d = ctx(request).daemon
    p = principal(request)
    return reply({"pools": views.pools(d, p.name if p.is_worker else None)})


ROUTES = [
    Route("GET", "/v1/pools", list_pools, "listPools", ANY, rule="a worker: its own pool"),
]
