"""Health, the OpenAPI document and whoami."""

from __future__ import annotations

from aiohttp import web

from .. import views
from ..app import ctx, reply
from ..openapi import document


async def health(request: web.Request) -> web.Response:
    d = ctx(request).daemon
    if not d.ready:
        return reply({"status": "starting", "revision": "", "engine": "disabled"})
    return reply({"status": "ok", "revision": d.estate.revision,
                  "engine": "enabled" if d.st().enabled else "disabled"})


async def openapi(request: web.Request) -> web.Response:
    return reply(document(ctx(request).server_url))


async def whoami(request: web.Request) -> web.Response:
    return reply(views.whoami(ctx(request).daemon, request["principal"]))
