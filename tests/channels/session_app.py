"""A tiny session app for the tests (beside the real JupyterLab test: this one shows what the
relay passes on, and idles at once): an aiohttp server on
127.0.0.1:$KLIQUE_SESSION_PORT under $KLIQUE_SESSION_PREFIX, as a session's app must be.

``GET <prefix>`` answers the headers it received (so a test sees what the relay passed on)
and sets a cookie of its own; ``POST <prefix>echo`` answers its body; ``<prefix>ws`` is a
WebSocket that echoes each message."""

import os

from aiohttp import web

PREFIX = os.environ["KLIQUE_SESSION_PREFIX"]


async def index(request: web.Request) -> web.Response:
    resp = web.json_response(
        {"hello": "from the session", "path": request.path_qs, "headers": dict(request.headers)}
    )
    resp.set_cookie("_xsrf", "app-cookie", path=PREFIX)
    return resp


async def echo(request: web.Request) -> web.Response:
    return web.Response(body=await request.read(), content_type="application/octet-stream")


async def ws(request: web.Request) -> web.WebSocketResponse:
    sock = web.WebSocketResponse()
    await sock.prepare(request)
    async for msg in sock:
        if msg.type == web.WSMsgType.TEXT:
            await sock.send_str("echo: " + msg.data)
        elif msg.type == web.WSMsgType.BINARY:
            await sock.send_bytes(msg.data[::-1])
    return sock


app = web.Application()
app.router.add_get(PREFIX, index)
app.router.add_post(PREFIX + "echo", echo)
app.router.add_get(PREFIX + "ws", ws)
print("listening on", os.environ["KLIQUE_SESSION_PORT"], flush=True)
web.run_app(app, host="127.0.0.1", port=int(os.environ["KLIQUE_SESSION_PORT"]), print=None)
