"""The engine switch."""

from __future__ import annotations

from aiohttp import web

from kliqued.daemon.api import views
from kliqued.daemon.api.request import ctx, principal, read_json, reply
from kliqued.daemon.api.routes import ANY, Route


async def get_engine(request: web.Request) -> web.Response:
    c = ctx(request)
    return reply(views.engine(c.daemon, c.pass_interval_s))


async def set_engine(request: web.Request) -> web.Response:
    c = ctx(request)
    p = principal(request)
    body = await read_json(request, "EngineSwitch")
    enabled = bool(body["enabled"])
    await c.seq.submit(lambda now, ov: c.daemon.prepare_engine(p, enabled, now, ov))
    return reply(views.engine(c.daemon, c.pass_interval_s))


ROUTES = [
    Route("GET", "/v1/engine", get_engine, "getEngine", ANY),
    Route("POST", "/v1/engine", set_engine, "setEngine", ("admin",)),
]
