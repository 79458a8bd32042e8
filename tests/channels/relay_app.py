"""A session app for the relay's tests (tests/channels/test_session_relay.py): large answers
and large WebSocket messages, on 127.0.0.1:$KLIQUE_SESSION_PORT under
$KLIQUE_SESSION_PREFIX.

``GET <prefix>big?mib=N&seed=S`` answers N MiB of ``random.Random(S).randbytes`` (with its
Content-Length, as a static file is served), written in 64 KiB pieces; ``GET <prefix>cut``
promises 4 MiB and breaks off after 1 MiB; ``<prefix>ws`` echoes each WebSocket message, and answers ``send N`` with N MiB."""

import os
import random

from aiohttp import web

PREFIX = os.environ["KLIQUE_SESSION_PREFIX"]


def payload(mib: float, seed: int) -> bytes:
    return random.Random(seed).randbytes(int(mib * 1024 * 1024))


async def index(request: web.Request) -> web.Response:
    return web.json_response({"hello": "relay app"})


async def big(request: web.Request) -> web.StreamResponse:
    body = payload(float(request.query["mib"]), int(request.query["seed"]))
    resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    resp.content_length = len(body)
    await resp.prepare(request)
    for at in range(0, len(body), 64 * 1024):
        await resp.write(body[at : at + 64 * 1024])
    await resp.write_eof()
    return resp


async def cut(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    resp.content_length = 4 * 1024 * 1024
    await resp.prepare(request)
    await resp.write(b"x" * 1024 * 1024)
    assert request.transport is not None
    request.transport.close()
    return resp


async def ws(request: web.Request) -> web.WebSocketResponse:
    sock = web.WebSocketResponse(max_msg_size=64 * 1024 * 1024)
    await sock.prepare(request)
    async for msg in sock:
        if msg.type == web.WSMsgType.TEXT and msg.data.startswith("send "):
            await sock.send_bytes(payload(float(msg.data.split()[1]), 0))
        elif msg.type == web.WSMsgType.TEXT:
            await sock.send_str(msg.data)
        elif msg.type == web.WSMsgType.BINARY:
            await sock.send_bytes(msg.data)
    return sock


app = web.Application()
app.router.add_get(PREFIX, index)
app.router.add_get(PREFIX + "big", big)
app.router.add_get(PREFIX + "cut", cut)
app.router.add_get(PREFIX + "ws", ws)
web.run_app(app, host="127.0.0.1", port=int(os.environ["KLIQUE_SESSION_PORT"]), print=None)
