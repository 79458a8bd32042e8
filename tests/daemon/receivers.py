"""Local alert receivers for the tests: an aiohttp web server and an aiosmtpd SMTP server,
each in a thread of its own with its own event loop, on a free loopback port."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.harness.daemon import free_port


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes


@dataclass
class HttpReceiver:
    """Answers ``fail`` requests with 500, then 200; ``hang`` never answers at all."""

    fail: int = 0
    hang: bool = False
    got: list[Received] = field(default_factory=list)
    """Every request, failed or not."""
    ok: list[Received] = field(default_factory=list)
    """The requests answered 200."""

    def __post_init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    async def _handle(self, request: web.Request) -> web.Response:
        rec = Received(dict(request.headers), await request.read())
        self.got.append(rec)
        if self.hang:
            await self._release.wait()  # until stop()
        if len(self.got) <= self.fail:
            return web.Response(status=500, text="not now")
        self.ok.append(rec)
        return web.Response(status=200, text="ok")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._release = asyncio.Event()
        app = web.Application()
        app.router.add_post("/hook", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        self._loop.run_until_complete(site.start())
        self._started.set()
        self._loop.run_forever()

    def start(self) -> "HttpReceiver":
        self._thread.start()
        self._started.wait(10)
        return self

    def stop(self) -> None:
        async def down() -> None:
            self._release.set()
            await self._runner.cleanup()

        fut = asyncio.run_coroutine_threadsafe(down(), self._loop)
        try:
            fut.result(5)
        except Exception:
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


class SmtpReceiver:
    """aiosmtpd's controller with a handler that keeps every message."""

    def __init__(self) -> None:
        from aiosmtpd.controller import Controller

        self.messages: list[Any] = []
        self.port = free_port()

        outer = self

        class Handler:
            async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
                outer.messages.append(envelope)
                return "250 OK"

        self._controller = Controller(Handler(), hostname="127.0.0.1", port=self.port)

    def start(self) -> "SmtpReceiver":
        self._controller.start()
        return self

    def stop(self) -> None:
        self._controller.stop()
