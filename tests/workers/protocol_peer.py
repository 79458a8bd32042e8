"""The worker protocol's reference peer: a minimal control plane for the worker tests.

It implements the worker-facing endpoints of docs/worker-protocol.md (register, long-poll
lease, heartbeat with stop instructions, idempotent and fenced reports, log upload by offset)
over a REAL aiohttp server in a background thread, so that the tests drive real
`klique-worker` processes over real HTTP. It is NOT the control plane (kliqued/daemon/ holds
that): no engine, no ledger, one pool, tasks leased in submission order. When the real
/v1/workers/* endpoints exist, the same tests should run against them too.

Test-side helpers: submit(), stop(), forget(), down()/up() (the control plane is
unreachable), wait_for().
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from dataclasses import dataclass, field

from aiohttp import web

from tests.harness.typed import present
from tests.harness.wait import wait_for

MILLI = 1000


@dataclass
class PeerTask:
    id: str
    command: list[str]
    gpus: float = 1.0
    grace_s: float = 1.0
    env: dict = field(default_factory=dict)
    state: str = "queued"  # queued | leased | ended
    epoch: int = 0
    worker: str | None = None
    events: list[str] = field(default_factory=list)  # accepted report events, in order
    end: dict | None = None


def _err(status: int, code: str, message: str = "") -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


class ProtocolPeer:
    def __init__(
        self,
        token: str = "kq_" + "w" * 43,
        pool: str = "bare",
        ttl_s: float = 1.5,
        poll_wait_s: float = 2.0,
    ):
        self.token, self.pool, self.ttl_s, self.poll_wait_s = token, pool, ttl_s, poll_wait_s
        self.tasks: dict[str, PeerTask] = {}
        self.workers: dict[str, dict] = {}
        self.reports: list[tuple[str, dict, int]] = []  # (task, body, status)
        self.lease_calls: list[tuple[str, dict, float]] = []
        self.heartbeats: list[tuple[str, dict, float]] = []
        self.logs: dict[str, bytearray] = {}
        self.stops: dict[str, list[dict]] = {}
        self.steal_on_start: set[str] = set()
        self._n = 0
        self.lock = threading.RLock()
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._cond: asyncio.Condition | None = None
        self._runner: web.AppRunner | None = None
        self._call(self._setup())
        self.up()

    # lifecycle ---------------------------------------------------------------------------
    def _call(self, coro, timeout: float = 10):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _setup(self) -> None:
        self._cond = asyncio.Condition()

    def routes(self, app: web.Application) -> None:
        """The protocol's endpoints; a subclass adds what its tests need."""
        app.router.add_post("/v1/workers/register", self.register)
        app.router.add_post("/v1/workers/{id}/lease", self.lease)
        app.router.add_post("/v1/workers/{id}/heartbeat", self.heartbeat)
        app.router.add_post("/v1/tasks/{id}/report", self.report)
        app.router.add_post("/v1/tasks/{id}/log", self.post_log)

    def up(self) -> None:
        async def start():
            app = web.Application()
            self.routes(app)
            self._runner = web.AppRunner(app, shutdown_timeout=0.1)
            await self._runner.setup()
            await web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True).start()

        self._call(start())

    def down(self) -> None:
        """The control plane is gone: connections are refused until up()."""

        async def stop():
            await self._runner.cleanup()

        self._call(stop())

    def close(self) -> None:
        try:
            self.down()
        except Exception:
            pass

        async def cancel_all():
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in others:
                t.cancel()
            await asyncio.gather(*others, return_exceptions=True)

        try:
            self._call(cancel_all())
        except Exception:
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)

    # test-side helpers -------------------------------------------------------------------
    def submit(
        self, command: list[str], gpus: float = 1.0, grace_s: float = 1.0, env: dict | None = None
    ) -> str:
        with self.lock:
            self._n += 1
            tid = f"t-{self._n:04d}"
            self.tasks[tid] = PeerTask(tid, command, gpus, grace_s, env or {})
        self._notify()
        return tid

    def stop(
        self, task: str, reason: str = "preempted", text: str = "", grace_s: float | None = None
    ) -> None:
        with self.lock:
            t = self.tasks[task]
            stop = {"task": task, "epoch": t.epoch, "reason": reason, "text": text}
            if grace_s is not None:
                stop["grace_s"] = grace_s
            self.stops.setdefault(present(t.worker), []).append(stop)

    def forget(self, task: str) -> None:
        """The task ended on the control plane's side (cancelled) while the worker was away."""
        with self.lock:
            t = self.tasks[task]
            t.state, t.worker = "ended", None

    def events(self, task: str) -> list[str]:
        with self.lock:
            return list(self.tasks[task].events)

    def end(self, task: str) -> dict | None:
        with self.lock:
            return self.tasks[task].end

    def log(self, task: str) -> bytes:
        with self.lock:
            return bytes(self.logs.get(task, b""))

    def wait_for(self, predicate, timeout: float = 10.0, what: str = "condition"):
        """:func:`tests.harness.wait.wait_for`, each check under the peer's lock."""

        def locked():
            with self.lock:
                return predicate()

        return wait_for(locked, timeout, what)

    def _notify(self) -> None:
        async def notify():
            async with self._cond:
                self._cond.notify_all()

        asyncio.run_coroutine_threadsafe(notify(), self.loop)

    # endpoints ---------------------------------------------------------------------------
    def _auth(self, request: web.Request) -> web.Response | None:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return _err(401, "unauthenticated", "a worker token is needed")
        return None

    async def register(self, request: web.Request) -> web.Response:
        if (bad := self._auth(request)) is not None:
            return bad
        body = await request.json()
        if body.get("pool") != self.pool:
            return _err(403, "forbidden", f"the token is bound to pool {self.pool}")
        wid = body["worker_id"]
        with self.lock:
            self.workers[wid] = {
                **body,
                "last_seen": time.monotonic(),
                "registrations": self.workers.get(wid, {}).get("registrations", 0) + 1,
            }
            running = [
                {"task": t.id, "epoch": t.epoch}
                for t in self.tasks.values()
                if t.state == "leased" and t.worker == wid
            ]
        return web.json_response(
            {
                "worker_id": wid,
                "heartbeat_ttl_s": self.ttl_s,
                "poll_wait_s": self.poll_wait_s,
                "running": running,
            }
        )

    def _take(self, wid: str, body: dict) -> list[dict]:
        whole = len(body.get("free_gpus") or [])
        shared = sorted(
            (round(g["free"] * MILLI) for g in body.get("gpu_free") or []), reverse=True
        )
        cpu_free = body.get("cpu_free")  # CPU-only tasks it still starts (None: any)
        leases = []
        with self.lock:
            for t in self.tasks.values():
                if t.state != "queued":
                    continue
                milli = round(t.gpus * MILLI)
                if milli == 0:
                    if cpu_free is not None:
                        if cpu_free <= 0:
                            continue
                        cpu_free -= 1
                elif milli >= MILLI:
                    n = -(-milli // MILLI)
                    if n > whole:
                        continue
                    whole -= n
                    shared = shared[n:] if len(shared) >= n else []
                else:
                    fit = [i for i, f in enumerate(shared) if f >= milli]
                    if not fit:
                        continue
                    shared[fit[-1]] -= milli
                t.state, t.epoch, t.worker = "leased", t.epoch + 1, wid
                leases.append(
                    {
                        "task": t.id,
                        "epoch": t.epoch,
                        "command": t.command,
                        "payload": None,
                        "gpus": t.gpus,
                        "resource": "team/standard",
                        "user": "alice",
                        "project": "p",
                        "labels": {},
                        "grace_s": t.grace_s,
                        "env": t.env,
                    }
                )
        return leases

    async def lease(self, request: web.Request) -> web.Response:
        if (bad := self._auth(request)) is not None:
            return bad
        wid = request.match_info["id"]
        if wid not in self.workers:
            return _err(404, "not-found", "unknown worker: register first")
        body = await request.json()
        wait = float(request.query.get("wait", "30"))
        with self.lock:
            self.lease_calls.append((wid, body, time.monotonic()))
        deadline = time.monotonic() + wait
        async with present(self._cond):
            while True:
                leases = self._take(wid, body)
                left = deadline - time.monotonic()
                if leases or left <= 0:
                    return web.json_response({"leases": leases})
                try:
                    await asyncio.wait_for(present(self._cond).wait(), left)
                except asyncio.TimeoutError:
                    pass

    async def heartbeat(self, request: web.Request) -> web.Response:
        if (bad := self._auth(request)) is not None:
            return bad
        wid = request.match_info["id"]
        if wid not in self.workers:
            return _err(404, "not-found", "unknown worker: register first")
        body = await request.json()
        with self.lock:
            self.heartbeats.append((wid, body, time.monotonic()))
            self.workers[wid]["last_seen"] = time.monotonic()
            stops = self.stops.pop(wid, [])
        return web.json_response({"stop": stops, "ttl_s": self.ttl_s})

    async def report(self, request: web.Request) -> web.Response:
        if (bad := self._auth(request)) is not None:
            return bad
        tid = request.match_info["id"]
        body = await request.json()
        if body.get("event") == "started" and tid in self.steal_on_start:
            # the task was given to someone else a moment ago (and lets the test's task
            # start before it is fenced: the worker reports "started" within milliseconds)
            await asyncio.sleep(0.5)
        with self.lock:
            t = self.tasks.get(tid)
            if t is None:
                status, answer = 404, _err(404, "not-found", "no such task")
            elif body["epoch"] != t.epoch or (
                body["event"] == "started" and tid in self.steal_on_start
            ):
                if body["event"] == "started" and tid in self.steal_on_start:
                    self.steal_on_start.discard(tid)
                    t.epoch += 1
                    t.worker = "w-elsewhere"
                status, answer = 409, _err(409, "stale-epoch", f"task {tid} is at epoch {t.epoch}")
            else:
                status = 200
                if body["event"] not in t.events:  # idempotent: a retry changes nothing
                    t.events.append(body["event"])
                    if body["event"] != "started":
                        t.state, t.end = "ended", body
                answer = web.json_response({"task": {"id": tid, "state": t.state}})
            self.reports.append((tid, body, status))
        return answer

    async def post_log(self, request: web.Request) -> web.Response:
        if (bad := self._auth(request)) is not None:
            return bad
        tid = request.match_info["id"]
        offset = int(request.query["offset"])
        data = await request.read()
        with self.lock:
            t = self.tasks.get(tid)
            if t is None:
                return _err(404, "not-found", "no such task")
            if "epoch" in request.query and int(request.query["epoch"]) != t.epoch:
                return _err(409, "stale-epoch", f"task {tid} is at epoch {t.epoch}")
            log = self.logs.setdefault(tid, bytearray())
            if offset <= len(log):  # idempotent by offset
                log[offset : offset + len(data)] = data
            return web.json_response({"size": len(log)})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
