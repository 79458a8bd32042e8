"""The daemon's live state and every change to it.

``Daemon`` holds the engine's ``State`` and index, the task records, queue positions, tokens
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

from compiler.compiled import CompiledEstate
from kliqued.engine import (Alert, Cancellation, EstateIndex, PassResult, Placement,
                            Preemption, Reason, State, SubmissionError,
                            check_submission, waiting_reason, waiting_reasons)

from kliqued.engine.reasons import _reason

from . import ledger_bridge
from .auth import Access, Principal, TokenBook, TokenRecord
from .errors import ApiError, not_found
from .events import Event
from .ids import IdMaker, new_token, token_hash
from .records import QueuePositions, TaskRecord
from .store import DbOp

log = logging.getLogger("kliqued")

PENDING = Reason("pending", "waits for the next pass")


class Clock:
    """Wall-clock ms that never go back (engine times must not)."""

    def __init__(self) -> None:
        self.last = 0

    def now(self) -> int:
        t = time.time_ns() // 1_000_000
        if t > self.last:
            self.last = t
        return self.last

    def at_least(self, t: int) -> None:
        if t > self.last:
            self.last = t


@dataclass
class Prepared:
    """A request's change, validated, waiting for its commit."""

    events: list[Event] = field(default_factory=list)
    ops: list[DbOp] = field(default_factory=list)
    apply: Callable[[], Any] = lambda: None
    """Runs after the commit; its return value answers the request."""
    wants_pass: bool = False


@dataclass
class Overlay:
    """What earlier requests of the same batch will change once applied: later ones are
    prepared against it (a retried key, a task cancelled twice, ...)."""

    keys: dict[tuple[str, str], str] = field(default_factory=dict)
    ended: set[str] = field(default_factory=set)
    enabled: bool | None = None
    revoked: set[str] = field(default_factory=set)


@dataclass
class EstateInfo:
    revision: str = ""
    applied_at: int | None = None
    source: str | None = None
    refused: dict[str, Any] | None = None


class Daemon:
    def __init__(self) -> None:
        self.clock = Clock()
        self.index: EstateIndex | None = None
        self.state: State | None = None
        self.access: Access | None = None
        self.gpu_type: dict[str, str] = {}
        self.records: dict[str, TaskRecord] = {}
        self.ids: list[str] = []
        """Task ids in submission order, which is id order: paging bisects it."""
        self.positions: dict[str, QueuePositions] = {}
        self.placed_count: Counter[str] = Counter()
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

    def record(self, task_id: str) -> TaskRecord:
        rec = self.records.get(task_id)
        if rec is None:
            raise not_found(f"no task {task_id}")
        return rec

    def position(self, rec: TaskRecord) -> int | None:
        if rec.state != "queued":
            return None
        t = self.st().tasks.get(rec.id)
        qp = self.positions.get(rec.resource)
        if t is None or qp is None:
            return None
        return qp.position(t.seq, t.ran_before)

    def reason(self, rec: TaskRecord, many: bool = False) -> Reason | None:
        """Why a queued task waits, computed by the engine from the current state (the last
        pass's view while nothing changed since). ``many``: every reason at once, cached
        until the state changes (listings). A task no pass has seen yet waits for the next
        pass."""
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
        t = st.tasks.get(rec.id)
        qp = self.positions.get(rec.resource)
        if t is None or qp is None:
            return waiting_reason(self.idx(), st, rec.id, st.clock)
        # With its position known the engine skips walking the queue to find it (O(n) in a
        # strict queue). Engine request: a public ``waiting_reason(..., position=)``.
        return _reason(self.idx(), st, t, st.clock, qp.position(t.seq, t.ran_before) - 1)

    # ------------------------------------------------------------------ changes (live and replay)
    def on_estate(self, compiled: CompiledEstate, source: str | None, at: int) -> None:
        index = EstateIndex.build(compiled)
        if self.state is None:
            self.state = State(index, at)
        else:
            for c in self.state.bind(index, at):
                rec = self.records.get(c.task)
                t = self.state.tasks.get(c.task)
                if rec is not None and t is not None:
                    qp = self.positions.get(rec.resource)
                    if qp is not None:
                        qp.left(t.seq, t.ran_before)
        self.index = index
        self.access = Access(compiled)
        self.gpu_type = {p.name: p.gpu_type for p in compiled.pools}
        self.estate = EstateInfo(compiled.revision, at, source, self.estate.refused)

    def on_submitted(self, task_id: str, at: int, actor: str, revision: str,
                     data: dict[str, Any]) -> TaskRecord:
        st = self.st()
        t = st.submit(task_id, data["resource"], data["user"], data.get("project"),
                      data.get("gpus_milli"), at=at)
        cr = self.idx().resources[t.resource]
        rec = TaskRecord(task_id, t.resource, cr.policy, cr.profile, t.group, t.user, actor,
                         t.project, data.get("labels") or {}, data.get("command"),
                         data.get("payload"), data.get("gpus_milli"), at, revision,
                         data.get("idempotency_key"))
        rec.submitted_pass = self.passes
        self.records[task_id] = rec
        self.ids.append(task_id)
        self.positions.setdefault(t.resource, QueuePositions()).queued(t.seq, False)
        if rec.idempotency_key is not None:
            self.idem[(actor, rec.idempotency_key)] = task_id
        return rec

    def on_placed(self, task_id: str, pool: str, at: int, replay: bool) -> TaskRecord:
        st = self.st()
        t = st.tasks[task_id]
        if replay:
            st.place(t, pool, at)
        rec = self.records[task_id]
        qp = self.positions.get(rec.resource)
        if qp is not None:
            qp.left(t.seq, t.ran_before)
        rec.state = "placed"
        rec.pool = pool
        rec.placed_at = at
        rec.intervals += 1
        self.placed_count[rec.resource] += 1
        return rec

    def on_preempted(self, task_id: str, at: int, kind: str, text: str,
                     replay: bool) -> TaskRecord:
        st = self.st()
        t = st.tasks[task_id]
        if replay:
            st.preempt(t, at, kind, text)
        rec = self.records[task_id]
        self.positions.setdefault(rec.resource, QueuePositions()).queued(t.seq, True)
        rec.state = "queued"
        rec.pool = None
        rec.placed_at = None
        rec.preemptions += 1
        rec.last_preemption = (kind, text, at)
        self.placed_count[rec.resource] -= 1
        return rec

    def on_ended(self, task_id: str, at: int, kind: str) -> TaskRecord | None:
        """Finished, failed or cancelled (by a request, or because the estate removed its
        compute resource: the engine already ended it then)."""
        rec = self.records.get(task_id)
        if rec is None or rec.state == "ended":
            return rec
        st = self.st()
        t = st.tasks.get(task_id)
        if t is not None:
            if rec.state == "queued":
                qp = self.positions.get(rec.resource)
                if qp is not None:
                    qp.left(t.seq, t.ran_before)
            st.end(task_id, at, kind)
            if st.pending_cancellations and any(c.task == task_id
                                                for c in st.pending_cancellations):
                st.pending_cancellations[:] = [c for c in st.pending_cancellations
                                               if c.task != task_id]
            st.forget(task_id)
        if rec.state == "placed":
            self.placed_count[rec.resource] -= 1
        rec.state = "ended"
        rec.end_reason = kind
        rec.ended_at = at
        return rec

    def on_engine(self, enabled: bool, at: int) -> None:
        self.st().set_enabled(enabled, at)

    def on_alert(self, data: dict[str, Any], at: int, replay: bool) -> None:
        self.alerts.setdefault(data["policy"], []).append({**data, "at": at})
        if replay:
            # The engine raises each threshold once per period; there is no State method to
            # say it was raised before (engine request: ``State.note_alert``), so replay
            # restores the pass's own record of it.
            st = self.st()
            g = data.get("group") or self.idx().group_of_policy.get(data["policy"])
            if g is not None:
                ps = data["period_start"]
                raised = st.alerts_raised.get(g)
                if raised is None or raised[0] != ps:
                    raised = st.alerts_raised[g] = (ps, set())
                raised[1].add(data["threshold_milli"])

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
        counts: Counter[str] = Counter()
        rev = idx.revision
        for d in res.decisions:
            if isinstance(d, Placement):
                rec = self.on_placed(d.task, d.pool, now, replay=False)
                t = st.tasks[d.task]
                events.append(Event("placed", d.task, "engine", rev, rec.group, rec.user,
                                    {"pool": d.pool, "resource": d.resource,
                                     "size_milli": d.size_milli, "phase": d.phase,
                                     "interval": rec.interval_id}))
                opens.append(dict(
                    interval_id=rec.interval_id, task=rec.id, user=rec.user,
                    project=rec.project, group=rec.group, policy=rec.policy,
                    profile=rec.profile, resource=rec.resource, pool=d.pool,
                    gpu_type=self.gpu_type.get(d.pool, ""), gpus_milli=t.size,
                    weight_milli=t.weight, start_ms=now, revision=rev))
                counts["placed"] += 1
            elif isinstance(d, Preemption):
                rec = self.records[d.task]
                interval = rec.interval_id
                self.on_preempted(d.task, now, d.kind, d.text, replay=False)
                events.append(Event("preempted", d.task, "engine", rev, rec.group, rec.user,
                                    {"pool": d.pool, "kind": d.kind, "text": d.text,
                                     "by": d.by, "interval": interval}))
                closes.append((interval, now, d.text))
                counts["preempted"] += 1
            elif isinstance(d, Cancellation):
                rec = self.records.get(d.task)
                self.on_ended(d.task, now, "cancelled")
                events.append(Event("cancelled", d.task, "engine", rev, d.group,
                                    rec.user if rec else None,
                                    {"text": d.text, "by": "estate", "interval": None}))
                counts["cancelled"] += 1
            elif isinstance(d, Alert):
                data = {"policy": d.policy, "group": d.group,
                        "threshold_milli": d.threshold_milli, "period_start": d.period_start,
                        "used_units": d.used_units, "budget_units": d.budget_units,
                        "text": d.text}
                self.on_alert(data, now, replay=False)
                events.append(Event("alert", None, "engine", rev, d.group, None, data))
                counts["alerts"] += 1
        op = ledger_bridge.intervals(opens, closes)
        if op is not None:
            ops.append(op)
        return events, ops, counts

    # ------------------------------------------------------------------ requests
    def prepare_submit(self, p: Principal, f: dict[str, Any], key: str | None, now: int,
                       ov: Overlay) -> Prepared:
        if key is not None:
            existing = ov.keys.get((p.text, key)) or self.idem.get((p.text, key))
            if existing is not None:
                return Prepared(apply=lambda: (200, existing))
        idx = self.idx()
        try:
            check_submission(idx, f["resource"], f["user"], f.get("project"),
                             f.get("gpus_milli"))
        except SubmissionError as exc:
            raise ApiError(422, "submission-refused", str(exc)) from None
        cr = idx.resources[f["resource"]]
        task_id = self.task_ids.next(now)
        data = {**f, "idempotency_key": key}
        ev = Event("submitted", task_id, p.text, idx.revision, cr.group, f["user"], data)
        if key is not None:
            ov.keys[(p.text, key)] = task_id

        def apply() -> tuple[int, str]:
            self.on_submitted(task_id, now, p.text, idx.revision, data)
            return 201, task_id
        return Prepared([ev], [], apply, wants_pass=True)

    def prepare_cancel(self, p: Principal, task_id: str, now: int, ov: Overlay) -> Prepared:
        rec = self.record(task_id)
        if rec.state == "ended" or task_id in ov.ended:
            return Prepared(apply=lambda: task_id)
        ov.ended.add(task_id)
        interval = rec.interval_id if rec.state == "placed" else None
        ev = Event("cancelled", task_id, p.text, self.idx().revision, rec.group, rec.user,
                   {"text": f"cancelled by {p.text}", "by": "request", "was": rec.state,
                    "pool": rec.pool, "interval": interval})
        ops = []
        if interval is not None:
            op = ledger_bridge.close_interval(interval, now, "cancelled")
            if op is not None:
                ops.append(op)

        def apply() -> str:
            self.on_ended(task_id, now, "cancelled")
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
            self.on_engine(enabled, now)
        return Prepared([ev], [], apply, wants_pass=True)

    def prepare_estate(self, compiled: CompiledEstate, source: str | None, actor: str,
                       now: int, ov: Overlay) -> Prepared:
        ev = Event("estate_applied", None, actor, compiled.revision, None, None,
                   {"source": source, "estate": compiled.model_dump(mode="json")})
        ops = []
        op = ledger_bridge.replace_prices(compiled)
        if op is not None:
            ops.append(op)

        def apply() -> str:
            self.on_estate(compiled, source, now)
            return compiled.revision
        return Prepared([ev], ops, apply, wants_pass=True)

    def prepare_token(self, p: Principal | None, principal: str, name: str | None,
                      now: int, ov: Overlay, secret: str | None = None) -> Prepared:
        """A new token for ``principal``; ``secret`` is given only for KLIQUE_ADMIN_TOKEN."""
        token = secret or new_token()
        tid = self.token_ids.next(now)
        rec = TokenRecord(tid, token_hash(token), principal, name, now,
                          p.text if p else "kliqued")
        ev = Event("token_created", None, rec.created_by, None, None, None,
                   {"id": tid, "principal": principal, "name": name})

        def op(conn: Any) -> None:
            conn.execute("INSERT INTO tokens VALUES (?, ?, ?, ?, ?, ?, NULL)",
                         [rec.id, rec.hash, rec.principal, rec.name, rec.created_at,
                          rec.created_by])

        def apply() -> tuple[TokenRecord, str]:
            self.tokens.add(rec)
            return rec, token
        return Prepared([ev], [op], apply)

    def prepare_revoke(self, p: Principal, token_id: str, now: int, ov: Overlay) -> Prepared:
        rec = self.tokens.by_id.get(token_id)
        if rec is None:
            raise not_found(f"no token {token_id}")
        if rec.revoked_at is not None or token_id in ov.revoked:
            return Prepared()
        ov.revoked.add(token_id)
        ev = Event("token_revoked", None, p.text, None, None, None, {"id": token_id})

        def op(conn: Any) -> None:
            conn.execute("UPDATE tokens SET revoked_at_ms = ? WHERE id = ?", [now, token_id])

        def apply() -> None:
            rec.revoked_at = now
        return Prepared([ev], [op], apply)
