"""The worker protocol (docs/worker-protocol.md): register, long-poll lease, heartbeat with
stop instructions, reports, and task logs (upload by workers, reading by people).

A worker token (``worker:<pool>``) sees only its pool's workers and tasks (403 otherwise).
Every change goes through the sequencer (``fleet.prepare_*``): a lease is answered only once
its ``leased`` event is durable, a report only once its event is. A long poll waits on its
pool's wake-up (set when the engine places work there, a worker registers, or a stopping
attempt ends), bounded by ``wait`` and the daemon's ``poll_wait_s``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from aiohttp import web

from klique_util.excerpt import excerpt

from kliqued.daemon.api import views
from kliqued.daemon.fleet import workers as fleet
from kliqued.daemon.state import history
from kliqued.daemon.auth import Principal
from kliqued.daemon.errors import ApiError, bad_request, forbidden
from kliqued.daemon.leases import CLOSED, FENCED
from kliqued.daemon.logs import MAX_READ
from kliqued.daemon.api.request import Context, ctx, principal, read_json, reply
from kliqued.daemon.api.routes import Route
from kliqued.daemon.api.handlers.params import int_param
from kliqued.daemon.api.handlers.tasks import PEOPLE, SEE_TASK, _visible, visible_task


def _key_hash(request: web.Request, required: bool = False) -> str | None:
    """The keyed hash of the worker key the call carries (``X-Klique-Worker-Key``); None
    when it carries none (then only a worker registered before keys accepts the call)."""
    key = request.headers.get(fleet.KEY_HEADER)
    if key is None and not required:
        return None
    if not key or not fleet.KEY_RE.match(key):
        raise bad_request(
            f"header {fleet.KEY_HEADER}: a worker proves which worker it is with "
            f"the random key it keeps in its state dir (32 to 128 characters of "
            f"A-Z a-z 0-9 _ -); {'missing' if not key else 'malformed'}: "
            f"upgrade klique-worker",
            {"header": fleet.KEY_HEADER},
        )
    return ctx(request).daemon.tokens.hash(key)


T = TypeVar("T")


async def _audited(request: web.Request, check: Callable[[], T]) -> T:
    """Runs ``check``; a refusal of a worker that claims another's identity is logged
    (``worker_refused``) before it is answered."""
    try:
        return check()
    except fleet.Refused as exc:
        c = ctx(request)
        p = principal(request)
        refused = exc  # ``exc`` is unbound once the except block ends; the prepare may run later
        await c.seq.submit(lambda now, ov: fleet.prepare_refused(c.daemon, p, refused, now, ov))
        raise


async def register(request: web.Request) -> web.Response:
    c = ctx(request)
    d = c.daemon
    p = principal(request)
    body = await read_json(request, "WorkerRegistration")
    if body["pool"] != p.name:
        raise forbidden(f"this token is bound to pool {p.name}, not {excerpt(body['pool'])}")
    if d.idx().estate.pool(p.name) is None:
        raise ApiError(422, "unknown-pool", f"no pool {p.name!r} in the running estate")
    key = _key_hash(request, required=True)
    assert key is not None
    await _audited(request, lambda: fleet.check_register(d, body["worker_id"], key))
    answer = await c.seq.submit(lambda now, ov: fleet.prepare_register(d, p, body, now, ov, key))
    return reply(answer)


async def lease(request: web.Request) -> web.Response:
    c = ctx(request)
    d = c.daemon
    p = principal(request)
    wid = request.match_info["id"]
    key = _key_hash(request)
    w = await _audited(request, lambda: fleet.worker_of(d, p, wid, key, "lease"))
    limit = d.worker_settings.poll_wait_s
    raw = request.query.get("wait")
    try:
        wait = limit if raw in (None, "") else float(raw)
    except ValueError:
        raise bad_request(f"wait must be a number of seconds, found {excerpt(str(raw))}") from None
    if not 0 <= wait <= 3600:
        raise bad_request(f"wait must be between 0 and 3600 seconds, found {raw}")
    wait = min(wait, limit)
    body = await read_json(request, "LeaseRequest")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait

    def prepare(now: int, ov: fleet.Overlay) -> fleet.Prepared:
        return fleet.prepare_lease(d, p, wid, body, now, ov)

    while True:
        why = d.tokens.by_id[p.token_id].refusal(d.clock.now()) if p.token_id else None
        if why is not None:  # revoked or expired while polling: the poll ends now
            raise ApiError(401, "unauthenticated", why)
        w.last_seen = d.mono()
        if c.closing.is_set() or w.lost or d.workers.get(wid) is not w:
            return reply({"leases": []})
        if fleet.has_work(d, w, body):
            leases = await c.seq.submit(prepare)
            if leases:
                return reply({"leases": leases})
        left = deadline - loop.time()
        if left <= 0:
            return reply({"leases": []})
        # Parked: when the engine places work on the pool, this lease is prepared in the
        # same sequencer cycle as the placement (one commit), see loop.Sequencer.park.
        parked = c.seq.park(w.pool, prepare)
        try:
            leases = await asyncio.wait_for(asyncio.shield(parked.future), left)
        except asyncio.TimeoutError:
            if parked.parked:
                parked.future.cancel()  # never taken: nothing was leased
                continue
            leases = await parked.future  # taken by the sequencer: its answer is coming
        if leases:
            return reply({"leases": leases})


async def heartbeat(request: web.Request) -> web.Response:
    c = ctx(request)
    d = c.daemon
    p = principal(request)
    wid = request.match_info["id"]
    key = _key_hash(request)
    w = await _audited(request, lambda: fleet.worker_of(d, p, wid, key, "heartbeat"))
    body = await read_json(request, "Heartbeat")
    w.last_seen = d.mono()
    cannot = body.get("cannot_work")
    w.cannot_work = str(cannot)[:500] if cannot else None
    ttl = d.worker_settings.ttl_s
    stops, withdraw = fleet.heartbeat(d, w, body, max(5.0, ttl))
    if withdraw:
        await c.seq.submit(lambda now, ov: fleet.prepare_withdraw(d, p, wid, withdraw, now, ov))
    saved = fleet.checkpoints(d, w, body)
    if saved:  # lending.md's lost work counts from them (docs/worker-protocol.md)
        await c.seq.submit(lambda now, ov: fleet.prepare_checkpoints(d, p, wid, saved, now, ov))
    return reply({"stop": stops, "ttl_s": ttl})


async def report(request: web.Request) -> web.Response:
    c = ctx(request)
    d = c.daemon
    p = principal(request)
    tid = request.match_info["id"]
    body = await read_json(request, "TaskReport")
    key = _key_hash(request)
    epoch = int(body["epoch"])
    await history.recall(c.store, d, tid)  # a late retry for a task evicted since
    await _audited(
        request,  # 403/404 before queueing
        lambda: fleet.lease_for_report(d, p, tid, epoch, key),
    )
    await c.seq.submit(lambda now, ov: fleet.prepare_report(d, p, tid, body, now, ov, key))
    rec = await history.recall(c.store, d, tid)
    assert rec is not None
    lease = rec.lease(int(body["epoch"]))
    if lease is not None:
        w = d.workers.get(lease.worker)
        if w is not None and not w.lost:
            w.last_seen = d.mono()
    return reply({"task": views.task(d, rec)})


async def reports(request: web.Request) -> web.Response:
    """Several reports of one worker in one request, one transaction; one result each."""
    c = ctx(request)
    d = c.daemon
    p = principal(request)
    wid = request.match_info["id"]
    key = _key_hash(request)
    w = await _audited(request, lambda: fleet.worker_of(d, p, wid, key, "reports"))
    body = await read_json(request, "WorkerReports")
    items = body["reports"]
    for item in items:  # late retries for tasks evicted since (history.py)
        if d.find(str(item["task"])) is None:
            await history.recall(c.store, d, str(item["task"]))
    results = await c.seq.submit(
        lambda now, ov: fleet.prepare_reports(d, p, wid, items, now, ov, key)
    )
    if not w.lost:
        w.last_seen = d.mono()
    return reply({"results": results})


async def deregister(request: web.Request) -> web.Response:
    """``DELETE /workers/{id}``: the worker itself on a clean shutdown (``--drain``), or an
    admin. Its active leases' tasks go back to the front of their queues (counted as lost,
    unless the worker reported them ``stopped`` with ``reason: "shutdown"`` before)."""
    c = ctx(request)
    d = c.daemon
    p = principal(request)
    wid = request.match_info["id"]
    w = d.workers.get(wid)
    if p.is_worker:
        if w is None:
            raise ApiError(404, "not-found", f"no worker {excerpt(wid, quoted=False)}")
        if w.pool != p.name:
            raise forbidden(f"worker {wid} serves pool {w.pool}; this token is bound to {p.name}")
        key = _key_hash(request)
        await _audited(request, lambda: fleet.check_key(w, key, "deregister"))
    answer = await c.seq.submit(lambda now, ov: fleet.prepare_deregister(d, p, wid, now, ov))
    c.wake(answer.get("pool") or (w.pool if w is not None else ""))
    return reply(answer)


async def upload_log(request: web.Request) -> web.Response:
    c = ctx(request)
    d = c.daemon
    p = principal(request)
    tid = request.match_info["id"]
    offset = int_param(request, "offset", None, 0, 2**62)
    if offset is None:
        raise bad_request("offset is required: the byte offset of this chunk in the log")
    await history.recall(c.store, d, tid)
    rec = d.record(tid)
    epoch = int_param(request, "epoch", rec.epoch, 1, 2**31)
    assert epoch is not None
    key = _key_hash(request)
    rec, lease = await _audited(
        request, lambda: fleet.lease_for_report(d, p, tid, epoch, key, "log")
    )
    if lease is None or lease.status == FENCED:
        raise fleet.stale(rec, epoch)
    data = await request.read()
    size = await c.logs.write(tid, epoch, offset, data)
    return reply({"size": size})


async def read_log(request: web.Request) -> web.StreamResponse:
    c = ctx(request)
    await history.recall(c.store, c.daemon, request.match_info["id"])
    rec = _visible(request, c.daemon.record(request.match_info["id"]))
    epoch = int_param(request, "epoch", rec.epoch, 0, 2**31)
    offset = int_param(request, "offset", 0, 0, 2**62)
    limit = int_param(request, "limit", MAX_READ, 1, MAX_READ)
    assert epoch is not None and offset is not None and limit is not None
    log = await log_of(c, principal(request), rec.id, epoch, offset, limit)
    headers = {
        "X-Klique-Epoch": str(log.epoch),
        "X-Klique-Epochs": ",".join(str(e) for e in log.epochs),
        "X-Klique-Log-Size": str(log.size),
        "X-Klique-Next-Offset": str(log.next_offset),
        "X-Klique-Log-Complete": "true" if log.complete else "false",
    }
    return web.Response(body=log.data, headers=headers, content_type="text/plain", charset="utf-8")


@dataclass(frozen=True, slots=True)
class LogPiece:
    """A piece of a task's log, as ``getTaskLog`` answers it (the MCP tools too)."""

    data: bytes
    epoch: int
    epochs: list[int]
    size: int
    next_offset: int
    complete: bool


async def log_of(
    c: Context,
    p: Principal,
    task_id: str,
    epoch: int | None = None,
    offset: int = 0,
    limit: int = MAX_READ,
) -> LogPiece:
    """``getTaskLog`` for ``p``: at most ``limit`` bytes of the log of attempt ``epoch`` (None:
    the latest) of a task they may see, from byte ``offset``; a 404 for another's task."""
    await history.recall(c.store, c.daemon, task_id)
    rec = visible_task(c.daemon, p, task_id)
    if epoch is None:
        epoch = rec.epoch
    if epoch == 0 or epoch > rec.epoch:
        data, size = b"", 0
    else:
        data, size = await c.logs.read(rec.id, epoch, offset, limit)
    lease = rec.lease(epoch)
    complete = (
        rec.epoch == 0
        and rec.state == "ended"
        or (lease is not None and lease.status in (CLOSED, FENCED))
    )
    return LogPiece(data, epoch, list(range(1, rec.epoch + 1)), size, offset + len(data), complete)


async def list_workers(request: web.Request) -> web.Response:
    d = ctx(request).daemon
    p = principal(request)
    pool = request.query.get("pool") or None
    limit = int_param(request, "limit", 1000, 1, 1000)
    assert limit is not None
    after = request.query.get("after") or ""
    ws = sorted(
        (
            w
            for w in d.workers.values()
            if (p.is_admin or w.pool == p.name)
            and (pool is None or w.pool == pool)
            and w.id > after
        ),
        key=lambda w: w.id,
    )
    page = ws[:limit]  # worker ids are any a worker token registers: pages keep it bounded
    return reply(
        {
            "workers": [views.worker(d, w) for w in page],
            "next": page[-1].id if len(ws) > limit else None,
        }
    )


WORKER = ("worker",)
OWN_WORKER = "a worker: only its own worker id (its pool's token and its worker key)"
LEASE_HOLDER = "the worker holding the lease (its pool's token and its worker key)"

ROUTES = [
    Route("POST", "/v1/tasks/{id}/report", report, "reportTask", WORKER, rule=LEASE_HOLDER),
    Route("POST", "/v1/tasks/{id}/log", upload_log, "uploadTaskLog", WORKER, rule=LEASE_HOLDER),
    Route("GET", "/v1/tasks/{id}/log", read_log, "getTaskLog", PEOPLE, rule=SEE_TASK),
    Route(
        "POST",
        "/v1/workers/register",
        register,
        "registerWorker",
        WORKER,
        rule="a token of the pool it registers with",
        hint="register with a worker token (kliqued token create --worker --pool NAME)",
    ),
    Route(
        "GET",
        "/v1/workers",
        list_workers,
        "listWorkers",
        ("admin", "worker"),
        rule="a worker: its pool's workers",
    ),
    Route("POST", "/v1/workers/{id}/lease", lease, "leaseTasks", WORKER, rule=OWN_WORKER),
    Route(
        "POST", "/v1/workers/{id}/heartbeat", heartbeat, "workerHeartbeat", WORKER, rule=OWN_WORKER
    ),
    Route("POST", "/v1/workers/{id}/reports", reports, "reportTasks", WORKER, rule=OWN_WORKER),
    Route(
        "DELETE",
        "/v1/workers/{id}",
        deregister,
        "deregisterWorker",
        ("admin", "worker"),
        rule=OWN_WORKER,
    ),
]
