"""Health, the OpenAPI document and whoami."""

from __future__ import annotations

from aiohttp import web

from kliqued.daemon.api import views
from kliqued.daemon.api.request import DOC, ctx, principal, reply
from kliqued.daemon.api.routes import ANY, PUBLIC, Route


async def health(request: web.Request) -> web.Response:
    d = ctx(request).daemon
    if not d.ready:
        return reply({"status": "starting", "revision": "", "engine": "disabled"})
    away = ctx(request).seq.away
    body = {
        "status": "ok",
        "revision": d.estate.revision,
        "engine": "enabled" if d.st().enabled else "disabled",
    }
    if away is not None:  # reads answer, writes are refused until the store is back
        body["status"] = "degraded"
        body["degraded"] = f"store unavailable ({away.text()})"
    return reply(body)


async def openapi(request: web.Request) -> web.Response:
    return reply(request.app[DOC])


async def whoami(request: web.Request) -> web.Response:
    return reply(views.whoami(ctx(request).daemon, principal(request)))


ROUTES = [
    Route("GET", "/v1/health", health, "health", PUBLIC),
    Route("GET", "/v1/openapi.json", openapi, "openapi", PUBLIC),
    Route("GET", "/v1/whoami", whoami, "whoami", ANY),
]
