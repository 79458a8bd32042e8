"""Serving an ASGI application (the MCP SDK's Starlette endpoint) from an aiohttp handler.

The daemon is an aiohttp application; the MCP SDK's streamable HTTP transport is ASGI. Rather
than a second server on a second port (a second TLS setup, a second auth path), one aiohttp
request is handed to the ASGI app as one ASGI ``http`` request: the body aiohttp already read
(bounded by the app's body limit), the headers as they came, and the response streamed back
as the app sends it (a JSON answer, or an SSE stream).
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, MutableMapping

from aiohttp import web
from multidict import CIMultiDict

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[
    [Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]
]


def scope_of(request: web.Request) -> Scope:
    """The ASGI ``http`` scope of an aiohttp request."""
    peer = request.transport.get_extra_info("peername") if request.transport else None
    sock = request.transport.get_extra_info("sockname") if request.transport else None
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": f"{request.version.major}.{request.version.minor}",
        "method": request.method,
        "scheme": request.scheme,
        "path": request.path,
        "raw_path": request.raw_path.split("?", 1)[0].encode("latin-1"),
        "root_path": "",
        "query_string": request.query_string.encode("latin-1"),
        "headers": [
            (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in request.headers.items()
        ],
        "client": tuple(peer[:2]) if isinstance(peer, tuple) else None,
        "server": tuple(sock[:2]) if isinstance(sock, tuple) else None,
        "state": {},
    }


async def serve(app: ASGIApp, request: web.Request, body: bytes) -> web.StreamResponse:
    """Runs ``app`` on ``request`` (whose ``body`` is already read) and returns the response
    it sent, streamed to the client as it is sent. ``receive`` answers the body once, then
    ``http.disconnect`` once the response is complete (an SSE stream's end)."""
    done = asyncio.Event()
    given = False
    resp: web.StreamResponse | None = None

    async def receive() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal resp
        if message["type"] == "http.response.start":
            headers = CIMultiDict(
                (k.decode("latin-1"), v.decode("latin-1")) for k, v in message.get("headers", ())
            )
            resp = web.StreamResponse(status=message["status"], headers=headers)
        elif message["type"] == "http.response.body":
            if resp is None:
                raise RuntimeError("ASGI app sent a body before its status")
            if not resp.prepared:
                await resp.prepare(request)
            data = message.get("body", b"")
            if data:
                await resp.write(data)
            if not message.get("more_body", False):
                await resp.write_eof()
                done.set()

    try:
        await app(scope_of(request), receive, send)
    finally:
        done.set()
    if resp is None:
        raise RuntimeError("ASGI app returned without a response")
    if not resp.prepared:
        await resp.prepare(request)
        await resp.write_eof()
    return resp
