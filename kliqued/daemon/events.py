"""Event log records: what happened, in the order it happened.

Kinds (``data`` fields in brackets):
- ``estate_applied`` [source, estate: the compiled estate's JSON]
- ``submitted`` [resource, user, project, gpus_milli, command, payload, labels,
  idempotency_key, channel] (``actor`` is the principal that sent it, ``usr`` the task's
  user, ``channel`` how: channels.py; missing in logs from before it: ``api``; written from
  a ``state.submission.Submission``, read back typed into the task's record)
- ``placed`` [pool, resource, size_milli, phase, interval]
- ``preempted`` [pool, kind, text, by, interval; size_milli, lost_ms, lost_gpu_hours and
  checkpoint_at: lending.md's lost work, from the last checkpoint reported, else the
  placement]
- ``task_checkpointed`` [worker, epoch, at, reported, clamped] (the task's worker relayed a
  checkpoint, fenced by the lease's epoch: lost work counts from ``at``, the daemon's time)
- ``cancelled`` [text, by: request|estate, interval|null; a request's channel]
- ``ended`` [kind: finished|failed, epoch, worker, exit_code, signal, message, interval;
  reason and lost for a task lost the third time] (a worker's report)
- ``worker_registered`` [worker, pool, hostname, executor, gpus, version, key_hash, apps?] (the
  keyed hash of the worker's key, which binds the id to that worker: never shown by the API)
- ``leased`` [worker, epoch, pool, size_milli; a gang's rank, world, master_addr,
  master_port, or nodes when one worker spreads it] / ``started`` [worker, epoch, ...] /
  ``stopped`` [worker, epoch, report, reason, exit_code, signal] / ``unleased`` [worker,
  epoch] (a lease its worker never took)
- ``worker_lost`` [worker, pool, tasks] (then each task's ``preempted`` with kind ``lost``)
- ``worker_deregistered`` [worker, pool, tasks] (``DELETE /workers/{id}``; then each
  active lease's task ``preempted`` with kind ``lost``)
- a ``preempted`` with kind ``returned`` is a task its worker handed back on a clean
  shutdown (a ``stopped`` report with ``reason: "shutdown"``): not counted as a loss; an
  ``ended`` with kind ``stopped`` and ``reason: "stopped: idle (cpu 30m)"`` is a session
  the worker stopped for an idle limit
- ``engine_disabled`` / ``engine_enabled``
- ``alert`` [policy, threshold_milli, period_start, used_units, budget_units, text]
- ``token_created`` [id, principal, name, expires_at?, rotated_from?] / ``token_revoked``
  [id] / ``token_rotated`` [id, to, old_ends_at] (the old token ends then: at once, or after
  the rotation's grace)
- ``signed_in`` [provider, subject, principal, person?, via, token?] (a person or a CI job
  proved who they are with a token of a provider the estate trusts, issue 30: ``via`` is
  ``bearer`` (its first request with that token), ``signin`` (``POST /v1/signin``: a Klique
  token ``token`` made for it) or ``dashboard``; never the provider's token itself)
- ``capacity_mismatch`` [worker, pool, mismatches] (a registering worker's GPUs disagree
  with what its pool declares, issue 15; the engine still counts the declared capacity)
- ``worker_refused`` [call, worker, holder?, reason] (a worker call that did not prove the
  identity it claims: another worker's id, lease or key; refused with 403)
- ``estate_refused`` [revision, commit, source, errors] (GitOps reload)
- ``waiting_alert`` [resource, task, user, waited_s, reason?] / ``alert_delivery`` [alert, channel,
  key, attempt, status, error?] (alerts.py: a queue's head waited too long; one delivery
  attempt of an alert to a channel)
- ``schedule_created`` [id, owner, token?, cron, timezone, resource, command, ...,
  pipeline, concurrency, missed, deadline_s] / ``schedule_changed`` [id, state, reason,
  cursor?, token?] (``token``: the schedule is bound to that token from now on: a resume by
  its owner, a rotation) / ``schedule_run`` [id, due, outcome, task?, pipeline_id?, missed]
  (committed with the submission it makes) / ``pipeline_started`` [id, owner, token?, name,
  file, text, params, project?, schedule?] / ``pipeline_step`` [id, step, state, task?, attempt?,
  text, outputs?] / ``pipeline_changed`` [id, state: paused|running, text, token?] (its
  token ended; resumed, or rebound by a rotation) / ``pipeline_ended`` [id, state, text]
  (docs/channels.md, "The token a schedule runs on")
- ``cloud_node_started`` [node, pool, provider, instance_type, lifecycle, gpus, per_hour,
  currency] / ``cloud_node_ended`` [node, pool, reason] (an autoscaler's node; its interval
  is in the ledger's ``cloud_nodes``: cloud.py) / ``scaling_waits`` [pool, cause: spend_cap|
  capacity|error|null, reason, waiting] (why placed work waits for a node; null: it no longer
  does) / ``spend_cap_reached`` [pool, month, spent, spend_cap, currency, waiting, reason]
  (an alert: the month's first wait on the cap)
- ``waiting_alert`` [resource, task, user, waited_s] (a queue's head waited past
  ``settings.alerts.waiting_after``) / ``clock_step`` [direction, step_ms, offset_ms,
  wall_ms] (the wall clock jumped against the monotonic clock: clock.py, an alert to IT) /
  ``alert_delivery`` [alert: the alert event's seq,
  channel, key, attempt, status: failed|delivered|given_up, error?] (docs/alerts.md)

``grp`` and ``usr`` are columns (not only data) so the audit log can be filtered to what a
user may see without parsing JSON.

Each kind's ``data`` has a frozen dataclass below (its ``Payload``), registered in ``KINDS``:
the one list of kinds, from which the dispatch table (``reducers.REDUCERS``, used live and
in replay) and the tests derive, so a kind written but not replayed cannot go unnoticed.
Keys a payload does not declare (audit-only details) are kept in its ``extra``, so a row
reads back unchanged; a declared key missing from an older row takes its default.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, TypeVar

from kliqued.daemon.errors import UnknownKind


@dataclass(slots=True)
class Event:
    kind: str
    task: str | None = None
    actor: str | None = None
    revision: str | None = None
    grp: str | None = None
    usr: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def row(self, seq: int, at_ms: int) -> tuple:
        return (
            seq,
            at_ms,
            self.kind,
            self.task,
            self.actor,
            self.revision,
            self.grp,
            self.usr,
            json.dumps(self.data, separators=(",", ":"), ensure_ascii=False),
        )


COLUMNS = ("seq", "at_ms", "kind", "task", "actor", "revision", "grp", "usr", "data")


# ---------------------------------------------------------------------- typed payloads


@dataclass(frozen=True, slots=True, kw_only=True)
class Payload:
    """The typed ``data`` of one event kind (subclasses name the kind in ``KIND``)."""

    KIND: ClassVar[str]
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> Payload:
        """Reads a stored ``data`` object: declared keys to fields (missing ones take their
        default; a missing required one is a ``TypeError`` naming it), the rest to ``extra``."""
        names = _NAMES[cls]
        if names.issuperset(data):  # the usual row: no undeclared key (replay's fast path)
            return cls(**data, extra={})
        known = {k: v for k, v in data.items() if k in names}
        return cls(**known, extra={k: v for k, v in data.items() if k not in names})

    def to_data(self) -> dict[str, Any]:
        """The ``data`` object as stored: declared fields, then the extra keys."""
        out = {name: getattr(self, name) for name in data_fields(type(self))}
        out.update(self.extra)
        return out


def data_fields(cls: type[Payload]) -> tuple[str, ...]:
    """The ``data`` keys a payload class declares, in order (computed once per class:
    replay reads every event of the log through it)."""
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls) if f.name != "extra")
    return names


_FIELDS: dict[type[Payload], tuple[str, ...]] = {}
_NAMES: dict[type[Payload], frozenset[str]] = {}


KINDS: dict[str, type[Payload]] = {}
P = TypeVar("P", bound=type[Payload])


def registered(name: str) -> Callable[[P], P]:
    """Registers a payload class under its kind (one class per kind, one kind per class)."""

    def register(cls: P) -> P:
        if name in KINDS:
            raise ValueError(f"event kind {name!r} registered twice")
        cls.KIND = name
        KINDS[name] = cls
        _NAMES[cls] = frozenset(data_fields(cls))
        return cls

    return register


def payload(ev: Event) -> Payload:
    """The typed payload of a stored or written event."""
    cls = KINDS.get(ev.kind)
    if cls is None:
        raise UnknownKind(f"unknown event kind {ev.kind!r}")
    return cls.from_data(ev.data)


_frozen = dataclass(frozen=True, slots=True, kw_only=True)


@registered("estate_applied")
@_frozen
class EstateApplied(Payload):
    estate: dict[str, Any]
    source: str | None = None
    commit: str | None = None


@registered("estate_refused")
@_frozen
class EstateRefused(Payload):
    revision: str | None = None
    commit: str | None = None
    source: str | None = None
    errors: list[Any] = field(default_factory=list)


@registered("submitted")
@dataclass(frozen=True, slots=True, kw_only=True)  # spelled out: mypy sees its fields
class Submitted(Payload):
    resource: str
    user: str
    project: str | None = None
    gpus_milli: int | None = None
    command: Any = None
    payload: Any = None
    labels: dict[str, str] | None = None
    idempotency_key: str | None = None
    channel: str = "api"  # channels.py; a log from before channels replays as "api"


@registered("placed")
@_frozen
class Placed(Payload):
    pool: str
    resource: str | None = None
    size_milli: int | None = None
    phase: str | None = None
    interval: str | None = None


@registered("preempted")
@_frozen
class Preempted(Payload):
    kind: str
    text: str
    pool: str | None = None
    by: str | None = None
    interval: str | None = None
    epoch: int | None = None  # a worker's lease: lost or returned
    worker: str | None = None
    report: str | None = None
    message: str | None = None
    size_milli: int | None = None  # lending.md: what the preemption cost (None: older logs)
    lost_ms: int | None = None  # placed time since the last checkpoint (else the placement)
    lost_gpu_hours: float | None = None  # size x lost work, what the ledger keeps
    checkpoint_at: int | None = None  # the last checkpoint it counted from, or None


@registered("task_checkpointed")
@_frozen
class TaskCheckpointed(Payload):
    """A task's worker relayed a checkpoint (its ``$KLIQUE_CHECKPOINT_FILE`` got a new
    time) in a heartbeat listing the lease at its current epoch."""

    epoch: int
    at: int  # the daemon's time of the checkpoint (ms): the worker's, clamped to [placed, now]
    worker: str | None = None
    reported: str | None = None  # the worker's own reading (RFC 3339), as it sent it
    clamped: bool = False  # the worker's time was ahead of the daemon's: ``at`` is now


@registered("cancelled")
@_frozen
class Cancelled(Payload):
    text: str | None = None
    by: str | None = None  # "request" (the actor) or "estate"
    interval: str | None = None
    was: str | None = None  # a request's: the task's state then
    pool: str | None = None
    channel: str | None = None  # a request's: the channel it came through (channels.py)


@registered("ended")
@_frozen
class Ended(Payload):
    kind: str
    epoch: int | None = None
    worker: str | None = None
    exit_code: int | None = None
    signal: str | None = None
    message: str | None = None
    reason: str | None = None
    lost: bool = False
    interval: str | None = None
    pool: str | None = None
    report: str | None = None
    at: Any = None  # the worker's clock (RFC 3339 from klique-worker)
    ran_until: int | None = None  # the end charged, on the control plane's clock (ends.py)
    after_stop: bool = False  # finished before the stop reached it
    outputs: dict[str, str] | None = None  # KEY=VALUE lines from $KLIQUE_OUTPUTS


@registered("worker_registered")
@_frozen
class WorkerRegistered(Payload):
    worker_id: str
    pool: str
    worker: str | None = None
    hostname: str | None = None
    executor: str | None = None
    gpus: list[Any] = field(default_factory=list)
    version: str | None = None
    key_hash: str | None = None
    apps: list[str] | None = None  # the session apps it can start; None: it did not say


@registered("capacity_mismatch")
@_frozen
class CapacityMismatch(Payload):
    worker: str
    pool: str
    mismatches: list[str] = field(default_factory=list)


@registered("leased")
@_frozen
class Leased(Payload):
    worker: str
    epoch: int
    pool: str | None = None
    size_milli: int | None = None  # this lease's share (a gang member's: its node's)
    rank: int = 0  # a gang member (issue 15): its rank among ``world``
    world: int = 1
    master_addr: str | None = None
    master_port: int | None = None
    nodes: int = 1  # a whole gang leased to one worker that spreads it (Slurm, Kubernetes)


@registered("started")
@_frozen
class Started(Payload):
    epoch: int
    worker: str | None = None
    exit_code: int | None = None
    signal: str | None = None
    message: str | None = None
    at: int | None = None  # the worker's clock


@registered("stopped")
@_frozen
class Stopped(Payload):
    epoch: int
    worker: str | None = None
    exit_code: int | None = None
    signal: str | None = None
    message: str | None = None
    at: int | None = None  # the worker's clock
    report: str | None = None
    reason: str | None = None


@registered("unleased")
@_frozen
class Unleased(Payload):
    epoch: int
    worker: str | None = None
    text: str | None = None


@registered("worker_lost")
@_frozen
class WorkerLost(Payload):
    worker: str
    pool: str | None = None
    tasks: list[dict[str, Any]] = field(default_factory=list)  # {task, epoch, status}
    ttl_s: float | None = None


@registered("worker_deregistered")
@_frozen
class WorkerDeregistered(Payload):
    worker: str
    pool: str | None = None
    tasks: list[dict[str, Any]] = field(default_factory=list)  # {task, epoch, status}


@registered("engine_enabled")
@_frozen
class EngineEnabled(Payload):
    pass


@registered("engine_disabled")
@_frozen
class EngineDisabled(Payload):
    pass


@registered("alert")
@_frozen
class AlertRaised(Payload):
    policy: str
    group: str | None = None
    threshold_milli: int
    period_start: int
    used_units: int | None = None
    budget_units: int | None = None
    text: str | None = None


@registered("token_created")
@_frozen
class TokenCreated(Payload):
    id: str
    principal: str | None = None
    name: str | None = None


@registered("token_revoked")
@_frozen
class TokenRevoked(Payload):
    id: str


@registered("token_rotated")
@_frozen
class TokenRotated(Payload):
    id: str
    to: str | None = None
    old_ends_at: int | None = None


@registered("signed_in")
@_frozen
class SignedIn(Payload):
    provider: str
    subject: str
    principal: str
    person: str | None = None
    via: str | None = None
    token: str | None = None


@registered("worker_refused")
@_frozen
class WorkerRefused(Payload):
    reason: str | None = None


@registered("waiting_alert")
@_frozen
class WaitingAlert(Payload):
    resource: str | None = None  # the queue whose head waited past ``waiting_after``
    task: str | None = None
    user: str | None = None
    waited_s: int | None = None
    reason: str | None = None  # why it waits, as status said when the alert was raised


@registered("clock_step")
@_frozen
class ClockStepped(Payload):
    direction: str | None = None  # forward or backward
    step_ms: int | None = None  # how far the wall clock jumped (> 0 forward)
    offset_ms: int | None = None  # wall clock minus the daemon's time after it
    wall_ms: int | None = None  # the wall clock's reading at the look that saw it


@registered("alert_delivery")
@_frozen
class AlertDelivery(Payload):
    alert: int | None = None  # the seq of the alert delivered
    channel: str | None = None
    key: str | None = None
    attempt: int | None = None
    status: str | None = None  # delivered, given_up, or a retry's
    error: str | None = None


# ---------------------------------------------------------------- schedules and pipelines
# (kliqued/daemon/state/schedules.py, pipelines.py; docs/channels.md)


@registered("schedule_created")
@_frozen
class ScheduleCreated(Payload):
    id: str
    owner: str
    token: str | None = None  # the id of the token that made it (never the secret)
    cron: str
    timezone: str = "UTC"
    resource: str | None = None
    command: list[str] | None = None
    project: str | None = None
    gpus_milli: int | None = None
    labels: dict[str, str] | None = None
    pipeline: dict[str, Any] | None = None  # {file, text, params, project?}: a pipeline per run
    concurrency: str = "allow"
    missed: str = "run-once"
    deadline_s: int | None = None
    name: str | None = None
    cursor: int | None = None  # due times after this count (the request's clock)


@registered("schedule_changed")
@_frozen
class ScheduleChanged(Payload):
    id: str
    state: str  # active (resumed), paused, deleted, stopped
    reason: str | None = None
    cursor: int | None = None  # resumed: due times after this count
    token: str | None = None  # bound to this token from now on (resumed by the owner)


@registered("schedule_run")
@_frozen
class ScheduleRun(Payload):
    """Recorded in the same commit as the submission it makes (the task's ``submitted``
    or the pipeline's ``pipeline_started``): after a crash the run is in the log with its
    task, or neither is, so a restart never runs a due time twice."""

    id: str
    due: int  # the due time (ms) dealt with: the schedule's cursor after this event
    outcome: str  # submitted, skipped, missed, failed
    text: str | None = None
    task: str | None = None
    pipeline_id: str | None = None
    missed: int = 0
    first_missed: int | None = None


@registered("pipeline_started")
@_frozen
class PipelineStarted(Payload):
    id: str
    owner: str
    token: str | None = None  # the token its steps are sent on (its schedule's, if any)
    name: str
    file: str
    text: str
    params: dict[str, str] = field(default_factory=dict)
    project: str | None = None  # the run's project, for the steps naming none
    schedule: str | None = None


@registered("pipeline_step")
@_frozen
class PipelineStep(Payload):
    id: str
    step: str
    state: str  # running (a task sent: ``task``, ``attempt``), succeeded, failed, ...
    task: str | None = None
    attempt: int | None = None
    text: str | None = None
    outputs: dict[str, str] | None = None


@registered("pipeline_changed")
@_frozen
class PipelineChanged(Payload):
    """Its token ended (``paused``: no further step is sent, those sent run on), or its
    owner resumed it (``running``, bound to ``token``), or a rotation rebound it."""

    id: str
    state: str  # paused, running
    text: str | None = None
    token: str | None = None


@registered("pipeline_ended")
@_frozen
class PipelineEnded(Payload):
    id: str
    state: str  # succeeded, failed, cancelled
    text: str | None = None


@registered("cloud_node_started")
@_frozen
class CloudNodeStarted(Payload):
    node: str
    pool: str
    provider: str
    instance_type: str
    lifecycle: str
    gpus: int
    per_hour: str
    currency: str | None = None


@registered("cloud_node_ended")
@_frozen
class CloudNodeEnded(Payload):
    node: str
    pool: str | None = None
    reason: str | None = None


@registered("scaling_waits")
@_frozen
class ScalingWaits(Payload):
    pool: str
    cause: str | None = None
    reason: str | None = None
    waiting: int | None = None


@registered("spend_cap_reached")
@_frozen
class SpendCapReached(Payload):
    pool: str
    month: str
    spent: str | None = None
    spend_cap: str | None = None
    currency: str | None = None
    waiting: int | None = None
    reason: str | None = None
