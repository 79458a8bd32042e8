"""The daemon's live state and every change to it.

``Daemon`` holds the engine's ``State`` and index, the task records, tokens
and idempotency keys. Each kind of event has one ``on_<kind>`` method that changes all of it;
the live path and replay call the same methods, so a rebuilt daemon equals the one that
stopped. On the live path a request's change is *prepared* (validated, its events and ledger
writes built) before the commit and *applied* after it (``Prepared.apply``); an engine pass
has already changed the State when its decisions are logged (the sequencer orders both, see
loop.py).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from compiler.compiled import CIdle, CompiledEstate
from klique_util.excerpt import excerpt
from kliqued.engine import (Alert, Cancellation, EstateIndex, PassResult, Placement,
                            Preemption, Reason, State, SubmissionError,
                            check_submission, no_worker_text, waiting_reason,
                            waiting_reasons)
from kliqued.ledger import lost as ledger_lost
from klique_util.units import unit_hours
from kliqued.engine.victims import lost_work as engine_lost_work
from kliqued.ledger import ops as ledger_ops
from kliqued.ledger import writer as ledger


from kliqued.daemon import limits
from kliqued.daemon.state import autoscalers, channels, reducers
from kliqued.daemon.auth import Access, Principal, TokenBook, TokenRecord
from kliqued.daemon.state.autoscalers import AutoscalerInfo
from kliqued.daemon.clock import Clock
from kliqued.daemon.state.cloud import CloudBook
from kliqued.daemon.errors import ApiError, not_found
from kliqued.daemon.events import Event
from kliqued.daemon.ids import IdMaker, new_token
from kliqued.daemon.leases import (ACTIVE, CLOSED, FENCED, GANG_MEMBER_DONE, RETURNED, STOP_REASON,
                     STOPPING, Lease, WorkerInfo)
from kliqued.daemon.state.channel_state import PipelineBook, ScheduleBook
from kliqued.daemon.state.history import Eviction, Recalled
from kliqued.daemon.records import TaskRecord
from kliqued.daemon.storage.eventlog import TokenInsert, TokenUpdate
from kliqued.daemon.storage.store import DbOp
from kliqued.daemon.units import iso

log = logging.getLogger(__name__)

PENDING = Reason("pending", "waits for the next pass")


@dataclass
class Prepared:
    """A request's change, validated, waiting for its commit."""

    events: list[Event] = field(default_factory=list)
    ops: list[DbOp] = field(default_factory=list)
    apply: Callable[[], Any] = lambda: None
    """Runs after the commit; its return value answers the request."""
    wants_pass: bool = False
    closes: list[tuple[str, int, str]] = field(default_factory=list)
    """Ledger intervals to close (id, end ms, reason): a batch's closes are one write."""
    frees: bool = False
    """It frees capacity (a worker's report ended or requeued a task): the pass that fills
    it runs almost at once (loop.REPORT_SETTLE_S) rather than after a burst's delay."""


def merged(parts: list[Prepared]) -> Prepared:
    """Several changes as one: their events and writes in order, one commit, applied in
    the same order (a schedule's run and the task it sends; a pipeline's step and its
    task): after a crash all of them are in the log, or none."""
    out = Prepared()
    applies = []
    for p in parts:
        out.events.extend(p.events)
        out.ops.extend(p.ops)
        out.closes.extend(p.closes)
        out.wants_pass = out.wants_pass or p.wants_pass
        out.frees = out.frees or p.frees
        applies.append(p.apply)

    def apply() -> Any:
        result = None
        for a in applies:
            result = a()
        return result
    out.apply = apply
    return out


@dataclass
class Overlay:
    """What earlier requests of the same batch will change once applied: later ones are
    prepared against it (a retried key, a task cancelled twice, ...)."""

    keys: dict[tuple[str, str], str] = field(default_factory=dict)
    ended: set[str] = field(default_factory=set)
    enabled: bool | None = None
    revoked: set[str] = field(default_factory=set)
    leased: set[str] = field(default_factory=set)
    """Tasks leased by an earlier request of the batch."""
    leases: dict[tuple[str, int], str] = field(default_factory=dict)
    """Lease statuses an earlier request of the batch changes."""
    requeued: set[str] = field(default_factory=set)
    """Placed tasks an earlier request of the batch puts back in their queue (lost)."""
    lost: set[str] = field(default_factory=set)
    """Workers an earlier request of the batch declares lost."""
    stored: Counter[str] = field(default_factory=Counter)
    """Task data bytes earlier submissions of the batch add, per user."""
    made: Counter[tuple[str, str]] = field(default_factory=Counter)
    """Schedules and running pipelines earlier requests of the batch make, per (kind,
    owner)."""


@dataclass
class EstateInfo:
    revision: str = ""
    applied_at: int | None = None
    source: str | None = None
    refused: dict[str, Any] | None = None
    commit: str | None = None
    """The git commit the running revision was read from (``--git``)."""


@dataclass
class WorkerSettings:
    ttl_s: float = 15.0
    """A worker silent this long is lost."""
    poll_wait_s: float = 30.0
    """How long a lease request waits for work at most."""
    grace_s: float = 30.0
    """SIGTERM to SIGKILL for a stopped task (in every lease and stop instruction)."""
    gang_timeout_s: float = 120.0
    """A placed gang whose members are not all taken by then goes back to its queue."""


class Daemon:
    def __init__(self) -> None:
        self.clock = Clock()
        self.index: EstateIndex | None = None
        self.state: State | None = None
        self.access: Access | None = None
        self.gpu_type: dict[str, str] = {}
        self.session_idle: dict[str, CIdle] = {}
        """Each profile's session idle limits (IT's ceiling), where it declares them."""
        self.group_path: dict[str, str] = {}
        """Each group's path in the estate in force: recorded on the intervals it opens."""
        self.records: dict[str, TaskRecord] = {}
        self.ids: list[str] = []
        """Task ids in submission order, which is id order: paging bisects it. Ids of
        records evicted since (history.py) are dropped lazily: skip what ``records`` lacks."""
        self.ids_version = 0
        """Bumped each time ``ids`` is compacted (indexes kept by offset start again)."""
        self._ids_dead = 0
        self.eviction = Eviction()
        self.recalled = Recalled()
        self.snapshot_at = 0
        """The sequence number of the snapshot replay started from (0: none)."""
        """Evicted records read back lately (history.recall)."""
        """Which ended tasks leave memory for the ``task_history`` table (history.py)."""
        self.placed_count: Counter[str] = Counter()
        self.stored: Counter[str] = Counter()
        """Per user: the command and payload bytes of their tasks not yet ended."""
        self.idem: dict[tuple[str, str], str] = {}
        self.tokens = TokenBook()
        self.alerts: dict[str, list[dict[str, Any]]] = {}
        self.estate = EstateInfo()
        self.seq = 0
        self.task_ids = IdMaker("t-")
        self.token_ids = IdMaker("tk-")
        self.last_result: PassResult | None = None
        self.passes = 0
        self.last_pass_at: int | None = None
        self._reasons: tuple[int, dict[str, Reason]] | None = None
        self.workers: dict[str, WorkerInfo] = {}
        self.autoscalers: dict[str, AutoscalerInfo] = {}
        """Per autoscaled pool: its autoscaler's heartbeats (autoscalers.py), not logged."""
        self.unleased: dict[str, dict[str, None]] = {}
        """Per pool: placed tasks no worker holds yet, in placement order."""
        self.worker_settings = WorkerSettings()
        self.max_user_bytes = limits.MAX_USER_BYTES
        self.require_workers = False
        """Pools take work only while they have a live worker (or autoscale). ``kliqued
        serve`` sets it (on unless ``--place-without-workers``); an in-process Daemon with
        no workers (tests) places as the engine alone would."""
        self.mono: Callable[[], float] = time.monotonic
        self.on_work: Callable[[str], None] | None = None
        """Called with a pool that has new work for its workers (wakes their long polls)."""
        self.gang_offers: dict[str, tuple[int, dict[str, float]]] = {}
        """Per placed gang (issue 15): its placement number and the workers that offered to
        take a member, with when (monotonic). Live only (gang.py)."""
        self.undelivered: dict[str, list[tuple[str, int]]] = {}
        """Per worker: gang member leases made on another worker's poll, for its next poll."""
        self.schedules = ScheduleBook()
        self.pipelines = PipelineBook()
        """The unattended channels' state (schedules.py, pipelines.py), from the log too."""
        self.cloud = CloudBook()
        """Cloud nodes and their spend, the autoscalers' scaling reports (cloud.py)."""

    # ------------------------------------------------------------------ reading
    @property
    def ready(self) -> bool:
        return self.state is not None

    def idx(self) -> EstateIndex:
        assert self.index is not None
        return self.index

    def st(self) -> State:
        assert self.state is not None
        return self.state

    def acc(self) -> Access:
        assert self.access is not None
        return self.access

    def find(self, task_id: str) -> TaskRecord | None:
        """The task's record: in memory, or evicted and read back lately
        (``history.recall``, which handlers await first)."""
        rec = self.records.get(task_id)
        return rec if rec is not None else self.recalled.get(task_id)

    def record(self, task_id: str) -> TaskRecord:
        rec = self.find(task_id)
        if rec is None:
            raise not_found(f"no task {excerpt(task_id, quoted=False)}")
        return rec

    def position(self, rec: TaskRecord) -> int | None:
        if rec.state != "queued":
            return None
        pos = self.st().position(rec.id)
        return None if pos is None else pos + 1

    def reason(self, rec: TaskRecord, many: bool = False) -> Reason | None:
        """Why a queued task waits, computed by the engine from the current state (the last
        pass's view while nothing changed since). ``many``: every reason at once, cached
        until the state changes (listings). A task no pass has seen yet waits for the next
        pass. A placed task that no worker holds says why it has not started."""
        if rec.state == "placed":
            return self.start_reason(rec)
        if rec.state != "queued":
            return None
        if rec.submitted_pass >= self.passes:
            return PENDING
        st = self.st()
        if many:
            cached = self._reasons
            if cached is None or cached[0] != st.version:
                cached = self._reasons = (st.version, waiting_reasons(self.idx(), st,
                                                                      st.clock))
            return cached[1].get(rec.id)
        # With its position known the engine skips walking the queue to find it (O(n) in a
        # strict queue).
        return waiting_reason(self.idx(), st, rec.id, st.clock, position=st.position(rec.id))

    def ids_dropped(self, n: int) -> None:
        """``n`` records left memory: ``ids`` is compacted once most of it is dead, so
        dropping costs O(1) amortized, not a list removal each."""
        self._ids_dead += n
        if self._ids_dead > len(self.records) + 1000:
            records = self.records
            self.ids = [i for i in self.ids if i in records]
            self._ids_dead = 0
            self.ids_version += 1

    # ------------------------------------------------------------------ liveness
    def pool_live(self, pool: str) -> bool:
        """Whether ``pool`` has a worker not declared lost (always, without
        ``require_workers``). What follows for placements is the engine's rule
        (docs/decisions.md, "pools with no live worker")."""
        if not self.require_workers:
            return True
        return any(w.pool == pool and not w.lost for w in self.workers.values())

    def live_workers(self, pool: str) -> list[WorkerInfo]:
        return [w for w in self.workers.values() if w.pool == pool and not w.lost]

    def _sync_pool(self, pool: str, at: int) -> None:
        """Tells the engine whether ``pool`` takes placements (after any change of its
        workers or of the estate; replay makes the same calls, so a restarted daemon starts
        from what its log says of every worker, each then given a full TTL to show up)."""
        if self.state is not None:
            self.state.set_pool_live(pool, self.pool_live(pool), at)
            info = self.index.pools.get(pool) if self.index is not None else None
            if info is not None and info.autoscaled:
                self.state.set_autoscaler_live(pool, autoscalers.live(self, pool), at)

    def start_reason(self, rec: TaskRecord) -> Reason | None:
        """Why a placed task has not started: no worker of its pool holds it yet."""
        pool = rec.pool
        if pool is None or rec.id not in self.unleased.get(pool, {}):
            return None
        if pool in self.st().no_worker:
            return Reason("worker", f"placed on {pool}, not started: "
                                    f"{no_worker_text(pool)}")
        since = rec.placed_at if rec.unleased_at is None else max(rec.placed_at or 0,
                                                                   rec.unleased_at)
        live = self.live_workers(pool)
        if live and all(w.cannot_work for w in live):
            return Reason("worker", f"placed on {pool}, not started: its workers cannot work "
                                    f"({'; '.join(f'{w.id}: {w.cannot_work}' for w in live)})")
        return Reason("worker", f"placed on {pool}, waiting for a worker to start it since "
                                f"{iso(since)}")

    # ------------------------------------------------------------------ changes (live and replay)
    def on_estate(self, compiled: CompiledEstate, source: str | None, at: int,
                  commit: str | None = None) -> None:
        index = EstateIndex.build(compiled)
        if self.state is None:
            # workers report every start (on_leased)
            self.state = State(index, at, self_starting=set())
        else:
            self.state.bind(index, at)
        self.index = index
        for p in compiled.pools:
            self._sync_pool(p.name, at)
        self.access = Access(compiled)
        self.gpu_type = {p.name: p.gpu_type for p in compiled.pools}
        self.session_idle = {p.name: p.idle for p in compiled.profiles if p.idle is not None}
        self.group_path = ledger.group_paths(compiled)
        # A revision applied after a refused one supersedes the refusal.
        self.estate = EstateInfo(compiled.revision, at, source, None, commit)

    def on_submitted(self, task_id: str, at: int, actor: str, revision: str,
                     data: dict[str, Any]) -> TaskRecord:
        st = self.st()
        # Checked against the estate when it was prepared, and the log replays in order.
        t = st.submit(task_id, data["resource"], data["user"], data.get("project"),
                      data.get("gpus_milli"), at=at, checked=True)
        cr = self.idx().resources[t.resource]
        rec = TaskRecord(task_id, t.resource, cr.policy, cr.profile, t.group, t.user, actor,
                         t.project, data.get("labels") or {}, data.get("command"),
                         data.get("payload"), data.get("gpus_milli"), at, revision,
                         data.get("idempotency_key"), channels.stored(data.get("channel")))
        rec.submitted_pass = self.passes
        rec.data_bytes = limits.task_bytes(rec.command, rec.payload)
        self.stored[rec.user] += rec.data_bytes
        self.records[task_id] = rec
        self.ids.append(task_id)
        if rec.idempotency_key is not None:
            self.idem[(actor, rec.idempotency_key)] = task_id
        return rec

    def on_placed(self, task_id: str, pool: str, at: int, replay: bool) -> TaskRecord:
        st = self.st()
        t = st.tasks[task_id]
        if replay:
            st.place(t, pool, at)
        rec = self.records[task_id]
        rec.state = "placed"
        rec.pool = pool
        rec.placed_at = at
        rec.checkpoint_at = None
        rec.intervals += 1
        rec.size = t.size
        rec.started_at = None
        rec.unleased_at = None
        self.placed_count[rec.resource] += 1
        self.unleased.setdefault(pool, {})[task_id] = None
        if self.on_work is not None:
            self.on_work(pool)
        return rec

    def _close_gpu_time(self, rec: TaskRecord, at: int) -> None:
        if rec.state == "placed" and rec.placed_at is not None and rec.size:
            rec.gpu_ms += rec.size * max(0, at - rec.placed_at)

    def _drop_unleased(self, rec: TaskRecord) -> None:
        if rec.pool is not None:
            waiting = self.unleased.get(rec.pool)
            if waiting is not None:
                waiting.pop(rec.id, None)

    def _stop_lease(self, rec: TaskRecord, reason: str, text: str) -> None:
        """The task's active lease (a gang: each active member) is to stop (preempted,
        cancelled, a member failed): its worker hears it in its next heartbeat. Its capacity
        is free in the engine already."""
        for lease in rec.attempt():
            if lease.status == ACTIVE:
                lease.status = STOPPING
                lease.stop_reason = reason
                lease.stop_text = text

    def _end_lease(self, lease: Lease, status: str, outcome: str | None = None) -> None:
        lease.status = status
        if outcome is not None:
            lease.outcome = outcome
        w = self.workers.get(lease.worker)
        if w is not None:
            w.leases.pop(lease.key, None)
        rec = self.records.get(lease.task)
        if rec is not None and rec.state == "placed" and rec.id in self.unleased.get(
                rec.pool or "", {}) and self.on_work is not None and rec.pool is not None:
            self.on_work(rec.pool)  # a task waiting for its old attempt to stop may go now

    def on_preempted(self, task_id: str, at: int, kind: str, text: str,
                     replay: bool, epoch: int | None = None,
                     lost_ms: int | None = None) -> TaskRecord:
        """``lost_ms``: the work the engine's decision says it lost (lending.md); a replay
        and a daemon-made preemption (a lost worker) get it from ``State.preempt``."""
        st = self.st()
        t = st.tasks[task_id]
        size = t.size
        if replay:
            lost = st.preempt(t, at, kind, text)
            if lost_ms is None:
                lost_ms = lost
        rec = self.records[task_id]
        rec.lost_units += (lost_ms or 0) * (size or 0)
        self._close_gpu_time(rec, at)
        self._drop_unleased(rec)
        if kind in ("lost", RETURNED):
            if kind == "lost":
                rec.lost += 1
            lease = rec.lease(epoch) if epoch is not None else rec.current_lease
            if lease is not None and lease.status in (ACTIVE, STOPPING):
                self._end_lease(lease, FENCED if kind == "lost" else CLOSED,
                                None if kind == "lost" else "stopped")
            # a gang: the other members stop (requeued whole, issue 15)
            self._stop_lease(rec, "preempted", text)
        else:
            self._stop_lease(rec, STOP_REASON.get(kind, "preempted"), text)
        rec.state = "queued"
        rec.pool = None
        rec.placed_at = None
        rec.preemptions += 1
        rec.last_preemption = (kind, text, at)
        self.placed_count[rec.resource] -= 1
        return rec

    def on_ended(self, task_id: str, at: int, kind: str, reason: str | None = None,
                 epoch: int | None = None, exit_code: int | None = None,
                 signal: str | None = None, lost: bool = False, by: str | None = None,
                 message: str | None = None,
                 outputs: dict[str, str] | None = None,
                 ran_until: int | None = None) -> TaskRecord | None:
        """Finished, failed or cancelled (by a request, or because the estate removed its
        compute resource: the engine already ended it then). ``epoch``: the lease whose
        report ended it (closed), or which was lost (``lost``: fenced); without it, a
        cancellation: the active lease is told to stop. ``ran_until``: when a worker's
        report says it really ended (ends.py), at or before ``at``: charged until then."""
        rec = self.records.get(task_id)
        if rec is None or rec.state == "ended":
            if rec is not None and epoch is not None:
                lease = rec.lease(epoch)
                if lease is not None and lease.status in (ACTIVE, STOPPING):
                    self._end_lease(lease, FENCED if lost else CLOSED, kind)
            return rec
        if epoch is not None:
            lease = rec.lease(epoch)
            if lease is not None and lease.status in (ACTIVE, STOPPING):
                self._end_lease(lease, FENCED if lost else CLOSED, kind)
            if not lost:
                rec.exit_code, rec.signal = exit_code, signal
            self._stop_lease(rec, "preempted", reason or kind)  # a gang's other members
        else:
            self._stop_lease(rec, STOP_REASON.get(kind, kind), reason or kind)
        if lost:
            rec.lost += 1
        until = at
        if ran_until is not None and rec.state == "placed":
            until = max(rec.placed_at or ran_until, min(ran_until, at))
        self._close_gpu_time(rec, until)
        self._drop_unleased(rec)
        st = self.st()
        t = st.tasks.get(task_id)
        if t is not None:
            st.end(task_id, at, kind, ran_until=until)
            st.forget(task_id)  # also drops a cancellation of it not yet reported
        if rec.state == "placed":
            self.placed_count[rec.resource] -= 1
        rec.state = "ended"
        self.eviction.note_ended(task_id)
        self.stored[rec.user] -= rec.data_bytes
        if self.stored[rec.user] <= 0:
            del self.stored[rec.user]
        rec.end_reason = reason if reason and (lost or kind == "stopped") else kind
        rec.end_note, rec.ended_by = reason, by
        rec.end_message = message if isinstance(message, str) and message else None
        rec.ended_at = until
        if outputs:
            rec.outputs = dict(outputs)
        return rec

    # ------------------------------------------------------------------ workers and leases
    def on_worker_registered(self, data: dict[str, Any], at: int) -> WorkerInfo:
        wid = data["worker_id"]
        w = self.workers.get(wid)
        if w is None:
            w = self.workers[wid] = WorkerInfo(wid, data["pool"])
        w.pool = data["pool"]
        w.hostname = data.get("hostname")
        w.executor = data.get("executor")
        w.gpus = list(data.get("gpus") or [])
        w.version = data.get("version")
        w.registered_at = at
        if w.key_hash is None:  # the first registration with a key binds the id to it
            w.key_hash = data.get("key_hash")
        w.lost_at = None
        w.last_seen = self.mono()
        self._sync_pool(w.pool, at)
        if self.on_work is not None:
            self.on_work(w.pool)
        return w

    def on_leased(self, task_id: str, worker: str, epoch: int, at: int,
                  p: Any = None) -> Lease:
        """``p``: the ``leased`` payload (a gang member's rank and rendezvous, issue 15)."""
        rec = self.records[task_id]
        w = self.workers[worker]
        size = rec.size if rec.size is not None else (rec.gpus_milli or 0)
        world = getattr(p, "world", 1) or 1
        if world > 1 and p.size_milli is not None:
            size = p.size_milli
        lease = Lease(task_id, epoch, worker, w.pool, size, at, self.mono())
        if p is not None:
            lease.rank, lease.world, lease.nodes = p.rank, world, p.nodes or 1
            lease.master_addr, lease.master_port = p.master_addr, p.master_port
        if rec.leases is None:
            rec.leases = []
        if len(rec.leases) != epoch - 1:
            raise ValueError(f"lease epoch {epoch} of {task_id} after {len(rec.leases)}")
        rec.leases.append(lease)
        rec.worker = worker
        rec.started_at = None
        rec.exit_code = rec.signal = None
        w.leases[lease.key] = lease
        self._drop_unleased(rec)
        self.st().set_started(task_id, True, at)
        return lease

    def on_checkpointed(self, task_id: str, epoch: int, at: int) -> None:
        """Its worker relayed a checkpoint at ``at`` (fleet.prepare_checkpoints checked the
        lease and the time): a preemption from now on loses only the work since."""
        rec = self.records.get(task_id)
        if rec is None or rec.state != "placed":
            return
        if rec.checkpoint_at is None or at > rec.checkpoint_at:
            rec.checkpoint_at = at
        self.st().checkpoint(task_id, at)

    def lost_work(self, task_id: str, size_milli: int, lost_ms: int) -> dict[str, Any]:
        """The fields of a ``preempted`` event that say what it cost (lending.md): the
        ledger keeps them per preemption."""
        rec = self.records.get(task_id)
        return {"size_milli": size_milli, "lost_ms": lost_ms,
                "lost_gpu_hours": unit_hours(size_milli * lost_ms),
                "checkpoint_at": rec.checkpoint_at if rec is not None else None}

    def lost_now(self, task_id: str, now: int) -> dict[str, Any]:
        """:meth:`lost_work` of a placed task the daemon itself requeues at ``now`` (its
        worker lost, a gang sent back): the engine's rule (``victims.lost_work``) before the
        reducer applies the preemption."""
        t = self.st().tasks.get(task_id)
        if t is None:
            return {}
        return self.lost_work(task_id, t.size, engine_lost_work(t, now))

    def on_started(self, task_id: str, epoch: int, at: int) -> None:
        rec = self.records.get(task_id)
        if rec is None:  # evicted: ended with every lease closed, nothing left to change
            return
        lease = rec.lease(epoch)
        if lease is not None and lease.started_at is None:
            lease.started_at = at
            if epoch == rec.epoch:
                rec.started_at = at

    def on_stopped(self, task_id: str, epoch: int, at: int, data: dict[str, Any]) -> None:
        """The process of a lease told to stop is gone."""
        rec = self.records.get(task_id)
        if rec is None:  # evicted: ended with every lease closed
            return
        lease = rec.lease(epoch)
        if lease is not None and lease.status in (ACTIVE, STOPPING):
            # a gang member that finished while the others still run (issue 15)
            member_done = lease.world > 1 and data.get("report") == "finished" \
                and data.get("reason") == GANG_MEMBER_DONE
            self._end_lease(lease, CLOSED, "finished" if member_done else "stopped")
        if epoch == rec.epoch:
            rec.exit_code, rec.signal = data.get("exit_code"), data.get("signal")

    def on_unleased(self, task_id: str, epoch: int, at: int) -> None:
        """A lease withdrawn before its worker took it (the answer never reached it): the
        task waits for a worker again, at the next epoch."""
        rec = self.records.get(task_id)
        if rec is None:  # evicted: ended with every lease closed
            return
        lease = rec.lease(epoch)
        if lease is not None and lease.status in (ACTIVE, STOPPING):
            was_active = lease.status == ACTIVE
            self._end_lease(lease, FENCED)
            if was_active and rec.state == "placed" and rec.pool is not None:
                self.unleased.setdefault(rec.pool, {})[task_id] = None
                rec.unleased_at = at
                self.st().set_started(task_id, False, at)
                if self.on_work is not None:
                    self.on_work(rec.pool)

    def on_worker_lost(self, worker: str, at: int) -> None:
        """Its leases are fenced; what happens to its tasks follows as their own events
        (``preempted`` with kind ``lost``, or ``ended`` the third time)."""
        w = self.workers.get(worker)
        if w is None:
            return
        w.lost_at = at
        for lease in list(w.leases.values()):
            self._end_lease(lease, FENCED)
        w.leases.clear()
        self._sync_pool(w.pool, at)

    def on_worker_deregistered(self, worker: str, at: int) -> None:
        """The worker left (``DELETE /workers/{id}``): its active leases are fenced (their
        tasks follow as ``preempted``/``ended`` events, as for a lost worker), the leases
        it was told to stop are closed (stopped anyway), and it is forgotten."""
        w = self.workers.pop(worker, None)
        if w is None:
            return
        for lease in list(w.leases.values()):
            self._end_lease(lease, FENCED if lease.status == ACTIVE else CLOSED,
                            None if lease.status == ACTIVE else "stopped")
        w.leases.clear()
        self._sync_pool(w.pool, at)

    def on_engine(self, enabled: bool, at: int) -> None:
        self.st().set_enabled(enabled, at)

    def on_alert(self, data: dict[str, Any], at: int, replay: bool) -> None:
        self.alerts.setdefault(data["policy"], []).append({**data, "at": at})
        if replay:
            # The engine raises each threshold once per period: tell it this one was.
            g = data.get("group") or self.idx().group_of_policy.get(data["policy"])
            if g is not None:
                self.st().note_alert(g, data["period_start"], data["threshold_milli"])

    # ------------------------------------------------------------------ the engine pass
    def run_pass(self, now: int) -> tuple[list[Event], list[DbOp], Counter[str]]:
        """One engine pass at ``now``: the State changes at once; the returned events and
        ledger writes are committed by the sequencer before any later change."""
        from kliqued.engine import run_pass
        idx, st = self.idx(), self.st()
        res = run_pass(idx, st, now)
        self.last_result = res
        self.passes += 1
        self.last_pass_at = now
        events: list[Event] = []
        ops: list[DbOp] = []
        opens: list[dict[str, Any]] = []
        closes: list[tuple[str, int, str]] = []
        lost_rows: list[ledger_lost.PreemptionRow] = []
        counts: Counter[str] = Counter()
        rev = idx.revision
        for d in res.decisions:
            if isinstance(d, Placement):
                rec = self.records[d.task]
                ev = Event("placed", d.task, "engine", rev, rec.group, rec.user,
                           {"pool": d.pool, "resource": d.resource, "size_milli": d.size_milli,
                            "phase": d.phase, "interval": None})
                reducers.apply(self, ev, now, decided=True)
                ev.data["interval"] = rec.interval_id  # the one this placement opened
                events.append(ev)
                t = st.tasks[d.task]
                opens.append(dict(
                    interval_id=rec.interval_id, task=rec.id, user=rec.user,
                    project=rec.project, group=rec.group, policy=rec.policy,
                    profile=rec.profile, resource=rec.resource, pool=d.pool,
                    gpu_type=self.gpu_type.get(d.pool, ""), gpus_milli=t.size,
                    weight_milli=t.weight, start_ms=now, revision=rev,
                    group_path=self.group_path.get(rec.group), channel=rec.channel))
                counts["placed"] += 1
            elif isinstance(d, Preemption):
                rec = self.records[d.task]
                interval = rec.interval_id
                ev = Event("preempted", d.task, "engine", rev, rec.group, rec.user,
                           {"pool": d.pool, "kind": d.kind, "text": d.text, "by": d.by,
                            "interval": interval,
                            **self.lost_work(d.task, d.size_milli, d.lost_ms)})
                reducers.apply(self, ev, now, decided=True)
                events.append(ev)
                closes.append((interval, now, d.text))
                if interval is not None:
                    lost_rows.append(self._preemption_row(rec, d, interval, now, rev))
                counts["preempted"] += 1
            elif isinstance(d, Cancellation):
                known = self.records.get(d.task)
                ev = Event("cancelled", d.task, "engine", rev, d.group,
                           known.user if known else None,
                           {"text": d.text, "by": "estate", "interval": None})
                reducers.apply(self, ev, now, decided=True)
                events.append(ev)
                counts["cancelled"] += 1
            elif isinstance(d, Alert):
                data = {"policy": d.policy, "group": d.group,
                        "threshold_milli": d.threshold_milli, "period_start": d.period_start,
                        "used_units": d.used_units, "budget_units": d.budget_units,
                        "text": d.text}
                ev = Event("alert", None, "engine", rev, d.group, None, data)
                reducers.apply(self, ev, now, decided=True)
                events.append(ev)
                counts["alerts"] += 1
        if opens:  # opened before closed: a task lent and reclaimed in one pass has both
            ops.append(ledger_ops.opens(ledger.IntervalRow(**f) for f in opens))
        if closes:
            ops.append(ledger_ops.closes(closes))
        if lost_rows:
            ops.append(ledger_ops.RecordPreemptions(tuple(lost_rows)))
        return events, ops, counts

    def _preemption_row(self, rec: TaskRecord, d: Preemption, interval: str, now: int,
                        rev: str) -> ledger_lost.PreemptionRow:
        """The ledger's row of an engine preemption (lending.md: task, group, user,
        project, reason, the group that took the GPUs back, its lost GPU-hours)."""
        return ledger_lost.PreemptionRow(
            interval_id=interval, task=rec.id, user=rec.user, project=rec.project,
            group=rec.group, group_path=self.group_path.get(rec.group), policy=rec.policy,
            pool=d.pool, gpu_type=self.gpu_type.get(d.pool, ""), gpus_milli=d.size_milli,
            at_ms=now, kind=d.kind, reason=d.text, taker=d.by,
            taker_path=None if d.by is None else self.group_path.get(d.by),
            lost_ms=d.lost_ms, revision=rev)

    # ------------------------------------------------------------------ requests
    def prepare_submit(self, p: Principal, f: dict[str, Any], key: str | None, now: int,
                       ov: Overlay, data_bytes: int | None = None) -> Prepared:
        if key is not None:
            existing = ov.keys.get((p.text, key)) or self.idem.get((p.text, key))
            if existing is not None:
                return Prepared(apply=lambda: (200, existing))
        if data_bytes is None:
            data_bytes = limits.task_bytes(f.get("command"), f.get("payload"))
        user = f["user"]
        held = self.stored[user] + ov.stored[user]
        if data_bytes and held + data_bytes > self.max_user_bytes:
            raise ApiError(429, "user-quota", f"{user}'s tasks not yet ended hold "
                           f"{limits.mib(held)} of commands and payloads; this one "
                           f"({limits.mib(data_bytes)}) would pass the limit of "
                           f"{limits.mib(self.max_user_bytes)} per user: wait for some to "
                           f"end, or cancel some",
                           {"held_bytes": held, "task_bytes": data_bytes,
                            "limit_bytes": self.max_user_bytes})
        idx = self.idx()
        try:
            check_submission(idx, f["resource"], f["user"], f.get("project"),
                             f.get("gpus_milli"), require_project=True)
        except SubmissionError as exc:
            raise ApiError(422, "submission-refused", str(exc), {"field": exc.field}) from None
        cr = idx.resources[f["resource"]]
        task_id = self.task_ids.next(now)
        data = {**f, "idempotency_key": key}
        ev = Event("submitted", task_id, p.text, idx.revision, cr.group, f["user"], data)
        if key is not None:
            ov.keys[(p.text, key)] = task_id
        ov.stored[user] += data_bytes

        def apply() -> tuple[int, str]:
            reducers.apply(self, ev, now)
            return 201, task_id
        return Prepared([ev], [], apply, wants_pass=True)

    def prepare_cancel(self, p: Principal, task_id: str, now: int, ov: Overlay,
                       reason: str | None = None, channel: str = "api") -> Prepared:
        """Cancels a task at ``p``'s request made through ``channel`` (recorded in the
        event, as a submission's is: the audit trail tells an agent's cancel from a
        person's). A task no longer in memory ended long ago (history.py): nothing to do,
        as for any ended task (the caller found it, in memory or in the history)."""
        rec = self.records.get(task_id)
        if rec is None or rec.state == "ended" or task_id in ov.ended:
            return Prepared(apply=lambda: task_id)
        ov.ended.add(task_id)
        placed = rec.state == "placed" and task_id not in ov.requeued
        interval = rec.interval_id if placed else None
        text = f"cancelled by {p.text}" + (f": {reason}" if reason else "")
        ev = Event("cancelled", task_id, p.text, self.idx().revision, rec.group, rec.user,
                   {"text": text, "by": "request",
                    "was": rec.state if placed or rec.state != "placed" else "queued",
                    "pool": rec.pool, "interval": interval, "channel": channel})
        ops: list[DbOp] = []
        if interval is not None:
            ops.append(ledger_ops.closes([(interval, now, "cancelled")]))

        def apply() -> str:
            reducers.apply(self, ev, now)
            return task_id
        return Prepared([ev], ops, apply, wants_pass=True)

    def prepare_engine(self, p: Principal, enabled: bool, now: int, ov: Overlay) -> Prepared:
        current = ov.enabled if ov.enabled is not None else self.st().enabled
        if current == enabled:
            return Prepared()
        ov.enabled = enabled
        ev = Event("engine_enabled" if enabled else "engine_disabled", None, p.text,
                   self.idx().revision)

        def apply() -> None:
            reducers.apply(self, ev, now)
        return Prepared([ev], [], apply, wants_pass=True)

    def prepare_estate(self, compiled: CompiledEstate, source: str | None, actor: str,
                       now: int, ov: Overlay, commit: str | None = None) -> Prepared:
        data: dict[str, Any] = {"source": source, "estate": compiled.model_dump(mode="json")}
        if commit is not None:
            data["commit"] = commit
        ev = Event("estate_applied", None, actor, compiled.revision, None, None, data)
        ops: list[DbOp] = [ledger_ops.ReplacePrices(compiled),
                           ledger_ops.RecordEstate(compiled, now)]

        def apply() -> str:
            # What the ``estate_applied`` reducer does, minus reading the estate back from
            # its JSON: the compiled estate is at hand.
            self.on_estate(compiled, source, now, commit)
            return compiled.revision
        return Prepared([ev], ops, apply, wants_pass=True)

    def prepare_refused(self, refused: dict[str, Any], now: int, ov: Overlay) -> Prepared:
        """An estate revision that does not compile: logged, shown by GET /v1/estate, while
        the running revision keeps running."""
        ev = Event("estate_refused", None, "kliqued", self.estate.revision, None, None,
                   refused)

        def apply() -> None:
            reducers.apply(self, ev, now)
        return Prepared([ev], [], apply)

    def prepare_token(self, p: Principal | None, principal: str, name: str | None,
                      now: int, ov: Overlay, secret: str | None = None,
                      expires_at: int | None = None,
                      rotated_from: str | None = None) -> Prepared:
        """A new token for ``principal``; ``secret`` is given only for KLIQUE_ADMIN_TOKEN.
        Only its keyed hash is stored (ids.TokenHasher)."""
        token = secret or new_token()
        tid = self.token_ids.next(now)
        rec = TokenRecord(tid, self.tokens.hash(token), principal, name, now,
                          p.text if p else "kliqued", expires_at=expires_at)
        data: dict[str, Any] = {"id": tid, "principal": principal, "name": name}
        if expires_at is not None:
            data["expires_at"] = expires_at
        if rotated_from is not None:
            data["rotated_from"] = rotated_from
        ev = Event("token_created", None, rec.created_by, None, None, None, data)

        op = TokenInsert(rec.id, rec.hash, rec.principal, rec.name, rec.created_at,
                         rec.created_by, rec.expires_at)

        def apply() -> tuple[TokenRecord, str]:
            self.tokens.add(rec)
            return rec, token
        return Prepared([ev], [op], apply)

    def prepare_revoke(self, p: Principal, token_id: str, now: int, ov: Overlay) -> Prepared:
        rec = self.tokens.by_id.get(token_id)
        if rec is None:
            raise not_found(f"no token {excerpt(token_id, quoted=False)}")
        if rec.revoked_at is not None or token_id in ov.revoked:
            return Prepared()
        ov.revoked.add(token_id)
        ev = Event("token_revoked", None, p.text, None, None, None, {"id": token_id})

        op = TokenUpdate(token_id, "revoked_at_ms", now)

        def apply() -> None:
            rec.revoked_at = now
        return Prepared([ev], [op], apply)

    def prepare_rotate(self, p: Principal, token_id: str, grace_ms: int,
                       expires_at: int | None, now: int, ov: Overlay) -> Prepared:
        """A new secret for the principal of ``token_id`` (same name; the same lifetime
        unless ``expires_at`` is given), and the old token ends: now, or after
        ``grace_ms`` (so the holders can switch without a gap)."""
        old = self.tokens.by_id.get(token_id)
        if old is None:
            raise not_found(f"no token {excerpt(token_id, quoted=False)}")
        why = old.refusal(now)
        if why is not None or token_id in ov.revoked:
            raise ApiError(409, "conflict", f"{why or f'token {token_id} was revoked'}: "
                           f"create a new token instead (kliqued token create)")
        ov.revoked.add(token_id)
        if expires_at is None and old.expires_at is not None:
            expires_at = now + (old.expires_at - old.created_at)
        created = self.prepare_token(p, old.principal, old.name, now, ov,
                                     expires_at=expires_at, rotated_from=token_id)
        new_id = created.events[0].data["id"]
        end = now + grace_ms
        if old.expires_at is not None:
            end = min(end, old.expires_at)
        ev = Event("token_rotated", None, p.text, None, None, None,
                   {"id": token_id, "to": new_id, "old_ends_at": end})

        op = (TokenUpdate(token_id, "expires_at_ms", end) if grace_ms > 0
              else TokenUpdate(token_id, "revoked_at_ms", now))

        def apply() -> tuple[TokenRecord, str, TokenRecord]:
            if grace_ms > 0:
                old.expires_at = end
            else:
                old.revoked_at = now
            rec, token = created.apply()
            return rec, token, old
        return Prepared(created.events + [ev], created.ops + [op], apply)
