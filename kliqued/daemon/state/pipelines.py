"""Pipelines in the daemon: a run of a pipeline file, its steps' tasks, and how it stands.

The file is read and checked by ``kliqued.schedule.pipeline`` (pure) when the run starts;
every step's compute resource is checked for the owner then, so a step the owner may not use
refuses the whole run and nothing is submitted. The run's state is in the event log
(``pipeline_started``, ``pipeline_step``, ``pipeline_ended``; a step's task is submitted in
the same commit as the ``pipeline_step`` naming it, with the idempotency key
``pipeline:<id>:<step>:<attempt>``), so a restart rebuilds it and the loop
(``unattended.py``) carries on where it was: a step whose dependencies finished is sent,
never twice.

A run records the token it was started with (its schedule's, for a scheduled run). When that
token stops working, the run is paused (``pipeline_changed``): the steps already sent run to
their end, no further step is sent, and its owner resumes it with a live token of theirs,
which binds it to that token (binding.py; docs/decisions.md, "Schedules outlive no token").
"""

from __future__ import annotations

from typing import Any, Mapping

from kliqued.schedule import pipeline as P

from kliqued.daemon.state import pipeline_cache, reducers, submission
from kliqued.daemon.auth import Principal
from kliqued.daemon.state.channel_state import PipelineRun
from kliqued.daemon.state.as_owner import prepare_as_owner, sent
from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.state.prepared import Overlay, Prepared, merged
from kliqued.daemon.errors import ApiError
from kliqued.daemon.events import Event
from kliqued.daemon.records import TaskRecord
from kliqued.daemon.units import iso
from kliqued.daemon.records import end_text, state as task_state


MAX_RUNNING_PER_OWNER = 100
"""Pipelines a user may have running at once (each holds its file and its steps' state)."""


def _changed(d: Daemon, pr: PipelineRun, data: dict[str, Any], actor: str = "kliqued") -> Event:
    """A ``pipeline_changed`` event of ``pr`` (filed under its owner) with ``data``, by
    ``actor``: the daemon itself unless a caller changes it. Every change of a pipeline's
    state or token is one, made here."""
    return Event("pipeline_changed", None, actor, d.idx().revision, None, pr.owner, data)


def submittable(d: Daemon, user: str) -> list[str]:
    """The compute resources ``user`` may send work to (``submission.submittable``)."""
    return submission.submittable(d.idx(), user)


def load_for(spec: dict[str, Any]) -> P.Loaded:
    """A stored pipeline (``{file, text, params}``), parsed only if no one holds its parsed
    form (``pipeline_cache``); a 422 naming each problem (at most ``P.MAX_ERRORS``)."""
    return pipeline_cache.load(spec)


def check_access(d: Daemon, owner: str, loaded: P.Loaded, file: str) -> None:
    """Every step's compute resource, for ``owner``, now: a 422 naming the step (and what
    the owner may use) before anything is submitted."""
    errors = []
    fields: list[str] = []
    idx = d.idx()
    for s in loaded.spec.steps:  # the one check of a submission, each step's
        exc = submission.refusal(idx, s.resource, owner, loaded.project_of(s), s.gpus_milli)
        if exc is not None:
            errors.append(
                f"{file}: step {s.name}: {submission.with_options(idx, owner, s.resource, exc)}"
            )
            fields.append(exc.field)
    if errors:
        raise ApiError(
            422, "submission-refused", "; ".join(errors), {"errors": errors, "field": fields[0]}
        )


def visible(d: Daemon, p: Principal, pr: PipelineRun) -> bool:
    if p.is_admin:
        return True
    if not p.is_user:
        return False
    acc = d.acc()
    return pr.owner == p.name or bool(acc.groups_of(pr.owner) & acc.admin_of(p.name))


def step_tasks(pr: PipelineRun) -> list[str]:
    """Each step's latest task (a handler reads the evicted ones back first: :func:`view`'s
    ``known``)."""
    return [run.tasks[-1] for run in pr.steps.values() if run.tasks]


def view(
    d: Daemon, pr: PipelineRun, known: Mapping[str, TaskRecord] | None = None
) -> dict[str, Any]:
    """``known``: its steps' tasks that left memory, read back (``history.recall_all``): an
    ended pipeline's steps still say how their tasks ended."""
    steps = []
    for s in pr.loaded.spec.steps:
        run = pr.steps[s.name]
        task = run.tasks[-1] if run.tasks else None
        rec = (d.find(task) or (known or {}).get(task)) if task else None
        steps.append(
            {
                "name": s.name,
                "resource": s.resource,
                "needs": s.needs,
                "state": run.state,
                "text": run.text,
                "attempts": len(run.tasks),
                "task": task,
                "tasks": list(run.tasks),
                "task_state": None
                if rec is None
                else (task_state(rec) if rec.state != "ended" else end_text(rec)),
                "outputs": run.outputs,
            }
        )
    return {
        "id": pr.id,
        "name": pr.name,
        "owner": pr.owner,
        "file": pr.file,
        "params": pr.params,
        "on_failure": pr.loaded.spec.on_failure,
        "schedule": pr.schedule,
        "state": pr.state,
        "token": pr.token,
        "text": pr.reason if pr.state == "paused" else pr.text_end,
        "started_at": iso(pr.started_at),
        "ended_at": iso(pr.ended_at),
        "steps": steps,
    }


# ---------------------------------------------------------------------- changes


def prepare_start(
    d: Daemon,
    p: Principal,
    spec: dict[str, Any],
    now: int,
    ov: Overlay,
    schedule: str | None = None,
    loaded: P.Loaded | None = None,
) -> Prepared:
    """A new run of the pipeline ``spec`` ({file, text, params, project}) by user ``p``: loaded,
    every step checked for the user, then ``pipeline_started``; the loop sends the first
    steps. ``loaded``: the file already parsed (by the handler, off the event loop, or the
    schedule's), so that preparing in the sequencer reads no file."""
    if schedule is None:
        d.tokens.require_booked(p, "a pipeline")
    if loaded is None:
        loaded = load_for(spec)
    file = spec.get("file") or "pipeline.yaml"
    check_access(d, p.name, loaded, file)
    running = sum(r.owner == p.name for r in d.pipelines.unended())
    running += ov.made[("pipeline", p.name)]
    if running >= MAX_RUNNING_PER_OWNER:
        raise ApiError(
            429,
            "user-quota",
            f"{p.name} has {running} pipelines running, the "
            f"most a user may: wait for some to end, or cancel some",
            {"running": running, "limit": MAX_RUNNING_PER_OWNER},
        )
    ov.made[("pipeline", p.name)] += 1
    pid = d.pipelines.ids.next(now)
    ev = Event(
        "pipeline_started",
        None,
        p.text,
        d.idx().revision,
        None,
        p.name,
        {
            "id": pid,
            "owner": p.name,
            "token": p.token_id,
            "name": loaded.spec.pipeline,
            "file": file,
            "text": loaded.parsed.text,
            "params": loaded.params,
            "project": loaded.project,
            "schedule": schedule,
        },
    )

    def apply() -> str:
        reducers.apply(d, ev, now)
        return pid

    return Prepared([ev], [], apply, wants_pass=False)


def task_ends(d: Daemon, pr: PipelineRun) -> dict[str, P.TaskEnd]:
    """How the steps' latest tasks ended (those still going are absent)."""
    out: dict[str, P.TaskEnd] = {}
    for run in pr.steps.values():
        if not run.tasks:
            continue
        rec = d.records.get(run.tasks[-1])
        if rec is None or rec.state != "ended":
            continue
        ok = rec.end_reason == "finished"
        out[rec.id] = P.TaskEnd(ok, end_text(rec), rec.outputs if ok else None)
    return out


def pending(d: Daemon, pr: PipelineRun) -> bool:
    """Whether the pipeline has something to do now (the loop's cheap look)."""
    actions, cancel = P.advance(pr.loaded.spec, pr.params, pr.steps, task_ends(d, pr))
    return bool(actions or cancel)


def prepare_advance(d: Daemon, pid: str, now: int, ov: Overlay, at: int | None = None) -> Prepared:
    """What the pipeline does now (``pipeline.advance``), as events: steps' new states,
    the tasks of the steps whose dependencies finished (submitted as the owner, each in the
    commit of its ``pipeline_step``), cancellations (fail-fast), and its end; or, if its
    token no longer works at ``at`` (the loop's clock; else ``now``), its pause alone."""
    pr = d.pipelines.items.get(pid)
    if pr is None or pr.state != "running":
        return Prepared()
    lapsed = prepare_lapsed(d, pid, now if at is None else at, now, ov)
    if lapsed.events:  # its token ended: paused, nothing more is sent
        return lapsed
    actions, cancel = P.advance(pr.loaded.spec, pr.params, pr.steps, task_ends(d, pr))
    if not actions and not cancel:
        return Prepared()
    rev = d.idx().revision
    owner = Principal("user", pr.owner)
    parts: list[Prepared] = []
    by_name = {s.name: s for s in pr.loaded.spec.steps}

    def own(kind: str, data: dict[str, Any], task: str | None = None) -> Prepared:
        ev = Event(kind, task, "kliqued", rev, None, pr.owner, {"id": pr.id, **data})
        return Prepared([ev], [], lambda: reducers.apply(d, ev, now))

    for running in cancel:
        parts.append(d.prepare_cancel(owner, running, now, ov, f"pipeline {pr.id} fails fast"))
    for a in actions:
        if isinstance(a, P.Submit):
            step = by_name[a.step]
            try:
                key = f"pipeline:{pr.id}:{a.step}:{a.attempt}"
                sub = prepare_as_owner(
                    d,
                    pr.owner,
                    "pipeline",
                    key,
                    now,
                    ov,
                    resource=step.resource,
                    project=pr.loaded.project_of(step),
                    gpus_milli=step.gpus_milli,
                    command=a.command,
                    labels={**step.labels, "klique.pipeline": pr.id, "klique.step": step.name},
                )
            except ApiError as exc:
                parts.append(
                    own(
                        "pipeline_step",
                        {
                            "step": a.step,
                            "state": P.FAILED,
                            "text": f"not submitted: {exc.message}",
                        },
                    )
                )
                continue
            tid = sent(d, pr.owner, sub, key, ov)
            parts.append(
                own(
                    "pipeline_step",
                    {
                        "step": a.step,
                        "state": P.RUNNING,
                        "task": tid,
                        "attempt": a.attempt,
                        "text": None,
                    },
                    tid,
                )
            )
            parts.append(sub)
        elif isinstance(a, P.Mark):
            parts.append(
                own(
                    "pipeline_step",
                    {"step": a.step, "state": a.state, "text": a.text, "outputs": a.outputs},
                )
            )
        else:
            parts.append(own("pipeline_ended", {"state": a.state, "text": a.text}))
    return merged(parts)


def prepare_cancel(
    d: Daemon, p: Principal, pid: str, now: int, ov: Overlay, reason: str | None = None
) -> Prepared:
    """Cancels its running steps' tasks, marks the rest cancelled, and ends it."""
    pr = d.pipelines.get(pid)
    if pr.state not in ("running", "paused"):
        return Prepared(apply=lambda: pid)
    rev = d.idx().revision
    text = f"cancelled by {p.text}" + (f": {reason}" if reason else "")
    parts: list[Prepared] = []
    evs: list[Event] = []
    for run in pr.steps.values():
        if run.state not in (P.WAITING, P.RUNNING):
            continue
        if run.tasks:
            rec = d.records.get(run.tasks[-1])
            if rec is not None and rec.state != "ended":
                parts.append(
                    d.prepare_cancel(p, rec.id, now, ov, reason or f"pipeline {pid} cancelled")
                )
        evs.append(
            Event(
                "pipeline_step",
                None,
                p.text,
                rev,
                None,
                pr.owner,
                {"id": pid, "step": run.name, "state": P.CANCELLED, "text": text},
            )
        )
    evs.append(
        Event(
            "pipeline_ended",
            None,
            p.text,
            rev,
            None,
            pr.owner,
            {"id": pid, "state": P.CANCELLED, "text": text},
        )
    )
    parts.append(Prepared(evs, [], lambda: [reducers.apply(d, e, now) for e in evs]))
    out = merged(parts)
    inner = out.apply

    def apply() -> str:
        inner()
        return pid

    out.apply = apply
    return out


def prepare_pause_for(d: Daemon, pid: str, why: str, now: int) -> Prepared:
    """Paused because the token it runs on ended (``why`` says which and when): its steps
    already sent run to their end, no further step is sent."""
    pr = d.pipelines.items[pid]
    ev = _changed(
        d,
        pr,
        {
            "id": pid,
            "state": "paused",
            "text": f"paused: {why}; no further step is sent until {pr.owner} resumes "
            f"it with a live token (kliqued pipeline resume {pid})",
        },
    )
    return Prepared([ev], [], lambda: reducers.apply(d, ev, now))


def prepare_lapsed(d: Daemon, pid: str, at: int, now: int, ov: Overlay) -> Prepared:
    """Paused if it is running and its token no longer works at ``at``, else nothing."""
    pr = d.pipelines.items.get(pid)
    if pr is None or pr.state != "running":
        return Prepared()
    why = d.tokens.ended(pr.token, at)
    return Prepared() if why is None else prepare_pause_for(d, pid, why, now)


def prepare_rebind(d: Daemon, pid: str, token: str, now: int) -> Prepared:
    """Bound to ``token`` (its token was rotated), its state unchanged."""
    pr = d.pipelines.items[pid]
    ev = _changed(d, pr, {"id": pid, "state": pr.state, "text": pr.reason, "token": token})
    return Prepared([ev], [], lambda: reducers.apply(d, ev, now))


def prepare_resume(d: Daemon, p: Principal, pid: str, now: int, ov: Overlay) -> Prepared:
    """Resumed by its owner, with the live token of this request, to which it is bound from
    now on; the loop then sends what is due (the ends of the steps that ran meanwhile
    included). Nobody else resumes it: a pipeline is paused only because the token it ran on
    ended, and it runs on its owner's own credential, never on another's."""
    d.tokens.require_booked(p, "a resumed pipeline")
    pr = d.pipelines.get(pid)
    if pr.state not in ("running", "paused"):
        raise ApiError(
            409,
            "conflict",
            f"pipeline {pid} has ended ({pr.state}): run the file again (kliqued pipeline run)",
        )
    if not (p.is_user and p.name == pr.owner and p.token_id is not None):
        if pr.state == "running":
            return Prepared(apply=lambda: pid)
        raise ApiError(
            409,
            "conflict",
            f"pipeline {pid} runs as {pr.owner}: only "
            f"{pr.owner} may resume it, with a live token of theirs (kliqued "
            f"pipeline resume {pid}), which binds it to that token",
            {"owner": pr.owner, "token": pr.token},
        )
    if pr.state == "running" and pr.token == p.token_id:
        return Prepared(apply=lambda: pid)
    ev = _changed(
        d, pr, {"id": pid, "state": "running", "text": None, "token": p.token_id}, actor=p.text
    )

    def apply() -> str:
        reducers.apply(d, ev, now)
        return pid

    return Prepared([ev], [], apply)
