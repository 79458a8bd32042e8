"""The running estate revision (and, with GitOps reload, the last refused one)."""

from __future__ import annotations

from aiohttp import web

from kliqued.daemon.api import views
from kliqued.daemon.api.request import ctx, reply
from kliqued.daemon.api.routes import ANY, Route


async def get_estate(request: web.Request) -> web.Response:
    return reply(views.estate(ctx(request).daemon))


ROUTES = [
    Route("GET", "/v1/estate", get_estate, "getEstate", ANY),
]
