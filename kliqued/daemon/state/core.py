"""The daemon's live state: the engine's ``State`` and index, the task records, tokens and
idempotency keys, the books (workers, schedules, pipelines, cloud nodes, alerts), and for each
kind of event the one ``on_<kind>`` method that applies it.

The appliers are called through the dispatch table (``reducers.py``) by the live path and
by replay alike; this class never calls that table. What calls it, the changes prepared for
the sequencer (a request, an engine pass), is ``daemon.Daemon``, a subclass: the state below,
the event dispatch above it, the prepares above both (no import cycle: issue 27).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

from compiler.compiled import CIdle, CompiledEstate
from klique_util.excerpt import excerpt
from kliqued.engine import (
    EstateIndex,
    PassResult,
    Reason,
    State,
    no_worker_text,
    waiting_reason,
    waiting_reasons,
)
from klique_util.units import unit_hours
from kliqued.engine.victims import lost_work as engine_lost_work
from kliqued.ledger import writer as ledger


from kliqued.daemon import apps, events as E, limits
from kliqued.daemon.state import channels
from kliqued.daemon.auth import Access, TokenBook, TokenRecord
from kliqued.daemon.identity.mapping import signin_refusal
from kliqued.daemon.state.autoscalers import AutoscalerInfo
from kliqued.daemon.clock import Clock
from kliqued.daemon.state.cloud import CloudBook
from kliqued.daemon.errors import not_found
from kliqued.daemon.ids import IdMaker
from kliqued.daemon.leases import (
    ACTIVE,
    CLOSED,
    FENCED,
    GANG_MEMBER_DONE,
    RETURNED,
    STOP_REASON,
    STOPPING,
    Lease,
    WorkerInfo,
)
from kliqued.daemon.state.channel_state import PipelineBook, ScheduleBook
from kliqued.daemon.state.history import Eviction, Recalled
from kliqued.daemon.records import TaskRecord
from kliqued.daemon.units import iso


log = logging.getLogger(__name__)

PENDING = Reason("pending", "waits for the next pass")


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


class DaemonState:
    """Everything the events change; ``daemon.Daemon`` adds the changes it prepares."""

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
        self.tokens.still = self._signin_still
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

    def _signin_still(self, rec: TokenRecord) -> str | None:
        """A sign-in's token against the running estate (before one: nothing to say)."""
        if self.index is None or self.access is None:
            return None
        return signin_refusal(rec, self.index.estate, self.access)

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
                cached = self._reasons = (st.version, waiting_reasons(self.idx(), st, st.clock))
            return cached[1].get(rec.id)
        # With its position known the engine skips walking the queue to find it (O(n) in a
        # strict queue).
        return waiting_reason(self.idx(), st, rec.id, st.clock, position=st.position(rec.id))

    def autoscaler_live(self, pool: str) -> bool:
        """Whether ``pool``'s autoscaler runs (always, without ``require_workers``)."""
        if not self.require_workers:
            return True
        a = self.autoscalers.get(pool)
        return a is not None and not a.lost

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
                self.state.set_autoscaler_live(pool, self.autoscaler_live(pool), at)

    def start_reason(self, rec: TaskRecord) -> Reason | None:
        """Why a placed task has not started: no worker of its pool holds it yet."""
        pool = rec.pool
        if pool is None or rec.id not in self.unleased.get(pool, {}):
            return None
        if pool in self.st().no_worker:
            return Reason("worker", f"placed on {pool}, not started: {no_worker_text(pool)}")
        since = (
            rec.placed_at if rec.unleased_at is None else max(rec.placed_at or 0, rec.unleased_at)
        )
        live = self.live_workers(pool)
        app = apps.app_of(rec)
        if app is not None and live and not any(apps.can_start(w, rec) for w in live):
            return Reason("worker", apps.lacking(app, pool, live))
        if live and all(w.cannot_work for w in live):
            return Reason(
                "worker",
                f"placed on {pool}, not started: its workers cannot work "
                f"({'; '.join(f'{w.id}: {w.cannot_work}' for w in live)})",
            )
        return Reason(
            "worker", f"placed on {pool}, waiting for a worker to start it since {iso(since)}"
        )

    # ------------------------------------------------------------------ changes (live and replay)
    def on_estate(
        self, compiled: CompiledEstate, source: str | None, at: int, commit: str | None = None
    ) -> None:
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

    def on_submitted(
        self, task_id: str, at: int, actor: str, revision: str, sub: E.Submitted
    ) -> TaskRecord:
        """The task of a ``submitted`` event, read from its typed payload into the engine's
        ``State`` and the task's record."""
        st = self.st()
        # Checked against the estate when it was prepared, and the log replays in order.
        t = st.submit(
            task_id,
            sub.resource,
            sub.user,
            sub.project,
            sub.gpus_milli,
            at=at,
            checked=True,
        )
        cr = self.idx().resources[t.resource]
        rec = TaskRecord(
            task_id,
            t.resource,
            cr.policy,
            cr.profile,
            t.group,
            t.user,
            actor,
            t.project,
            sub.labels or {},
            sub.command,
            sub.payload,
            sub.gpus_milli,
            at,
            revision,
            sub.idempotency_key,
            channels.stored(sub.channel),
        )
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
        if (
            rec is not None
            and rec.state == "placed"
            and rec.id in self.unleased.get(rec.pool or "", {})
            and self.on_work is not None
            and rec.pool is not None
        ):
            self.on_work(rec.pool)  # a task waiting for its old attempt to stop may go now

    def on_preempted(
        self,
        task_id: str,
        at: int,
        kind: str,
        text: str,
        replay: bool,
        epoch: int | None = None,
        lost_ms: int | None = None,
    ) -> TaskRecord:
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
                self._end_lease(
                    lease,
                    FENCED if kind == "lost" else CLOSED,
                    None if kind == "lost" else "stopped",
                )
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

    def on_ended(
        self,
        task_id: str,
        at: int,
        kind: str,
        reason: str | None = None,
        epoch: int | None = None,
        exit_code: int | None = None,
        signal: str | None = None,
        lost: bool = False,
        by: str | None = None,
        message: str | None = None,
        outputs: dict[str, str] | None = None,
        ran_until: int | None = None,
    ) -> TaskRecord | None:
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
        w.apps = data.get("apps")
        w.registered_at = at
        if w.key_hash is None:  # the first registration with a key binds the id to it
            w.key_hash = data.get("key_hash")
        w.lost_at = None
        w.last_seen = self.mono()
        self._sync_pool(w.pool, at)
        if self.on_work is not None:
            self.on_work(w.pool)
        return w

    def on_leased(self, task_id: str, worker: str, epoch: int, at: int, p: Any = None) -> Lease:
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
        return {
            "size_milli": size_milli,
            "lost_ms": lost_ms,
            "lost_gpu_hours": unit_hours(size_milli * lost_ms),
            "checkpoint_at": rec.checkpoint_at if rec is not None else None,
        }

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
            member_done = (
                lease.world > 1
                and data.get("report") == "finished"
                and data.get("reason") == GANG_MEMBER_DONE
            )
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
            self._end_lease(
                lease,
                FENCED if lease.status == ACTIVE else CLOSED,
                None if lease.status == ACTIVE else "stopped",
            )
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
