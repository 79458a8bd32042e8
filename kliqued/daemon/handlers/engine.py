"""The engine switch."""

from __future__ import annotations

from aiohttp import web

from .. import views
from ..app import ctx, read_json, reply
from ..errors import forbidden


async def get_engine(request: web.Request) -> web.Response:
    c = ctx(request)
    return reply(views.engine(c.daemon, c.pass_interval_s))


async def set_engine(request: web.Request) -> web.Response:
    c = ctx(request)
    p = request["principal"]
    if not p.is_admin:
        raise forbidden("only an admin switches the engine")
    body = await read_json(request, "EngineSwitch")
    enabled = bool(body["enabled"])
    await c.seq.submit(lambda now, ov: c.daemon.prepare_engine(p, enabled, now, ov))
    return reply(views.engine(c.daemon, c.pass_interval_s))
