"""The daemon's end of the session tunnels: the WebSocket each running session's worker opened
(``GET /v1/sessions/{id}/tunnel``), and the requests sent over it (wire format:
klique_util/tunnel.py).

One ``Tunnel`` per session task: ``request`` relays an HTTP exchange and waits for its
answer, ``open_ws`` starts a relayed WebSocket whose messages arrive on a queue. A worker
that connects again (after a restart or a network cut) replaces the old tunnel; whatever was
waiting on the old one gets a 502. Nothing here is persisted: a tunnel lives as long as its
connection.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web

from klique_util.tunnel import b64, unb64

from .errors import ApiError

log = logging.getLogger(__name__)

ANSWER_TIMEOUT_S = 300.0
"""How long a relayed HTTP request may take (a notebook's long cell output streams through
its WebSocket, not through one request)."""


def _gone(task: str, why: str) -> ApiError:
    return ApiError(502, "session-unreachable", f"session {task}: {why}", {"session": task})


@dataclass
class Tunnel:
    task: str
    epoch: int
    ws: web.WebSocketResponse
    pending: dict[int, asyncio.Future] = field(default_factory=dict)
    channels: dict[int, asyncio.Queue] = field(default_factory=dict)
    ids: Any = field(default_factory=lambda: itertools.count(1))
    closed: bool = False

    async def _send(self, msg: dict[str, Any]) -> None:
        if self.closed:
            raise _gone(self.task, "its worker's tunnel closed")
        try:
            await self.ws.send_str(json.dumps(msg, separators=(",", ":")))
        except (ConnectionError, RuntimeError) as exc:
            raise _gone(self.task, f"its worker's tunnel broke ({exc})") from None

    async def request(self, method: str, path: str, headers: list[list[str]],
                      body: bytes) -> dict[str, Any]:
        """The app's answer to one HTTP request: ``{"status", "headers", "body": bytes}``."""
        rid = next(self.ids)
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self.pending[rid] = fut
        try:
            await self._send({"op": "http", "id": rid, "method": method, "path": path,
                              "headers": headers, "body": b64(body)})
            answer = await asyncio.wait_for(fut, ANSWER_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise _gone(self.task, f"the app did not answer within "
                                   f"{ANSWER_TIMEOUT_S:g} s") from None
        finally:
            self.pending.pop(rid, None)
        if answer.get("op") == "error":
            raise _gone(self.task, str(answer.get("message") or "the app did not answer"))
        return {"status": int(answer.get("status") or 502),
                "headers": answer.get("headers") or [], "body": unb64(answer.get("body"))}

    async def open_ws(self, path: str, headers: list[list[str]]) -> tuple[int, asyncio.Queue]:
        """Opens a WebSocket to the app at ``path``: its exchange id and the queue its
        messages (then None, when it closes) arrive on."""
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
        if op in ("ws-msg", "ws-close"):
            queue = self.channels.get(rid)
            if queue is not None:
                queue.put_nowait(msg if op == "ws-msg" else None)
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
            async for frame in ws:
                if frame.type != WSMsgType.TEXT:
                    continue
                try:
                    msg = json.loads(frame.data)
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
