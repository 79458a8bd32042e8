"""The worker's end of a session's tunnel (issue 14, sessions; docs/channels.md).

A session's app listens on 127.0.0.1 only (a port this module picks, given to the app as
``$KLIQUE_SESSION_PORT``); nothing listens on the worker's public side. The worker opens a
WebSocket *out* to the control plane (``GET /v1/sessions/{task}/tunnel``, with its token
and key, as every call it makes) and answers the requests the control plane sends over it
by making them to the app (frames: klique_util/tunnel.py). The app's answers are streamed
back in frames of ``CHUNK`` bytes, at most ``WINDOW`` bytes ahead of what the daemon has
written to the client: a large answer is neither cut nor held whole. A cut connection is
opened again with backoff for as long as the task runs; a refusal that cannot change (the
lease ended, not a session) ends the tunnel.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from typing import Any

import aiohttp

from klique_util.excerpt import excerpt
from klique_util.tunnel import (
    CHUNK,
    MAX_BODY,
    MAX_FRAME,
    MAX_WS_MESSAGE,
    WINDOW,
    FrameTooLarge,
    b64,
    forwardable,
    frame,
    unb64,
)

log = logging.getLogger(__name__)

PORT_ENV = "KLIQUE_SESSION_PORT"
PREFIX_ENV = "KLIQUE_SESSION_PREFIX"


def is_session(lease: dict) -> bool:
    """A session's lease: its ``channel`` (when tasks carry one) or its channel label."""
    labels = lease.get("labels") or {}
    return lease.get("channel") == "session" or labels.get("klique.channel") == "session"


def free_port() -> int:
    """A port free on 127.0.0.1 now, for the app to listen on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def session_env(task: str, port: int) -> dict[str, str]:
    return {PORT_ENV: str(port), PREFIX_ENV: f"/sessions/{task}/"}


class Window:
    """The credit of one streamed answer: ``spend`` waits while ``size`` bytes or more are
    sent and not yet acknowledged (``credit``), so a slow client holds the app back instead
    of the worker's or the daemon's memory growing."""

    def __init__(self, size: int = WINDOW) -> None:
        self.size, self.out = size, 0
        self.room = asyncio.Event()
        self.room.set()

    async def spend(self, n: int) -> None:
        while self.out >= self.size:
            self.room.clear()
            await self.room.wait()
        self.out += n

    def credit(self, n: int) -> None:
        self.out = max(0, self.out - n)
        if self.out < self.size:
            self.room.set()


class _Relay:
    """One connection of the tunnel: the requests it carries, made to the app."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, port: int) -> None:
        self.ws, self.port = ws, port
        # the control plane gives up on an answer after 5 minutes; so does the worker
        self.app = aiohttp.ClientSession(
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=300),
        )
        self.lock = asyncio.Lock()
        self.sockets: dict[int, aiohttp.ClientWebSocketResponse] = {}
        self.windows: dict[int, Window] = {}
        self.exchanges: dict[int, asyncio.Task] = {}
        self.jobs: set[asyncio.Task] = set()

    async def send(self, msg: dict[str, Any]) -> None:
        text = frame(msg)  # FrameTooLarge before the lock: nothing half sent
        async with self.lock:
            await self.ws.send_str(text)

    def spawn(self, coro: Any, rid: int | None = None) -> None:
        job = asyncio.ensure_future(coro)
        self.jobs.add(job)
        job.add_done_callback(self.jobs.discard)
        if rid is not None:
            self.exchanges[rid] = job
            job.add_done_callback(lambda _: self.exchanges.pop(rid, None))

    def _local(self, scheme: str, msg: dict[str, Any]) -> str:
        """The app's URL for the request's path: on 127.0.0.1 and this port, whatever the
        path holds (a path that does not start with ``/`` is refused)."""
        path = str(msg.get("path") or "/")
        if not path.startswith("/"):
            raise ValueError(f"not a path: {excerpt(path)}")
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    async def http(self, msg: dict[str, Any]) -> None:
        rid = msg["id"]
        try:
            url = self._local("http", msg)
        except ValueError as exc:
            await self.send({"op": "error", "id": rid, "message": str(exc)})
            return
        try:
            async with self.app.request(
                str(msg.get("method") or "GET"),
                url,
                headers=[tuple(h) for h in msg.get("headers") or []],
                data=unb64(msg.get("body")),
                allow_redirects=False,
            ) as resp:
                head = {
                    "op": "http",
                    "id": rid,
                    "status": resp.status,
                    "headers": forwardable(resp.headers.items()),
                }
                if msg.get("stream") is True:
                    await self._stream(rid, head, resp)
                else:
                    await self._whole(rid, head, resp)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            await self.send(
                {
                    "op": "error",
                    "id": rid,
                    "message": "the session's app does "
                    f"not answer on its port (yet?), or its answer broke off: "
                    f"{type(exc).__name__}",
                }
            )

    async def _stream(self, rid: int, head: dict[str, Any], resp: aiohttp.ClientResponse) -> None:
        """The answer in frames of ``CHUNK`` bytes, each sent when the window has room."""
        window = self.windows[rid] = Window()
        try:
            await self.send({**head, "stream": True})
            async for chunk in resp.content.iter_chunked(CHUNK):
                await window.spend(len(chunk))
                await self.send({"op": "http-data", "id": rid, "data": b64(chunk)})
            await self.send({"op": "http-end", "id": rid})
        finally:
            self.windows.pop(rid, None)

    async def _whole(self, rid: int, head: dict[str, Any], resp: aiohttp.ClientResponse) -> None:
        """The answer in one frame, for a daemon that does not ask for a stream: the whole
        body read (not what one read returns), up to ``MAX_BODY``."""
        body = bytearray()
        async for chunk in resp.content.iter_chunked(CHUNK):
            body += chunk
            if len(body) > MAX_BODY:
                await self.send(
                    {
                        "op": "error",
                        "id": rid,
                        "message": "the app's answer "
                        f"is larger than {MAX_BODY // (1024 * 1024)} MiB, the "
                        "most a session relays in one response",
                    }
                )
                return
        await self.send({**head, "body": b64(bytes(body))})

    async def ws_open(self, msg: dict[str, Any]) -> None:
        rid = msg["id"]
        try:
            url = self._local("ws", msg)
            app_ws = await self.app.ws_connect(
                url,
                headers=[tuple(h) for h in msg.get("headers") or []],
                max_msg_size=MAX_WS_MESSAGE,
            )
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError, ValueError) as exc:
            await self.send(
                {
                    "op": "error",
                    "id": rid,
                    "message": "the session's app refused "
                    f"the WebSocket: {type(exc).__name__}: {exc}",
                }
            )
            return
        self.sockets[rid] = app_ws
        await self.send({"op": "ws-open", "id": rid})
        try:
            async for msg_in in app_ws:
                if msg_in.type == aiohttp.WSMsgType.TEXT:
                    await self.send({"op": "ws-msg", "id": rid, "text": msg_in.data})
                elif msg_in.type == aiohttp.WSMsgType.BINARY:
                    await self.send({"op": "ws-msg", "id": rid, "data": b64(msg_in.data)})
        except FrameTooLarge:
            await app_ws.close(code=aiohttp.WSCloseCode.MESSAGE_TOO_BIG)
        finally:
            if self.sockets.pop(rid, None) is not None:
                try:
                    await self.send(
                        {"op": "ws-close", "id": rid, "code": app_ws.close_code or 1000}
                    )
                except (ConnectionError, RuntimeError):
                    pass

    async def ws_msg(self, msg: dict[str, Any]) -> None:
        app_ws = self.sockets.get(msg["id"])
        if app_ws is None:
            return
        if "text" in msg:
            await app_ws.send_str(str(msg["text"]))
        else:
            await app_ws.send_bytes(unb64(msg.get("data")))

    async def serve(self) -> None:
        try:
            async for frame_in in self.ws:
                if frame_in.type != aiohttp.WSMsgType.TEXT:
                    continue
                try:
                    msg = json.loads(frame_in.data)
                except ValueError:
                    continue
                if not isinstance(msg, dict) or not isinstance(msg.get("id"), int):
                    continue
                op, rid = msg.get("op"), msg["id"]
                if op == "http":
                    self.spawn(self.http(msg), rid)
                elif op == "http-ack":
                    window = self.windows.get(rid)
                    if window is not None and isinstance(msg.get("n"), int):
                        window.credit(msg["n"])
                elif op == "http-cancel":
                    job = self.exchanges.get(rid)
                    if job is not None:
                        job.cancel()
                elif op == "ws-open":
                    self.spawn(self.ws_open(msg))
                elif op == "ws-msg":
                    await self.ws_msg(msg)
                elif op == "ws-close":
                    app_ws = self.sockets.pop(rid, None)
                    if app_ws is not None:
                        await app_ws.close()
        finally:
            for job in list(self.jobs):
                job.cancel()
            await asyncio.gather(*self.jobs, return_exceptions=True)
            for app_ws in list(self.sockets.values()):
                await app_ws.close()
            await self.app.close()


async def run(client: Any, task: str, epoch: int, port: int) -> None:
    """Keeps the tunnel of session ``task`` open until cancelled (the task ended) or refused
    for good."""
    delay = 0.5
    while True:
        try:
            session = await client.session()
            async with session.ws_connect(
                f"{client.base}/sessions/{task}/tunnel",
                params={"epoch": str(epoch)},
                headers=client.auth_headers(),
                heartbeat=20,
                max_msg_size=MAX_FRAME,
            ) as ws:
                log.info("session %s: tunnel to the control plane open", task)
                delay = 0.5
                await _Relay(ws, port).serve()
            log.info("session %s: tunnel closed by the control plane", task)
        except aiohttp.WSServerHandshakeError as exc:
            if exc.status in (403, 404, 409):
                log.warning(
                    "session %s: the control plane refuses its tunnel (%s %s); not retried",
                    task,
                    exc.status,
                    exc.message,
                )
                return
            log.info("session %s: tunnel refused (%s); retrying in %.1fs", task, exc.status, delay)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            log.info(
                "session %s: tunnel down (%s: %s); retrying in %.1fs",
                task,
                type(exc).__name__,
                exc,
                delay,
            )
        await asyncio.sleep(delay)
        delay = min(delay * 2, 10.0)
