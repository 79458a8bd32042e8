"""Pools: capacity, used, borrowed and free."""

from __future__ import annotations

from aiohttp import web

from .. import views
from ..app import ctx, reply


async def list_pools(request: web.Request) -> web.Response:
    d = ctx(request).daemon
    p = request["principal"]
    return reply({"pools": views.pools(d, p.name if p.is_worker else None)})
