"""One dispatch table: each event kind to the function that applies it to the ``Daemon``.

The live path (once its event is committed) and replay apply every event through
``apply``, like Nomad's FSM (typed log entries, one switch): what a restart rebuilds is what
the live daemon had, and a kind in ``events.KINDS`` without a reducer fails the tests, not a
restart. A reducer applies an engine decision (``State.place``, ``State.preempt``, ...)
rather than re-deciding it; ``decided``: the engine pass that made the decision has applied
it to its State already (live only), so the reducer keeps the Daemon's records alone.
"""

from __future__ import annotations

from typing import Any, Callable

from compiler.compiled import CompiledEstate

from kliqued.daemon import events as E
from kliqued.daemon.state.channel_state import Run
from kliqued.daemon.events import Event
from kliqued.daemon.state.core import DaemonState


Reducer = Callable[[DaemonState, Event, Any, int, bool], Any]


def _estate_applied(d: DaemonState, ev: Event, p: E.EstateApplied, at: int, decided: bool) -> Any:
    d.on_estate(CompiledEstate.model_validate(p.estate), p.source, at, p.commit)


def _estate_refused(d: DaemonState, ev: Event, p: E.EstateRefused, at: int, decided: bool) -> Any:
    d.estate.refused = {**p.to_data(), "at": at}


def _submitted(d: DaemonState, ev: Event, p: E.Submitted, at: int, decided: bool) -> Any:
    # The typed payload (``Submission.event`` wrote it): its fields refer to the stored data's
    # values, not copies of them.
    return d.on_submitted(_task(ev), at, ev.actor or "", ev.revision or "", p)


def _placed(d: DaemonState, ev: Event, p: E.Placed, at: int, decided: bool) -> Any:
    return d.on_placed(_task(ev), p.pool, at, replay=not decided)


def _preempted(d: DaemonState, ev: Event, p: E.Preempted, at: int, decided: bool) -> Any:
    return d.on_preempted(
        _task(ev), at, p.kind, p.text, replay=not decided, epoch=p.epoch, lost_ms=p.lost_ms
    )


def _task_checkpointed(
    d: DaemonState, ev: Event, p: E.TaskCheckpointed, at: int, decided: bool
) -> Any:
    d.on_checkpointed(_task(ev), p.epoch, p.at)


def _cancelled(d: DaemonState, ev: Event, p: E.Cancelled, at: int, decided: bool) -> Any:
    return d.on_ended(
        _task(ev), at, "cancelled", reason=p.text, by=ev.actor if p.by == "request" else p.by
    )


def _ended(d: DaemonState, ev: Event, p: E.Ended, at: int, decided: bool) -> Any:
    return d.on_ended(
        _task(ev),
        at,
        p.kind,
        p.reason,
        p.epoch,
        p.exit_code,
        p.signal,
        bool(p.lost),
        message=p.message,
        outputs=p.outputs,
        ran_until=p.ran_until,
    )


def _worker_registered(
    d: DaemonState, ev: Event, p: E.WorkerRegistered, at: int, decided: bool
) -> Any:
    return d.on_worker_registered(p.to_data(), at)


def _leased(d: DaemonState, ev: Event, p: E.Leased, at: int, decided: bool) -> Any:
    return d.on_leased(_task(ev), p.worker, p.epoch, at, p)


def _started(d: DaemonState, ev: Event, p: E.Started, at: int, decided: bool) -> Any:
    d.on_started(_task(ev), p.epoch, at)


def _stopped(d: DaemonState, ev: Event, p: E.Stopped, at: int, decided: bool) -> Any:
    d.on_stopped(_task(ev), p.epoch, at, p.to_data())


def _unleased(d: DaemonState, ev: Event, p: E.Unleased, at: int, decided: bool) -> Any:
    d.on_unleased(_task(ev), p.epoch, at)


def _worker_lost(d: DaemonState, ev: Event, p: E.WorkerLost, at: int, decided: bool) -> Any:
    d.on_worker_lost(p.worker, at)


def _worker_deregistered(
    d: DaemonState, ev: Event, p: E.WorkerDeregistered, at: int, decided: bool
) -> Any:
    d.on_worker_deregistered(p.worker, at)


def _engine(enabled: bool) -> Reducer:
    def reduce(d: DaemonState, ev: Event, p: Any, at: int, decided: bool) -> None:
        d.on_engine(enabled, at)

    return reduce


def _alert(d: DaemonState, ev: Event, p: E.AlertRaised, at: int, decided: bool) -> Any:
    d.on_alert(p.to_data(), at, replay=not decided)


def _schedule_created(
    d: DaemonState, ev: Event, p: E.ScheduleCreated, at: int, decided: bool
) -> Any:
    return d.schedules.on_created(p.to_data(), at)


def _schedule_changed(
    d: DaemonState, ev: Event, p: E.ScheduleChanged, at: int, decided: bool
) -> Any:
    d.schedules.on_changed(p.id, p.state, p.reason, at, p.cursor, p.token)


def _schedule_run(d: DaemonState, ev: Event, p: E.ScheduleRun, at: int, decided: bool) -> Any:
    d.schedules.on_run(
        p.id, Run(p.due, at, p.outcome, p.text, p.task, p.pipeline_id, p.missed, p.first_missed)
    )


def _pipeline_started(
    d: DaemonState, ev: Event, p: E.PipelineStarted, at: int, decided: bool
) -> Any:
    return d.pipelines.on_started(p.to_data(), at)


def _pipeline_step(d: DaemonState, ev: Event, p: E.PipelineStep, at: int, decided: bool) -> Any:
    d.pipelines.on_step(p.to_data())


def _pipeline_changed(
    d: DaemonState, ev: Event, p: E.PipelineChanged, at: int, decided: bool
) -> Any:
    d.pipelines.on_changed(p.id, p.state, p.text, p.token)


def _pipeline_ended(d: DaemonState, ev: Event, p: E.PipelineEnded, at: int, decided: bool) -> Any:
    d.pipelines.on_ended(p.id, p.state, p.text, at)


def _cloud_node_started(
    d: DaemonState, ev: Event, p: E.CloudNodeStarted, at: int, decided: bool
) -> Any:
    return d.cloud.on_started(p.to_data(), at)


def _cloud_node_ended(
    d: DaemonState, ev: Event, p: E.CloudNodeEnded, at: int, decided: bool
) -> Any:
    return d.cloud.on_ended(p.node, at, p.reason)


def _scaling_waits(d: DaemonState, ev: Event, p: E.ScalingWaits, at: int, decided: bool) -> Any:
    d.cloud.on_scaling(p.pool, p.to_data(), at)


def _spend_cap_reached(
    d: DaemonState, ev: Event, p: E.SpendCapReached, at: int, decided: bool
) -> Any:
    d.cloud.on_capped(p.pool, p.month)


def _audit_only(d: DaemonState, ev: Event, p: Any, at: int, decided: bool) -> Any:
    """The event is a record, not a change of the Daemon: token events (the tokens table is
    their state, loaded after the log), refused worker calls, and the alerts module's own
    records (``alerts.py`` reads them back from the log at start)."""


def _task(ev: Event) -> str:
    if ev.task is None:
        raise ValueError(f"a {ev.kind} event without its task")
    return ev.task


REDUCERS: dict[str, Reducer] = {
    "estate_applied": _estate_applied,
    "estate_refused": _estate_refused,
    "submitted": _submitted,
    "placed": _placed,
    "preempted": _preempted,
    "task_checkpointed": _task_checkpointed,
    "cancelled": _cancelled,
    "ended": _ended,
    "worker_registered": _worker_registered,
    "leased": _leased,
    "started": _started,
    "stopped": _stopped,
    "unleased": _unleased,
    "worker_lost": _worker_lost,
    "worker_deregistered": _worker_deregistered,
    "engine_enabled": _engine(True),
    "engine_disabled": _engine(False),
    "alert": _alert,
    "token_created": _audit_only,
    "token_revoked": _audit_only,
    "token_rotated": _audit_only,
    "worker_refused": _audit_only,
    "signed_in": _audit_only,
    "capacity_mismatch": _audit_only,
    "waiting_alert": _audit_only,
    "clock_step": _audit_only,
    "alert_delivery": _audit_only,
    "schedule_created": _schedule_created,
    "schedule_changed": _schedule_changed,
    "schedule_run": _schedule_run,
    "pipeline_started": _pipeline_started,
    "pipeline_step": _pipeline_step,
    "pipeline_changed": _pipeline_changed,
    "pipeline_ended": _pipeline_ended,
    "cloud_node_started": _cloud_node_started,
    "cloud_node_ended": _cloud_node_ended,
    "scaling_waits": _scaling_waits,
    "spend_cap_reached": _spend_cap_reached,
}


def apply(d: DaemonState, ev: Event, at: int, decided: bool = False) -> Any:
    """Applies one event (its kind registered in ``events.KINDS``); returns what its
    ``Daemon.on_*`` method returns (the task's record, the worker, the lease), for the
    live path's answer."""
    p = E.payload(ev)  # an unknown kind: ``UnknownKind`` naming it
    return REDUCERS[ev.kind](d, ev, p, at, decided)
