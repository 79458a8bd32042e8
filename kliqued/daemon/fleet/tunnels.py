"""The daemon's end of the session tunnels: the WebSocket each running session's worker opened
(``GET /v1/sessions/{id}/tunnel``), and the requests sent over it (wire format:
klique_util/tunnel.py).

One ``Tunnel`` per session task: ``request`` relays an HTTP exchange and waits for the head
of its answer, whose body ``respond`` streams to the client frame by frame, acknowledging
each once written (so at most ``WINDOW`` bytes of it are in flight, whatever its size);
``open_ws`` starts a relayed WebSocket whose messages arrive on a queue. A worker
that connects again (after a restart or a network cut) replaces the old tunnel; whatever was
waiting on the old one gets a 502. Nothing here is persisted: a tunnel lives as long as its
connection.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web
from multidict import CIMultiDict

from klique_util.tunnel import b64, forwardable, frame, unb64

from kliqued.daemon.errors import ApiError

log = logging.getLogger(__name__)

ANSWER_TIMEOUT_S = 300.0
"""How long a relayed HTTP request may take (a notebook's long cell output streams through
its WebSocket, not through one request)."""


def _gone(task: str, why: str) -> ApiError:
    return ApiError(502, "session-unreachable", f"session {task}: {why}", {"session": task})


class BrokenAnswer(Exception):
    """The app's answer broke off after its head was sent to the client: too late for a 502,
    so ``respond`` cuts the client's connection (an incomplete response, never a short one
    that looks whole)."""


@dataclass
class Answer:
    """The head of the app's answer to one relayed request, and its body as it arrives
    (``chunks``); ``close`` tells the worker to stop sending it when it was not read to
    its end."""

    tunnel: Tunnel
    rid: int
    status: int
    headers: list[list[str]]
    frames: asyncio.Queue
    whole: bytes | None = None
    done: bool = False

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body, chunk by chunk; each is acknowledged when the caller asks for the next
        (it was written by then), which lets the worker send more."""
        if self.whole is not None:  # a worker of before streaming: the body in the head
            self.done = True
            if self.whole:
                yield self.whole
            return
        while True:
            try:
                msg = await asyncio.wait_for(self.frames.get(), ANSWER_TIMEOUT_S)
            except asyncio.TimeoutError:
                raise BrokenAnswer(
                    f"no more of the app's answer within {ANSWER_TIMEOUT_S:g} s"
                ) from None
            op = msg.get("op")
            if op == "http-end":
                self.done = True
                return
            if op != "http-data":
                self.done = True  # the worker gave up on it: nothing to cancel
                raise BrokenAnswer(str(msg.get("message") or "the app's answer broke off"))
            data = unb64(msg.get("data"))
            yield data
            await self.tunnel._send({"op": "http-ack", "id": self.rid, "n": len(data)})

    async def close(self) -> None:
        self.tunnel.exchanges.pop(self.rid, None)
        if not self.done and not self.tunnel.closed:
            self.done = True
            try:
                await self.tunnel._send({"op": "http-cancel", "id": self.rid})
            except ApiError:
                pass


async def respond(
    request: web.BaseRequest, answer: Answer, headers: CIMultiDict[str] | None = None
) -> web.StreamResponse:
    """The app's answer, streamed to the client as it arrives over the tunnel; cut (the
    connection closed before the body's end) when the answer breaks off, and stopped at the
    worker when the client goes away. ``headers``: the answer's headers as the client may
    get them (the session proxy's filter); by default its forwardable ones."""
    if headers is None:
        headers = CIMultiDict(
            (k, v) for k, v in forwardable((str(h[0]), str(h[1])) for h in answer.headers)
        )
    out = web.StreamResponse(status=answer.status, headers=headers)
    try:
        await out.prepare(request)
        async for chunk in answer.chunks():
            await out.write(chunk)
        await out.write_eof()
    except BrokenAnswer as exc:
        log.warning(
            "session %s: %s %s: %s; the client's connection is cut",
            answer.tunnel.task,
            request.method,
            request.path,
            exc,
        )
        if request.transport is not None:
            request.transport.close()
    except (ConnectionError, ApiError):
        pass  # the client went away, or the tunnel broke (the worker gets no more acks)
    finally:
        await answer.close()
    return out


@dataclass
class Tunnel:
    task: str
    epoch: int
    ws: web.WebSocketResponse
    pending: dict[int, asyncio.Future] = field(default_factory=dict)
    channels: dict[int, asyncio.Queue] = field(default_factory=dict)
    exchanges: dict[int, asyncio.Queue] = field(default_factory=dict)
    ids: Any = field(default_factory=lambda: itertools.count(1))
    closed: bool = False

    async def _send(self, msg: dict[str, Any]) -> None:
        if self.closed:
            raise _gone(self.task, "its worker's tunnel closed")
        try:
            await self.ws.send_str(frame(msg))
        except (ConnectionError, RuntimeError) as exc:
            raise _gone(self.task, f"its worker's tunnel broke ({exc})") from None

    async def request(
        self, method: str, path: str, headers: list[list[str]], body: bytes
    ) -> Answer:
        """Sends one HTTP request to the app and waits for the head of its answer (a 502
        when the worker cannot reach the app or it does not answer in time); the body
        follows, read with ``Answer.chunks`` (``respond``)."""
        rid = next(self.ids)
        frames: asyncio.Queue = asyncio.Queue()
        self.exchanges[rid] = frames
        try:
            await self._send(
                {
                    "op": "http",
                    "id": rid,
                    "method": method,
                    "path": path,
                    "headers": headers,
                    "body": b64(body),
                    "stream": True,
                }
            )
            head = await asyncio.wait_for(frames.get(), ANSWER_TIMEOUT_S)
        except asyncio.TimeoutError:
            self.exchanges.pop(rid, None)
            if not self.closed:  # the worker may still be at it
                await self._send({"op": "http-cancel", "id": rid})
            raise _gone(
                self.task, f"the app did not answer within {ANSWER_TIMEOUT_S:g} s"
            ) from None
        except BaseException:
            self.exchanges.pop(rid, None)
            raise
        if head.get("op") != "http":
            self.exchanges.pop(rid, None)
            raise _gone(self.task, str(head.get("message") or "the app did not answer"))
        streamed = head.get("stream") is True
        return Answer(
            self,
            rid,
            int(head.get("status") or 502),
            head.get("headers") or [],
            frames,
            whole=None if streamed else unb64(head.get("body")),
            done=not streamed,
        )

    async def open_ws(self, path: str, headers: list[list[str]]) -> tuple[int, asyncio.Queue]:
        """Opens a WebSocket to the app at ``path``: its exchange id and the queue its
        messages arrive on, then its ``ws-close`` (with the app's close code), or None when
        the tunnel closed."""
        rid = next(self.ids)
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self.pending[rid] = fut
        queue: asyncio.Queue = asyncio.Queue()
        self.channels[rid] = queue
        try:
            await self._send({"op": "ws-open", "id": rid, "path": path, "headers": headers})
            answer = await asyncio.wait_for(fut, 30)
        except BaseException:
            self.channels.pop(rid, None)
            raise
        finally:
            self.pending.pop(rid, None)
        if answer.get("op") == "error":
            self.channels.pop(rid, None)
            raise _gone(self.task, str(answer.get("message") or "the app refused"))
        return rid, queue

    async def ws_send(self, rid: int, msg: dict[str, Any]) -> None:
        await self._send({**msg, "id": rid})

    async def ws_close(self, rid: int) -> None:
        if self.channels.pop(rid, None) is not None and not self.closed:
            try:
                await self._send({"op": "ws-close", "id": rid})
            except ApiError:
                pass

    def dispatch(self, msg: dict[str, Any]) -> None:
        """One frame from the worker: an answer, or a message of a relayed WebSocket."""
        rid, op = msg.get("id"), msg.get("op")
        if not isinstance(rid, int):
            return
        exchange = self.exchanges.get(rid)
        if exchange is not None and op in ("http", "http-data", "http-end", "error"):
            exchange.put_nowait(msg)
            return
        if op in ("ws-msg", "ws-close"):
            queue = self.channels.get(rid)
            if queue is not None:
                queue.put_nowait(msg)  # a ws-close ends it, with its code
                if op == "ws-close":
                    self.channels.pop(rid, None)
            return
        fut = self.pending.get(rid)
        if fut is not None and not fut.done():
            fut.set_result(msg)

    def close(self) -> None:
        self.closed = True
        for fut in self.pending.values():
            if not fut.done():
                fut.set_result({"op": "error", "message": "its worker's tunnel closed"})
        for frames in self.exchanges.values():
            frames.put_nowait({"op": "error", "message": "its worker's tunnel closed"})
        for queue in self.channels.values():
            queue.put_nowait(None)
        self.channels.clear()


class Tunnels:
    """The open tunnels, by session task id."""

    def __init__(self) -> None:
        self.by_task: dict[str, Tunnel] = {}

    def get(self, task: str, epoch: int) -> Tunnel | None:
        """The open tunnel of the task's lease ``epoch``: a tunnel of an older lease (the
        task was requeued to another worker, its old copy not yet fenced) is not used."""
        t = self.by_task.get(task)
        return None if t is None or t.closed or t.epoch != epoch else t

    async def serve(self, task: str, epoch: int, ws: web.WebSocketResponse) -> None:
        """Runs the worker's tunnel ``ws`` for ``task`` until it closes."""
        old = self.by_task.get(task)
        tunnel = self.by_task[task] = Tunnel(task, epoch, ws)
        if old is not None:
            old.close()
            await old.ws.close()
        log.info("session %s: tunnel from its worker open (epoch %s)", task, epoch)
        try:
            async for msg_in in ws:
                if msg_in.type != WSMsgType.TEXT:
                    continue
                try:
                    msg = json.loads(msg_in.data)
                except ValueError:
                    continue
                if isinstance(msg, dict):
                    tunnel.dispatch(msg)
        finally:
            tunnel.close()
            if self.by_task.get(task) is tunnel:
                del self.by_task[task]
            log.info("session %s: tunnel closed", task)

    async def close_all(self) -> None:
        for t in list(self.by_task.values()):
            t.close()
            await t.ws.close()
        self.by_task.clear()
