"""A ``kliqued serve`` that does not hold the lease: it stands by (docs/ha.md).

While standing by the daemon writes nothing to the database. It answers on its address so
that clients, load balancers and operators can tell what it is:

- ``GET /v1/health`` and ``GET /v1/leader``: 200, ``"status": "standby"``, and the leader
  it knows of (URL, epoch, holder) or none;
- the reads of ``replica.READS`` (tasks, queues, policies, pools, the estate, the audit
  log, ...): from its own state, replayed from the log and kept up with it every
  ``FOLLOW_S`` (replica.py), marked ``X-Klique-Role: standby``, once that state is loaded;
- ``GET /metrics``: its own health (``metrics.Role``: not the leader, the epoch it saw, its
  replica's lag; its process), for a ``role:planner`` or admin token checked against the
  tokens its state read, so 503 ``not-ready`` until that state is loaded: Prometheus
  scrapes every daemon and must see each one's own health, never the leader's;
- every other request: **307** to the same path on the leader's advertised URL (the client
  repeats it there, body and method unchanged: nothing was recorded here), or **503** with
  ``Retry-After`` while no leader is known (a takeover in progress).

Meanwhile it brings its local copy of the events up to the log every ``TAIL_S`` and looks at
the lease every ``renew_s / 2``; once it has expired it takes it
(``Lease.try_acquire``), closes this listener and returns, and the caller rebuilds the state
by replaying the log and leads (server.py).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import ssl
import threading
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import psycopg
from aiohttp import web

from kliqued.daemon.ha.lease import Lease, LeaderInfo, wait_s
from kliqued.daemon.listener import Limits, ListenSite
from kliqued.daemon.api.metrics import Metrics, Role
from kliqued.daemon.storage.pglog import safe_label
from kliqued.daemon.api.request import reply

if TYPE_CHECKING:
    from kliqued.daemon.ha.replica import Replica

log = logging.getLogger(__name__)

FOLLOW_S = 0.5
"""How often a standby's state takes the events logged since (its reads lag by about this)."""

ROLE_HEADER = "X-Klique-Role"
"""On a read a standby answered from its own state (it lags the leader's by ``FOLLOW_S``)."""

RETRY_AFTER_S = 1
"""What a 503 tells clients to wait while no leader is known: about one standby's look."""

LEASE = web.AppKey("lease", Lease)


def role(lease: Lease, replica: "Replica | None" = None) -> Role:
    """What ``/metrics`` says of a daemon on a lease: it leads while the epoch is its own,
    else the epoch is the last it read; a standby's replica lag beside."""
    seen = lease.leader
    epoch = lease.epoch if lease.epoch is not None else (seen.epoch if seen else None)
    return Role(lease.epoch is not None, epoch, replica.lag if replica is not None else None)


def leader_view(info: LeaderInfo | None) -> dict | None:
    """The leader as ``/v1/leader`` shows it; None while none holds a live lease."""
    if info is None or not info.live:
        return None
    return {"url": info.url, "epoch": info.epoch, "holder": info.holder}


METRICS = "/metrics"
"""Answered by every standby itself (its own health), never sent to the leader."""


async def _answer(request: web.Request) -> web.StreamResponse:
    lease = request.app[LEASE]
    leader = leader_view(lease.leader)
    if request.method in ("GET", "HEAD") and request.path in ("/v1/health", "/v1/leader"):
        return reply(
            {"status": "standby", "role": "standby", "self": lease.advertise_url, "leader": leader}
        )
    if request.path == METRICS:  # no tokens to check the scrape's with yet
        return _unavailable(
            "not-ready",
            "this kliqued stands by and has not loaded its "
            "state yet (the token key beside its --ledger-db?): "
            "it cannot check the scrape's token",
        )
    if leader is not None and leader["url"]:
        target = leader["url"].rstrip("/") + request.path_qs
        resp = reply(
            {
                "error": {
                    "code": "not-leader",
                    "message": f"this kliqued stands by; the leader is "
                    f"{leader['url']}: repeat the request there",
                }
            },
            307,
        )
        resp.headers["Location"] = target
        return resp
    return _unavailable(
        "no-leader",
        "this kliqued stands by and no leader is known right "
        "now (a takeover within seconds); nothing was "
        "recorded: retry",
    )


def _unavailable(code: str, message: str) -> web.Response:
    """A 503 that tells the client when to try again (about one standby's look)."""
    resp = reply({"error": {"code": code, "message": message}}, 503)
    resp.headers["Retry-After"] = str(RETRY_AFTER_S)
    return resp


def make_standby_app(lease: Lease, replica: "Replica | None" = None) -> web.Application:
    """Without a replica, one catch-all answer; with one, the leader's application, whose
    reads in ``replica.READS`` are served from the replica once it is loaded, and whose
    ``/metrics`` is this standby's own health (``role``) once it can check tokens,
    everything else answered as a standby before any handler runs."""
    if replica is None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", _answer)
    else:
        app = replica.app()
        replica.ctx.seq.metrics = Metrics(replica.d, lambda: role(lease, replica), state=False)

        @web.middleware
        async def standby_first(request: web.Request, handler: Any) -> web.StreamResponse:
            own = request.path == METRICS and replica.loaded  # the route's token check runs
            if request.path in ("/v1/health", "/v1/leader") or not (own or replica.serves(request)):
                return await _answer(request)
            resp = await handler(request)
            resp.headers[ROLE_HEADER] = "standby"  # a read of the standby's state
            return resp

        app.middlewares.insert(0, standby_first)
    app[LEASE] = lease
    return app


async def stand_by(
    lease: Lease,
    host: str,
    port: int,
    limits: Limits,
    ssl_ctx: ssl.SSLContext | None,
    backlog: int,
    tail: Callable[[], None] | None = None,
    unready: Callable[[], str | None] | None = None,
    replica: "Replica | None" = None,
) -> bool:
    """Serves the standby answers until the lease is this daemon's (True) or a stop signal
    (False). The listener is closed on return: the leader's application opens it again.
    ``tail`` (every ``TAIL_S``, in a thread) keeps the local copy of the events near the log,
    so that a takeover has little to copy. ``unready`` says why this daemon could not lead
    now (its token key missing): it then leaves the lease to others."""
    runner = web.AppRunner(
        make_standby_app(lease, replica),
        access_log=None,
        handle_signals=False,
        shutdown_timeout=1.0,
    )
    await runner.setup()
    site = ListenSite(runner, host, port, limits=limits, ssl_context=ssl_ctx, backlog=backlog)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def stopping() -> None:
        stop.set()
        _stop_asked.set()

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stopping)
    try:
        try:  # the leader known from the first answer on
            await asyncio.to_thread(lease.read)
        except psycopg.Error:
            lease.close()  # _watch says so and tries again
        await site.start()
        tasks = [asyncio.create_task(_tail(tail, stop))] if tail is not None else []
        if replica is not None:
            tasks.append(asyncio.create_task(_follow(replica, stop)))
        try:
            # a stop that came while the lease was being taken wins: the caller releases it
            got = await _watch(lease, stop, unready)
            if got:
                # a signal that landed during the takeover is a byte in the loop's wakeup pipe
                # whose callback may still be queued behind the takeover's result (seen under
                # load): a short turn of the loop runs it before the outcome is read
                await asyncio.sleep(TAKEOVER_SETTLE_S)
            got = got and not stop.is_set()
        finally:
            if replica is not None:
                replica.ready = False
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
            signal.signal(sig, _remember_stop)  # until the leader's loop handles them
        await runner.cleanup()
    return got


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

TAKEOVER_SETTLE_S = 0.05
"""After the lease is taken, how long the standby's loop runs on before it reads whether a
stop came meanwhile (a takeover is rare: 50 ms is nothing beside the replay that follows)."""

_stop_asked = threading.Event()
"""Set by a stop signal: read by the leader's loop when it starts, so a signal that came
between the standby's loop and the leader's (the takeover: the state is loaded meanwhile)
stops the daemon rather than being lost with the loop that got it."""


def _remember_stop(_signum: int, _frame: Any) -> None:
    _stop_asked.set()


def stop_asked() -> bool:
    """Whether a stop signal came while standing by or taking over (:data:`_stop_asked`)."""
    return _stop_asked.is_set()


TAIL_S = 2.0
"""How often a standby brings its copy of the events up to the log."""


async def _every(
    step: Callable[[], Awaitable[bool]],
    period_s: float,
    stop: asyncio.Event,
    failure: str,
    on_failure: Callable[[], None] | None = None,
) -> None:
    """Runs ``step`` every ``period_s`` until ``stop`` or until it returns False. A step that
    raises (the database away, the file refused) is retried at the next period, and said
    once per outage (``failure``, with the exception) rather than every time;
    ``on_failure`` runs at each failure. The standby's two followers (the events' copy and
    the state for reads) share this loop."""
    failing = False
    while not stop.is_set():
        try:
            if not await step():
                return
            failing = False
        except Exception as exc:
            if on_failure is not None:
                on_failure()
            if not failing:
                log.warning("standing by: %s: %s", failure, exc)
            failing = True
        try:
            await asyncio.wait_for(stop.wait(), period_s)
        except asyncio.TimeoutError:
            pass


async def _tail(tail: Callable[[], None], stop: asyncio.Event) -> None:
    """Brings the local copy of the events up to the log every ``TAIL_S``."""

    async def step() -> bool:
        await asyncio.to_thread(tail)
        return True

    await _every(step, TAIL_S, stop, "the events' copy is not brought up to the log")


async def _follow(replica: "Replica", stop: asyncio.Event) -> None:
    """Loads the replica (once the token key is there), then keeps it up with the log; a
    failure to apply an event ends its reads (the leader answers them), said once, while
    the log's end is still looked at, so that its lag (``/metrics``) grows for everyone to
    see. While the database is away, reads go to the leader meanwhile."""
    loaded = False
    stuck = False

    async def step() -> bool:
        nonlocal loaded, stuck
        if stuck:
            await asyncio.to_thread(replica.look)
            return True
        if not loaded:
            loaded = await asyncio.to_thread(replica.load)
        if loaded:
            rows, tokens = await asyncio.to_thread(replica.fetch)
            try:
                replica.apply(rows, tokens)
            except Exception:
                log.exception(
                    "standing by: the log does not apply to the standby's "
                    "state; its reads go to the leader from now on"
                )
                replica.ready = False
                stuck = True
                return True
            replica.ready = True
        return True

    def unready() -> None:
        replica.ready = False

    await _every(step, FOLLOW_S, stop, "the state for reads does not follow the log", unready)


async def _watch(
    lease: Lease, stop: asyncio.Event, unready: Callable[[], str | None] | None
) -> bool:
    seen: tuple | None = None
    failing = False
    said: str | None = None
    while not stop.is_set():
        try:
            why = await asyncio.to_thread(unready) if unready is not None else None
            if why is not None:
                if why != said:  # once, and again when the reason changes
                    log.error("standing by, and cannot take over: %s", why)
                said = why
                await asyncio.to_thread(lease.read)
            elif await asyncio.to_thread(lease.try_acquire):
                return True
            else:
                if said is not None:
                    log.info("standing by: ready to take over again")
                said = None
            failing = False
        except psycopg.Error as exc:
            if not failing:  # once per outage, not every look
                log.warning(
                    "cannot read the lease in %s: %s",
                    safe_label(lease.url),
                    str(exc).strip().splitlines()[0],
                )
            failing = True
            lease.close()
        info = lease.leader
        now = (info.epoch, info.holder, info.live) if info else None
        if now != seen:
            seen = now
            if info is not None and info.live:
                log.info(
                    "standing by: the leader is %s (epoch %d, %s)",
                    info.url,
                    info.epoch,
                    info.holder,
                )
        try:
            await asyncio.wait_for(stop.wait(), wait_s(lease.settings))
        except asyncio.TimeoutError:
            pass
    return False
