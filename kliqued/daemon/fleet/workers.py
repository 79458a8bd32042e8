"""The worker protocol's changes (docs/worker-protocol.md), prepared for the sequencer like
every other request: validated against the state and what earlier requests of the batch do
(``Overlay``), their events and ledger closes built, applied after the commit through the
``Daemon.on_*`` methods that replay uses too.

- register: ``worker_registered``; the answer lists the leases the control plane believes
  the worker holds;
- lease: ``leased`` (task, worker, epoch) for every placed task of the worker's pool that
  fits its free GPUs, oldest placement first;
- report: ``started``; ``ended`` (finished, failed: the ledger interval closes in the same
  transaction); ``stopped`` (a lease told to stop); a stale epoch is ``409 stale-epoch``; a
  report for a closed lease changes nothing (idempotent);
- a worker silent longer than its TTL: ``worker_lost``, then for each task it ran a
  ``preempted`` (kind ``lost``, back at the front of its queue) or, the third time, an
  ``ended`` (failed, ``worker lost 3 times``);
- a lease its worker never took (not in its heartbeats): ``unleased``, leased again later at
  the next epoch.
"""

from __future__ import annotations

import hmac
import re
from typing import Any, Callable

from klique_util.excerpt import excerpt
from klique_util.units import MILLI, gpus_to_milli

from kliqued.daemon import apps
from kliqued.daemon.fleet import capacity, ends, gang
from kliqued.daemon.state import reducers
from kliqued.daemon.auth import Principal
from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.state.prepared import Overlay, Prepared
from kliqued.daemon.errors import ApiError, forbidden
from kliqued.daemon.events import Event
from kliqued.daemon.leases import (
    ACTIVE,
    CLOSED,
    FENCED,
    GANG_MEMBER_DONE,
    LOST_FAIL_TEXT,
    LOST_TEXT,
    MAX_LOSSES,
    RETURNED,
    RETURNED_TEXT,
    STOPPING,
    Lease,
    WorkerInfo,
    gpu_fits,
)
from kliqued.daemon.records import TaskRecord
from kliqued.daemon.units import gpus, parse_iso

MAX_LEASES = 64
"""Leases in one answer at most (tasks of 0 GPUs always fit)."""

SCAN = 2000
"""Waiting tasks looked at per lease request at most."""


KEY_HEADER = "X-Klique-Worker-Key"
"""The worker's proof of identity, sent on every worker call: a random key the worker keeps
in its state dir (workers/state.py). A pool token is shared by the pool's workers; the key
tells them apart, so one cannot take over another's id, leases or reports."""
KEY_RE = re.compile(r"^[A-Za-z0-9_-]{32,128}$")


class Refused(ApiError):
    """A worker call that does not prove the identity it claims; audited (``worker_refused``)
    before the refusal is answered."""

    def __init__(self, status: int, code: str, message: str, audit: dict[str, Any]) -> None:
        super().__init__(status, code, message)
        self.audit = audit


def refused_event(d: Daemon, p: Principal, exc: Refused, task: str | None = None) -> Event:
    return Event(
        "worker_refused",
        task,
        p.text,
        d.idx().revision,
        None,
        None,
        {**exc.audit, "reason": exc.code},
    )


def prepare_refused(d: Daemon, p: Principal, exc: Refused, now: int, ov: Overlay) -> Prepared:
    return Prepared([refused_event(d, p, exc, exc.audit.get("task"))], [], lambda: None)


def _same_key(w: WorkerInfo, key_hash: str | None) -> bool:
    """Whether ``key_hash`` is the key ``w`` registered with (a worker registered before
    keys existed has none, and keeps working until it registers with one)."""
    if w.key_hash is None:
        return True
    return key_hash is not None and hmac.compare_digest(w.key_hash, key_hash)


def _no_key(key_hash: str | None) -> str:
    return f" (this call carries no {KEY_HEADER} header)" if key_hash is None else ""


def check_key(w: WorkerInfo, key_hash: str | None, call: str) -> None:
    if not _same_key(w, key_hash):
        raise Refused(
            403,
            "wrong-worker-key",
            f"worker {w.id} registered with another key: this is not worker {w.id} "
            f"(each worker keeps its own key in its state dir){_no_key(key_hash)}",
            {"call": call, "worker": w.id},
        )


def check_register(d: Daemon, wid: str, key_hash: str) -> None:
    """A registration may take an id only with the key the id was first registered with."""
    w = d.workers.get(wid)
    if w is not None and not _same_key(w, key_hash):
        raise Refused(
            409,
            "worker-id-taken",
            f"worker id {wid} belongs to another worker (registered with another "
            f"key): give this worker its own state dir, or an admin deregisters "
            f"{wid} first (DELETE /v1/workers/{wid})",
            {"call": "register", "worker": wid},
        )


def stale(rec: TaskRecord, epoch: int) -> ApiError:
    return ApiError(
        409,
        "stale-epoch",
        f"task {rec.id}: epoch {epoch} is not a lease the control plane still "
        f"knows (the task's latest epoch is {rec.epoch}); stop this copy",
    )


def worker_of(
    d: Daemon, p: Principal, wid: str, key_hash: str | None, call: str = "worker"
) -> WorkerInfo:
    """The worker ``wid`` for a worker token of its pool carrying ``wid``'s key: 403 for
    another pool or key (the routes admit worker tokens only: handlers/workers.py), 404 for
    an unknown or lost worker (it registers again)."""
    w = d.workers.get(wid)
    if w is None:
        raise ApiError(404, "not-found", f"no worker {excerpt(wid, quoted=False)}: register first")
    if w.pool != p.name:
        raise forbidden(f"worker {wid} serves pool {w.pool}; this token is bound to {p.name}")
    check_key(w, key_hash, call)
    if w.lost:
        raise ApiError(
            404,
            "not-found",
            f"worker {wid} was declared lost (no heartbeat within its TTL): register again",
        )
    return w


def leases_of(w: WorkerInfo) -> list[dict[str, Any]]:
    return [{"task": t, "epoch": e} for (t, e) in sorted(w.leases)]


# ---------------------------------------------------------------------- register
def prepare_register(
    d: Daemon, p: Principal, body: dict[str, Any], now: int, ov: Overlay, key_hash: str
) -> Prepared:
    wid = body["worker_id"]
    w = d.workers.get(wid)
    if w is not None and w.pool != body["pool"]:
        raise ApiError(
            409,
            "conflict",
            f"worker id {wid} is registered with pool {w.pool}; "
            f"a worker keeps its pool (give it another state dir)",
        )
    check_register(d, wid, key_hash)
    data = {
        "worker_id": wid,
        "pool": body["pool"],
        "hostname": body.get("hostname"),
        "executor": body.get("executor"),
        "gpus": body.get("gpus") or [],
        "version": body.get("version"),
        "key_hash": key_hash,
        "apps": body.get("apps"),
    }
    ev = Event(
        "worker_registered", None, p.text, d.idx().revision, None, None, {"worker": wid, **data}
    )
    events = [ev]
    pool = capacity.pool_of(d, body["pool"])
    if pool is not None:  # issue 15: what this worker reports against what the pool declares
        probe = WorkerInfo(wid, body["pool"])
        probe.gpus = [g for g in data["gpus"] if isinstance(g, dict)]
        wrong = capacity.worker_mismatches(pool, probe)
        if wrong:
            events.append(
                Event(
                    "capacity_mismatch",
                    None,
                    p.text,
                    d.idx().revision,
                    None,
                    None,
                    {"worker": wid, "pool": body["pool"], "mismatches": wrong},
                )
            )

    def apply() -> dict[str, Any]:
        w: WorkerInfo = reducers.apply(d, ev, now)
        s = d.worker_settings
        return {
            "worker_id": wid,
            "heartbeat_ttl_s": s.ttl_s,
            "poll_wait_s": s.poll_wait_s,
            "running": leases_of(w),
            "settings": pool_settings(d, w.pool),
        }

    return Prepared(events, [], apply)


# ---------------------------------------------------------------------- lease
def room(body: dict[str, Any]) -> dict[int, int]:
    """The room in milli-GPUs on each GPU with room (keyed by its place in the request) from
    a lease request: ``gpu_free`` when the worker sends it, else its entirely free GPUs."""
    if body.get("gpu_free") is not None:
        shared = [
            max(0, min(MILLI, gpus_to_milli(float(g.get("free", 0))))) for g in body["gpu_free"]
        ]
    else:
        shared = [MILLI] * len(body.get("free_gpus") or [])
    return {n: f for n, f in enumerate(shared) if f}


def _stopping(rec: TaskRecord, ov: Overlay) -> bool:
    for lease in rec.leases or ():
        if ov.leases.get(lease.key, lease.status) == STOPPING:
            return True
    return False


def candidates(
    d: Daemon, w: WorkerInfo, body: dict[str, Any], ov: Overlay | None = None
) -> list[TaskRecord]:
    """Placed tasks of the worker's pool that no worker holds, no older attempt of which
    is still stopping, and that fit the worker's room, oldest placement first. A gang
    (issue 15, gang.py) is among them when the worker fits a member and either has not
    offered yet or completes it; a gang it already offered for keeps its room."""
    return _scan(d, w, body, ov)[0]


def has_work(d: Daemon, w: WorkerInfo, body: dict[str, Any]) -> bool:
    """Whether a lease request of ``w`` has something to prepare now (else it parks)."""
    return bool(d.undelivered.get(w.id)) or bool(candidates(d, w, body))


def _scan(
    d: Daemon, w: WorkerInfo, body: dict[str, Any], ov: Overlay | None = None
) -> tuple[list[TaskRecord], set[str]]:
    """``candidates``, and the gangs the worker fits a member of (its offers stay)."""
    waiting = d.unleased.get(w.pool)
    if not waiting:
        return [], set()
    ov = ov or Overlay()
    free = room(body)
    # CPU-only tasks the worker starts now (its --cpu-tasks); absent: no limit (older workers)
    cpu_free = body.get("cpu_free")
    out: list[TaskRecord] = []
    fits_gangs: set[str] = set()
    for n, tid in enumerate(waiting):
        if n >= SCAN or len(out) >= MAX_LEASES:
            break
        rec = d.records.get(tid)
        if (
            rec is None
            or rec.state != "placed"
            or tid in ov.leased
            or tid in ov.ended
            or tid in ov.requeued
            or _stopping(rec, ov)
        ):
            continue
        nodes = gang.nodes_of(d, rec)
        if nodes > 1 and not gang.spreads(w):
            if gpu_fits(gang.share(rec, nodes), free):
                fits_gangs.add(tid)
                if not gang.offered(d, rec, w.id) or gang.members(d, rec, w.id, nodes) is not None:
                    out.append(rec)
            continue
        if not apps.can_start(w, rec):  # a session of an app it lacks: another worker's
            continue
        if not rec.size and cpu_free is not None:
            if cpu_free <= 0:
                continue
            cpu_free -= 1
        if gpu_fits(rec.size or 0, free):
            out.append(rec)
    return out, fits_gangs


def pool_settings(d: Daemon, pool: str) -> dict[str, str]:
    """The pool's ``settings`` in the estate in force (docs/worker-protocol.md, addition 16):
    sent at registration and with every lease, so an edited pool reaches running workers
    with their next lease."""
    p = d.idx().estate.pool(pool)
    return dict(p.settings) if p is not None else {}


def lease_json(d: Daemon, rec: TaskRecord, lease: Lease) -> dict[str, Any]:
    return {
        "task": rec.id,
        "epoch": lease.epoch,
        "command": rec.command,
        "settings": pool_settings(d, lease.pool),
        "payload": rec.payload,
        "gpus": gpus(lease.size),
        "resource": rec.resource,
        "user": rec.user,
        "project": rec.project,
        "labels": rec.labels,
        "grace_s": d.worker_settings.grace_s,
        "env": gang.rendezvous_env(lease),
        **gang.lease_extra(lease),
    }


def prepare_lease(
    d: Daemon, p: Principal, wid: str, body: dict[str, Any], now: int, ov: Overlay
) -> Prepared:
    w = d.workers.get(wid)
    if (
        w is None
        or w.lost
        or wid in ov.lost
        or p.token_id in ov.revoked
        or not d.tokens.usable(p.token_id, now)
    ):
        return Prepared(apply=lambda: [])  # a revoked token's poll gets nothing
    if d.undelivered.get(wid):
        return _deliver(d, w)
    picks, fits_gangs = _scan(d, w, body, ov)
    gang.withdraw_offers(d, wid, fits_gangs)
    if not picks:
        return Prepared(apply=lambda: [])
    rev = d.idx().revision
    events = []
    offered: list[TaskRecord] = []
    for rec in picks:
        nodes = gang.nodes_of(d, rec)
        if nodes > 1 and not gang.spreads(w):
            chosen = gang.members(d, rec, wid, nodes)
            if chosen is None:
                offered.append(rec)  # waits for more workers (gang.py)
                continue
            ov.leased.add(rec.id)
            events.extend(_gang_leases(d, p, rec, chosen, nodes, rev))
            continue
        ov.leased.add(rec.id)
        epoch = rec.epoch + 1
        events.append(
            Event(
                "leased",
                rec.id,
                p.text,
                rev,
                rec.group,
                rec.user,
                {
                    "worker": wid,
                    "epoch": epoch,
                    "pool": w.pool,
                    "size_milli": rec.size or 0,
                    **({"nodes": nodes} if nodes > 1 else {}),
                },
            )
        )
    mono = d.mono()

    def apply() -> list[dict[str, Any]]:
        for rec in offered:
            gang.offer(d, rec, wid, mono)
        out = []
        others = False
        for ev in events:
            lease: Lease = reducers.apply(d, ev, now)
            if lease.world > 1:
                d.gang_offers.pop(lease.task, None)
            if lease.worker == wid:
                out.append(lease_json(d, d.records[lease.task], lease))
            else:  # a member for another worker: its poll gets it (woken below)
                d.undelivered.setdefault(lease.worker, []).append(lease.key)
                others = True
        if others and d.on_work is not None:
            d.on_work(w.pool)
        return out

    return Prepared(events, [], apply)


def _gang_leases(
    d: Daemon, p: Principal, rec: TaskRecord, chosen: list[str], nodes: int, rev: str
) -> list[Event]:
    """The ``nodes`` member leases of a gang, one per chosen worker, rank 0 the master."""
    master = d.workers[chosen[0]]
    base = rec.epoch + 1
    port = gang.master_port(d, rec.pool or "")
    return [
        Event(
            "leased",
            rec.id,
            p.text,
            rev,
            rec.group,
            rec.user,
            {
                "worker": member,
                "epoch": base + rank,
                "pool": rec.pool,
                "size_milli": gang.share(rec, nodes),
                "rank": rank,
                "world": nodes,
                "master_addr": master.hostname or "localhost",
                "master_port": port,
            },
        )
        for rank, member in enumerate(chosen)
    ]


def _deliver(d: Daemon, w: WorkerInfo) -> Prepared:
    """Gang member leases made for ``w`` on another worker's poll: its answer now."""

    def apply() -> list[dict[str, Any]]:
        out = []
        for key in d.undelivered.pop(w.id, []):
            lease = w.leases.get(key)
            rec = d.records.get(key[0])
            if lease is not None and lease.status == ACTIVE and rec is not None:
                out.append(lease_json(d, rec, lease))
        return out

    return Prepared(apply=apply)


def prepare_gang_timeout(d: Daemon, task_id: str, now: int, ov: Overlay) -> Prepared:
    """A placed gang whose members were not all taken in time goes back to the front of its
    queue with the reason (kind ``gang``, not counted as a loss)."""
    rec = d.records.get(task_id)
    timeout = d.worker_settings.gang_timeout_s
    if (
        rec is None
        or task_id not in gang.overdue(d, timeout, now)
        or task_id in ov.leased
        or task_id in ov.ended
        or task_id in ov.requeued
    ):
        return Prepared()
    ov.requeued.add(task_id)
    text = gang.timeout_text(d, rec, timeout)
    interval = rec.interval_id
    ev = Event(
        "preempted",
        task_id,
        "kliqued",
        d.idx().revision,
        rec.group,
        rec.user,
        {
            "kind": gang.GANG,
            "text": text,
            "pool": rec.pool,
            "interval": interval,
            **d.lost_now(task_id, now),
        },
    )

    def apply() -> None:
        d.gang_offers.pop(task_id, None)
        reducers.apply(d, ev, now)

    return Prepared([ev], [], apply, wants_pass=True, closes=[(interval, now, text)], frees=True)


# ---------------------------------------------------------------------- losing a task
def _lose(
    d: Daemon,
    rec: TaskRecord,
    lease: Lease,
    now: int,
    ov: Overlay,
    actor: str,
    detail: dict[str, Any],
    returned: bool = False,
    text: str | None = None,
) -> Prepared:
    """The task's worker is gone (or says it lost the task): back to the front of its queue
    with ``worker lost``, or failed the third time. ``returned``: the worker handed it back
    (it stopped it on a clean shutdown and said so): back to the front, not counted as a
    loss. ``text``: the reason when it is not the worker's loss (a gang member failed);
    a gang's other members are told to stop either way (the gang is requeued whole)."""
    rev = d.idx().revision
    interval = rec.interval_id
    if text is None and lease.world > 1:
        text = f"gang member rank {lease.rank} (worker {lease.worker}): " + (
            RETURNED_TEXT if returned else LOST_TEXT
        )
    ov.leases[lease.key] = CLOSED if returned else FENCED
    data = {
        "pool": rec.pool,
        "epoch": lease.epoch,
        "worker": lease.worker,
        "interval": interval,
        **detail,
    }
    cost = d.lost_now(rec.id, now) if rec.state == "placed" else {}
    if returned:
        ov.requeued.add(rec.id)
        ev = Event(
            "preempted",
            rec.id,
            actor,
            rev,
            rec.group,
            rec.user,
            {"kind": RETURNED, "text": text or RETURNED_TEXT, "by": lease.worker, **data, **cost},
        )

        def apply_returned() -> None:
            reducers.apply(d, ev, now)

        return Prepared(
            [ev],
            [],
            apply_returned,
            wants_pass=True,
            closes=[(interval, now, text or RETURNED_TEXT)],
            frees=True,
        )
    if rec.lost + 1 >= MAX_LOSSES:
        ov.ended.add(rec.id)
        ev = Event(
            "ended",
            rec.id,
            actor,
            rev,
            rec.group,
            rec.user,
            {
                "kind": "failed",
                "lost": True,
                **data,
                "reason": f"{LOST_FAIL_TEXT}, last: {text}" if text else LOST_FAIL_TEXT,
            },
        )

        def apply() -> None:
            reducers.apply(d, ev, now)
    else:
        ov.requeued.add(rec.id)
        ev = Event(
            "preempted",
            rec.id,
            actor,
            rev,
            rec.group,
            rec.user,
            {"kind": "lost", "text": text or LOST_TEXT, "by": lease.worker, **data, **cost},
        )

        def apply() -> None:
            reducers.apply(d, ev, now)

    return Prepared([ev], [], apply, wants_pass=True, closes=[(interval, now, text or LOST_TEXT)])


def _requeue_leases(
    d: Daemon,
    w: WorkerInfo,
    now: int,
    ov: Overlay,
    actor: str,
    extra: dict[str, Any],
    closed_as: Callable[[str], str],
) -> tuple[list[Prepared], list[dict[str, Any]]]:
    """A worker that is gone (lost, or deregistered) gives back every task it holds: each
    placed task under its current lease goes back to the front of its queue, and every
    lease of the worker ends (``closed_as`` of its status)."""
    subs: list[Prepared] = []
    tasks = []
    for lease in sorted(w.leases.values(), key=lambda x: x.key):
        status = ov.leases.get(lease.key, lease.status)
        rec = d.records.get(lease.task)
        tasks.append({"task": lease.task, "epoch": lease.epoch, "status": status})
        if (
            rec is not None
            and status == ACTIVE
            and rec.state == "placed"
            and _current(rec, lease)
            and rec.id not in ov.ended
            and rec.id not in ov.requeued
        ):
            subs.append(_lose(d, rec, lease, now, ov, actor, extra))
        ov.leases[lease.key] = closed_as(status)
    return subs, tasks


def _current(rec: TaskRecord, lease: Lease) -> bool:
    """Whether ``lease`` belongs to the task's latest attempt (a gang: any member)."""
    last = rec.current_lease
    return last is not None and lease.task == last.task and lease.base_epoch == last.base_epoch


def prepare_worker_lost(d: Daemon, wid: str, now: int, ov: Overlay) -> Prepared:
    w = d.workers.get(wid)
    if w is None or w.lost or wid in ov.lost:
        return Prepared()
    ov.lost.add(wid)
    rev = d.idx().revision
    subs, tasks = _requeue_leases(d, w, now, ov, "kliqued", {}, lambda status: FENCED)
    ev = Event(
        "worker_lost",
        None,
        "kliqued",
        rev,
        None,
        None,
        {"worker": wid, "pool": w.pool, "tasks": tasks, "ttl_s": d.worker_settings.ttl_s},
    )

    def apply() -> None:
        reducers.apply(d, ev, now)
        for s in subs:
            s.apply()

    return Prepared(
        [ev] + [e for s in subs for e in s.events],
        [],
        apply,
        wants_pass=bool(subs),
        closes=[c for s in subs for c in s.closes],
    )


# ---------------------------------------------------------------------- reports
def lease_for_report(
    d: Daemon, p: Principal, task_id: str, epoch: int, key_hash: str | None, call: str = "report"
) -> tuple[TaskRecord, Lease | None]:
    """The task and its lease ``epoch``, for the worker holding that lease (its pool's
    token and its key): 403 for another pool or another worker of the pool, 404 for no
    such task."""
    rec = d.record(task_id)
    lease = rec.lease(epoch)
    pool = lease.pool if lease is not None else (rec.current_lease.pool if rec.leases else rec.pool)
    if pool != p.name:
        raise forbidden(f"task {task_id} is not on pool {p.name}")
    holder = d.workers.get(lease.worker) if lease is not None else None
    if holder is not None and not _same_key(holder, key_hash):
        raise Refused(
            403,
            "not-lease-holder",
            f"task {task_id} epoch {epoch} is held by worker {holder.id}, and this "
            f"caller is not that worker (its key differs): only the holder reports "
            f"on a lease{_no_key(key_hash)}",
            {"call": call, "task": task_id, "epoch": epoch, "holder": holder.id},
        )
    return rec, lease


def prepare_report(
    d: Daemon,
    p: Principal,
    task_id: str,
    body: dict[str, Any],
    now: int,
    ov: Overlay,
    key_hash: str | None,
) -> Prepared:
    epoch, event = int(body["epoch"]), body["event"]
    rec, lease = lease_for_report(d, p, task_id, epoch, key_hash)
    if lease is None:
        raise stale(rec, epoch)
    key = lease.key
    status = ov.leases.get(key, lease.status)
    if status == FENCED:
        raise stale(rec, epoch)
    done = Prepared(apply=lambda: task_id)
    if status == CLOSED:
        return done  # a retry: it changes nothing
    rev = d.idx().revision
    message = body.get("message")
    data = {
        "worker": lease.worker,
        "epoch": epoch,
        "exit_code": body.get("exit_code"),
        "signal": body.get("signal"),
        "message": message,
        "at": body.get("at"),
    }
    ended_here = task_id in ov.ended or task_id in ov.requeued
    if status == ACTIVE and ended_here:
        status = STOPPING  # an earlier request of the batch ends or requeues it
    if event == "started":
        if status != ACTIVE or lease.started_at is not None or key in ov.leases:
            return done
        ov.leases[key] = ACTIVE  # marks "started in this batch"
        ev = Event("started", task_id, p.text, rev, rec.group, rec.user, data)

        def apply_started() -> str:
            reducers.apply(d, ev, now)
            return task_id

        return Prepared([ev], [], apply_started)
    lost = event == "lost" or (
        event == "failed" and isinstance(message, str) and message.startswith("worker-lost")
    )
    if status == ACTIVE:
        if lost or event == "stopped":
            # The worker lost it, or stopped it without being told to: it did not end by
            # itself, so it runs again (the third time it fails).
            if event == "stopped" and body.get("reason") in ("shutdown", "cannot-work"):
                # handed back: a clean shutdown, or a worker that cannot work (its state
                # dir is full, issue 26): requeued at the front, no loss counted
                sub = _lose(
                    d,
                    rec,
                    lease,
                    now,
                    ov,
                    p.text,
                    {"report": event, "message": message},
                    returned=True,
                    text=(
                        f"handed back: {message}"
                        if body.get("reason") == "cannot-work" and message
                        else None
                    ),
                )
                return Prepared(
                    sub.events, [], lambda: (sub.apply(), task_id)[1], True, sub.closes, frees=True
                )
            idle = event == "stopped" and _idle_text(body)
            if not idle:
                sub = _lose(d, rec, lease, now, ov, p.text, {"report": event, "message": message})
                return Prepared(
                    sub.events, [], lambda: (sub.apply(), task_id)[1], True, sub.closes, frees=True
                )
        if lease.world > 1:
            member = _gang_member_end(d, p, rec, lease, event, body, data, now, ov)
            if member is not None:
                return member
        interval = rec.interval_id
        ov.ended.add(task_id)
        ov.leases[key] = CLOSED
        # charged up to its real end, not the report's arrival (ends.py)
        until = ends.ran_until(body.get("at"), rec.placed_at, lease.seen_running_at, now)
        reason = None
        if event == "stopped":  # the worker stopped an idle session (workers/idle.py)
            reason = f"stopped: idle ({_idle_text(body)})"
        outputs = body.get("outputs") if event == "finished" else None
        ev = Event(
            "ended",
            task_id,
            p.text,
            rev,
            rec.group,
            rec.user,
            {
                "kind": event,
                **data,
                "interval": interval,
                "ran_until": until,
                **({"reason": reason} if reason else {}),
                **({"outputs": outputs} if outputs else {}),
            },
        )

        def apply_ended() -> str:
            reducers.apply(d, ev, now)
            return task_id

        return Prepared(
            [ev], [], apply_ended, True, [(interval, until, reason or event)], frees=True
        )
    # A lease told to stop: its process is gone.
    ov.leases[key] = CLOSED
    if (
        event == "finished"
        and rec.state == "queued"
        and not ended_here
        and lease.world == 1
        and task_id not in ov.leased
        and lease.stop_reason in ("preempted", "budget")
    ):
        # It completed before the stop reached it: done, not run again.
        ov.ended.add(task_id)
        ev = Event(
            "ended",
            task_id,
            p.text,
            rev,
            rec.group,
            rec.user,
            {"kind": "finished", **data, "interval": None, "after_stop": True},
        )

        def apply_done() -> str:
            reducers.apply(d, ev, now)
            return task_id

        return Prepared([ev], [], apply_done, True, frees=True)
    ev = Event(
        "stopped",
        task_id,
        p.text,
        rev,
        rec.group,
        rec.user,
        {**data, "report": event, "reason": lease.stop_reason},
    )

    def apply_stopped() -> str:
        reducers.apply(d, ev, now)
        return task_id

    return Prepared([ev], [], apply_stopped)


def _gang_member_end(
    d: Daemon,
    p: Principal,
    rec: TaskRecord,
    lease: Lease,
    event: str,
    body: dict[str, Any],
    data: dict[str, Any],
    now: int,
    ov: Overlay,
) -> Prepared | None:
    """A gang member's own end (issue 15): a failure stops the gang and requeues it whole
    (counted like a loss: the third time the task fails); a member that finished closes its
    lease and the task ends with the last one (None: this report ends the task)."""
    task_id = rec.id
    if event == "failed":
        why = (
            f"exit {body.get('exit_code')}"
            if body.get("signal") is None
            else f"signal {body.get('signal')}"
        )
        sub = _lose(
            d,
            rec,
            lease,
            now,
            ov,
            p.text,
            {"report": event, "message": body.get("message")},
            text=f"gang member rank {lease.rank} (worker {lease.worker}) failed: {why}",
        )
        return Prepared(
            sub.events, [], lambda: (sub.apply(), task_id)[1], True, sub.closes, frees=True
        )
    if event != "finished":
        return None
    others = [m for m in rec.attempt() if m.key != lease.key]
    if all(
        ov.leases.get(m.key, m.status) == CLOSED and (m.outcome == "finished" or m.key in ov.leases)
        for m in others
    ):
        return None  # the last member: the task is done
    ov.leases[lease.key] = CLOSED
    ev = Event(
        "stopped",
        task_id,
        p.text,
        d.idx().revision,
        rec.group,
        rec.user,
        {**data, "report": "finished", "reason": GANG_MEMBER_DONE},
    )

    def apply() -> str:
        reducers.apply(d, ev, now)
        return task_id

    return Prepared([ev], [], apply)


def _idle_text(body: dict[str, Any]) -> str | None:
    """The limit an idle stop reports (``cpu 30m``): a ``stopped`` report with ``reason:
    "idle"``, or (workers before the field) a message ``idle: cpu 30m``."""
    message = body.get("message")
    text = message[5:].strip() if isinstance(message, str) and message.startswith("idle:") else None
    if body.get("reason") == "idle":
        return text or (message if isinstance(message, str) and message else "limit")
    return text


def prepare_reports(
    d: Daemon,
    p: Principal,
    wid: str,
    items: list[dict[str, Any]],
    now: int,
    ov: Overlay,
    key_hash: str | None,
) -> Prepared:
    """Several reports of one worker as one change (one transaction); each is prepared as
    ``POST /tasks/{id}/report`` would be, against what the earlier ones do, and a refused
    one (stale epoch, unknown task) is answered on its own without refusing the others."""
    events: list[Event] = []
    ops: list[Any] = []
    closes: list[tuple[str, int, str]] = []
    applies = []
    results: list[dict[str, Any]] = []
    wants = frees = False
    for item in items:
        tid, epoch = str(item["task"]), int(item["epoch"])
        res: dict[str, Any] = {"task": tid, "epoch": epoch, "status": 200}
        results.append(res)
        try:
            pr = prepare_report(d, p, tid, item, now, ov, key_hash)
        except ApiError as exc:
            res["status"] = exc.status
            res["error"] = exc.body()["error"]
            if isinstance(exc, Refused):
                events.append(refused_event(d, p, exc, tid))
            continue
        events.extend(pr.events)
        ops.extend(pr.ops)
        closes.extend(pr.closes)
        applies.append(pr.apply)
        wants |= pr.wants_pass
        frees |= pr.frees

    def apply() -> list[dict[str, Any]]:
        for a in applies:
            a()
        return results

    return Prepared(events, ops, apply, wants, closes, frees=frees)


# ---------------------------------------------------------------------- deregistering
def prepare_deregister(d: Daemon, p: Principal, wid: str, now: int, ov: Overlay) -> Prepared:
    """A worker leaves (``DELETE /workers/{id}``): like a lost worker, its active leases are
    fenced and their tasks requeued at the front (``worker lost``, counted toward the 3), but
    leases it was told to stop and has not reported yet are only closed (they were stopped
    anyway: no loss), and the worker is removed from the list rather than marked lost."""
    w = d.workers.get(wid)
    if w is None or wid in ov.lost:
        raise ApiError(404, "not-found", f"no worker {excerpt(wid, quoted=False)}")
    ov.lost.add(wid)
    rev = d.idx().revision
    subs, tasks = _requeue_leases(
        d,
        w,
        now,
        ov,
        p.text,
        {"deregistered": True},
        lambda status: FENCED if status == ACTIVE else CLOSED,
    )
    ev = Event(
        "worker_deregistered",
        None,
        p.text,
        rev,
        None,
        None,
        {"worker": wid, "pool": w.pool, "tasks": tasks},
    )

    def apply() -> dict[str, Any]:
        reducers.apply(d, ev, now)
        for sub in subs:
            sub.apply()
        return {
            "worker": wid,
            "pool": w.pool,
            "requeued": [t["task"] for t in tasks if t["status"] == ACTIVE],
        }

    return Prepared(
        [ev] + [e for sub in subs for e in sub.events],
        [],
        apply,
        wants_pass=bool(subs),
        closes=[c for sub in subs for c in sub.closes],
        frees=bool(subs),
    )


# ---------------------------------------------------------------------- heartbeats
def heartbeat(
    d: Daemon, w: WorkerInfo, body: dict[str, Any], withdraw_after_s: float
) -> tuple[list[dict[str, Any]], list[tuple[str, int]]]:
    """Stop instructions for the worker (its leases told to stop; fencing of copies it
    lists that are no longer its own), and the active leases it does not list long after
    they were leased (their answer never reached it)."""
    listed: set[tuple[str, int]] = set()
    now = d.clock.now()
    for r in body.get("running") or ():
        try:
            key = (str(r["task"]), int(r["epoch"]))
        except (KeyError, TypeError, ValueError):
            continue
        listed.add(key)
        held = w.leases.get(key)
        if held is not None and r.get("state") == "running":
            held.seen_running_at = now  # it ran until now: its end is charged no earlier
    grace = d.worker_settings.grace_s
    stops: list[dict[str, Any]] = []
    withdraw: list[tuple[str, int]] = []
    mono = d.mono()
    for lease in w.leases.values():
        if lease.status == STOPPING:
            stops.append(
                {
                    "task": lease.task,
                    "epoch": lease.epoch,
                    "reason": lease.stop_reason or "preempted",
                    "text": lease.stop_text or "",
                    "grace_s": grace,
                }
            )
        elif (
            lease.status == ACTIVE
            and lease.key not in listed
            and mono - lease.leased_mono > withdraw_after_s
        ):
            withdraw.append(lease.key)
    for task, epoch in sorted(listed):
        if (task, epoch) in w.leases:
            continue
        rec = d.records.get(task)
        held = rec.lease(epoch) if rec is not None else None
        if held is not None and held.status == CLOSED and held.worker == w.id:
            continue  # its last report was acknowledged; the worker forgets it
        stops.append(
            {
                "task": task,
                "epoch": epoch,
                "reason": "stale-epoch",
                "text": f"this worker no longer holds task {task} at epoch {epoch}",
                "grace_s": 0,
            }
        )
    return stops, withdraw


def checkpoints(d: Daemon, w: WorkerInfo, body: dict[str, Any]) -> list[tuple[str, int, str]]:
    """The checkpoints a heartbeat relays that may be new: ``(task, epoch, checkpoint_at)``
    for each listed lease this worker holds, active, of a placed task, whose time is later
    than the last one recorded. Fenced like a report: a lease at an old epoch, another
    worker's, or one told to stop counts for nothing (the preemption that stopped it has
    counted its lost work already). :func:`prepare_checkpoints` decides under the
    sequencer."""
    out: list[tuple[str, int, str]] = []
    for r in body.get("running") or ():
        if not isinstance(r, dict) or not isinstance(r.get("checkpoint_at"), str):
            continue
        try:
            key = (str(r["task"]), int(r["epoch"]))
            at = parse_iso(r["checkpoint_at"])
        except (KeyError, TypeError, ValueError):
            continue
        lease = w.leases.get(key)
        rec = d.records.get(key[0])
        if lease is None or lease.status != ACTIVE or rec is None or rec.state != "placed":
            continue
        if rec.checkpoint_at is None or at > rec.checkpoint_at:
            out.append((key[0], key[1], r["checkpoint_at"]))
    return out


def prepare_checkpoints(
    d: Daemon, p: Principal, wid: str, items: list[tuple[str, int, str]], now: int, ov: Overlay
) -> Prepared:
    """``task_checkpointed`` for each relayed checkpoint still new at ``now``: the lease is
    still this worker's and active, the task still placed. The worker's time is clamped to
    ``now`` (a clock ahead of the daemon's; the daemon's time is the one lost work is
    counted in) and refused before the placement (a checkpoint of an earlier attempt, or a
    clock far behind): lost work is never less than the work since a real checkpoint."""
    rev = d.idx().revision
    events: list[Event] = []
    for task, epoch, reported in items:
        rec = d.records.get(task)
        lease = rec.lease(epoch) if rec is not None else None
        if (
            rec is None
            or lease is None
            or lease.worker != wid
            or rec.state != "placed"
            or ov.leases.get(lease.key, lease.status) != ACTIVE
            or task in ov.ended
            or task in ov.requeued
            or rec.placed_at is None
        ):
            continue
        at = parse_iso(reported)
        clamped = at > now
        at = min(at, now)
        if at < rec.placed_at or (rec.checkpoint_at is not None and at <= rec.checkpoint_at):
            continue
        events.append(
            Event(
                "task_checkpointed",
                task,
                p.text,
                rev,
                rec.group,
                rec.user,
                {"epoch": epoch, "at": at, "worker": wid, "reported": reported, "clamped": clamped},
            )
        )

    def apply() -> None:
        for ev in events:
            reducers.apply(d, ev, now)

    return Prepared(events, [], apply)


def prepare_withdraw(
    d: Daemon, p: Principal, wid: str, keys: list[tuple[str, int]], now: int, ov: Overlay
) -> Prepared:
    rev = d.idx().revision
    events = []
    subs: list[Prepared] = []
    for task, epoch in keys:
        rec = d.records.get(task)
        lease = rec.lease(epoch) if rec is not None else None
        if (
            rec is None
            or lease is None
            or lease.worker != wid
            or ov.leases.get(lease.key, lease.status) != ACTIVE
            or task in ov.ended
            or task in ov.requeued
        ):
            continue
        if lease.world > 1:  # a gang member never taken: the gang goes back whole
            subs.append(
                _lose(
                    d,
                    rec,
                    lease,
                    now,
                    ov,
                    p.text,
                    {},
                    returned=True,
                    text=f"gang member rank {lease.rank}: worker {wid} never took its lease",
                )
            )
            ov.leases[lease.key] = FENCED
            continue
        ov.leases[lease.key] = FENCED
        events.append(
            Event(
                "unleased",
                task,
                p.text,
                rev,
                rec.group,
                rec.user,
                {
                    "worker": wid,
                    "epoch": epoch,
                    "text": "the worker never listed this lease in its heartbeats",
                },
            )
        )

    def apply() -> None:
        for ev in events:
            reducers.apply(d, ev, now)
        for sub in subs:
            sub.apply()

    return Prepared(
        events + [e for sub in subs for e in sub.events],
        [],
        apply,
        wants_pass=bool(subs),
        closes=[c for sub in subs for c in sub.closes],
        frees=bool(subs),
    )
