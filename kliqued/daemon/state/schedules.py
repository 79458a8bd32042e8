"""Schedules: a task (or a pipeline) sent by cron, as the user who made the schedule.

State lives in the event log like everything else (``schedule_created``, ``schedule_changed``,
``schedule_run``: events.py, reducers.py), so a restart rebuilds each schedule with its
cursor, the last due time it dealt with. A run is recorded in the same commit as the
submission it makes (``prepare_run``): after a kill -9 both are in the log or neither is, and
the rebuilt cursor says that due time is done, so it never runs twice. The submission also
carries the idempotency key ``schedule:<id>:<due>``.

When a schedule runs is ``kliqued.schedule.cron`` (pure); the loop that asks it is
``unattended.py``. Concurrency (as a Kubernetes CronJob's ``concurrencyPolicy``): ``allow``
runs beside an earlier run still going, ``forbid`` skips the new run, ``replace`` cancels
the earlier one first. The owner's access is checked at each run; a run the estate no
longer allows (the owner left the group, the resource is gone) stops the schedule, with the
reason. So is the token it runs on (the one that made it, or the owner's that resumed it):
once that token is revoked or expired the schedule is paused, with the reason, and only its
owner resumes it, with a live token of theirs (binding.py).
"""

from __future__ import annotations

from typing import Any, Mapping

from kliqued.schedule import cron as when
from kliqued.schedule import pipeline as P

from kliqued.daemon.state import pipeline_cache, pipelines, reducers, submission
from kliqued.daemon.auth import Principal
from kliqued.daemon.state.channel_state import Run, Schedule
from kliqued.daemon.state.as_owner import prepare_as_owner, sent
from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.state.prepared import Overlay, Prepared, merged
from kliqued.daemon.errors import ApiError
from kliqued.daemon.events import Event
from kliqued.daemon.records import TaskRecord
from kliqued.daemon.units import gpus, iso
from kliqued.daemon.records import end_text, state as task_state

MAX_PER_OWNER = 100
"""Schedules a user may have (docs/decisions.md, "Schedules and pipelines")."""


def _changed(d: Daemon, s: Schedule, data: dict[str, Any], actor: str = "kliqued") -> Event:
    """A ``schedule_changed`` event of ``s`` (filed under its owner) with ``data``, by
    ``actor``: the daemon itself unless a caller changes it. Every change of a schedule's
    state or token is one, made here."""
    return Event("schedule_changed", None, actor, d.idx().revision, None, s.owner, data)


# ---------------------------------------------------------------------- reading


def visible(d: Daemon, p: Principal, s: Schedule) -> bool:
    """Its owner, admins of a group the owner is in, and platform admins (as tasks)."""
    if p.is_admin:
        return True
    if not p.is_user:
        return False
    acc = d.acc()
    return s.owner == p.name or bool(acc.groups_of(s.owner) & acc.admin_of(p.name))


def _alive(d: Daemon, run: Run) -> bool:
    if run.task is not None:
        rec = d.records.get(run.task)
        return rec is not None and rec.state != "ended"
    if run.pipeline is not None:
        pr = d.pipelines.items.get(run.pipeline)
        return pr is not None and pr.state in ("running", "paused")
    return False


def live_runs(d: Daemon, s: Schedule) -> list[Run]:
    """Its submitted runs still going (and it forgets the others)."""
    s.live = [r for r in s.live if _alive(d, r)]
    return list(s.live)


def run_tasks(s: Schedule) -> list[str]:
    """The tasks its runs submitted (a handler reads the evicted ones back first: :func:`view`'s
    ``known``)."""
    return [r.task for r in s.runs if r.task is not None]


def view(
    d: Daemon, s: Schedule, now: int, n_next: int = 5, known: Mapping[str, TaskRecord] | None = None
) -> dict[str, Any]:
    """``known``: its runs' tasks that left memory, read back (``history.recall_all``), so an
    old run still says how its task ended."""
    nxt = when.after(s.cron, s.timezone, max(s.cursor, now), n_next) if s.state == "active" else []
    runs = []
    for r in reversed(s.runs):
        item: dict[str, Any] = {
            "due": iso(r.due),
            "at": iso(r.at),
            "outcome": r.outcome,
            "text": r.text,
            "task": r.task,
            "pipeline": r.pipeline,
            "missed": r.missed,
            "state": None,
        }
        rec = None if r.task is None else (d.find(r.task) or (known or {}).get(r.task))
        if rec is not None:
            item["state"] = task_state(rec) if rec.state != "ended" else end_text(rec)
        elif r.pipeline is not None and r.pipeline in d.pipelines.items:
            item["state"] = d.pipelines.items[r.pipeline].state
        runs.append(item)
    pipe = None
    if s.pipeline is not None:
        pipe = {
            "file": s.pipeline.get("file"),
            "name": s.pipeline.get("name"),
            "params": s.pipeline.get("params") or {},
        }
    return {
        "id": s.id,
        "name": s.name,
        "owner": s.owner,
        "cron": s.cron,
        "timezone": s.timezone,
        "resource": s.resource,
        "command": s.command,
        "project": s.project if s.pipeline is None else s.pipeline.get("project"),
        "gpus": gpus(s.gpus_milli),
        "labels": s.labels,
        "pipeline": pipe,
        "concurrency": s.concurrency,
        "missed": s.missed,
        "deadline_s": s.deadline_s,
        "state": s.state,
        "reason": s.reason,
        "token": s.token,
        "created_at": iso(s.created_at),
        "next_runs": [iso(t) for t in nxt],
        "last_runs": runs,
    }


# ---------------------------------------------------------------------- changes


def prepare_create(d: Daemon, p: Principal, f: dict[str, Any], now: int, ov: Overlay) -> Prepared:
    """``f`` is checked (handlers/schedules.py); the id is made here, in log order. A user
    has at most ``MAX_PER_OWNER`` schedules (each holds its command or pipeline file)."""
    d.tokens.require_booked(p, "a schedule")
    held = sum(s.owner == p.name for s in d.schedules.items.values())
    held += ov.made[("schedule", p.name)]
    if held >= MAX_PER_OWNER:
        raise ApiError(
            429,
            "user-quota",
            f"{p.name} has {held} schedules, the most a user "
            f"may have: delete some (kliqued schedule delete)",
            {"held": held, "limit": MAX_PER_OWNER},
        )
    ov.made[("schedule", p.name)] += 1
    sid = d.schedules.ids.next(now)
    data = {"id": sid, "owner": p.name, "token": p.token_id, **f}
    ev = Event("schedule_created", None, p.text, d.idx().revision, None, p.name, data)

    def apply() -> str:
        reducers.apply(d, ev, now)
        return sid

    return Prepared([ev], [], apply)


def prepare_change(
    d: Daemon,
    actor: str,
    sid: str,
    state: str,
    reason: str | None,
    now: int,
    ov: Overlay,
    cursor: int | None = None,
) -> Prepared:
    """``cursor``: for a resume, the time from which due times count again (the handler's
    clock; recorded, so a replay rebuilds the same cursor)."""
    s = d.schedules.get(sid)
    if s.state == state or (state == "paused" and s.state != "active"):
        if state == "paused" and s.state == "stopped":
            raise ApiError(
                409,
                "conflict",
                f"schedule {sid} is stopped ({s.reason}): "
                f"resume it once the reason is fixed, or delete it",
            )
        return Prepared(apply=lambda: sid)
    ev = _changed(
        d,
        s,
        {
            "id": sid,
            "state": state,
            "reason": reason,
            **({"cursor": cursor} if cursor is not None else {}),
        },
        actor=actor,
    )

    def apply() -> str:
        reducers.apply(d, ev, now)
        return sid

    return Prepared([ev], [], apply)


def prepare_resume(
    d: Daemon, p: Principal, sid: str, now: int, ov: Overlay, at: int | None = None
) -> Prepared:
    """Resumed by ``p``, in the sequencer (so no revocation slips between the check and the
    commit). Its owner resumes it with the live token of this request, and it runs on that
    token from now on; anyone else who may see it (an admin) resumes it only while the token
    it runs on still works, and does not rebind it: a schedule runs on its owner's own
    credential, never on another's (docs/decisions.md, "Schedules outlive no token").
    ``at``: the resume's time, from which due times count again (the handler's clock; the
    sequencer's ``now`` without it)."""
    at = now if at is None else at
    s = d.schedules.get(sid)
    if p.is_user and p.name == s.owner:
        d.tokens.require_booked(p, "a resumed schedule")
    token = p.token_id if p.is_user and p.name == s.owner else None
    if token is None:
        why = d.tokens.ended(s.token, at)
        if why is not None:
            raise ApiError(
                409,
                "conflict",
                f"schedule {sid} runs as {s.owner} on token "
                f"{s.token}, which no longer works ({why}): only {s.owner} may "
                f"resume it, with a live token of theirs (kliqued schedule "
                f"resume {sid}), which binds it to that token",
                {"token": s.token, "owner": s.owner},
            )
    if s.state == "active" and token in (None, s.token):
        return Prepared(apply=lambda: sid)
    ev = _changed(
        d,
        s,
        {
            "id": sid,
            "state": "active",
            "reason": None,
            "cursor": at,
            **({"token": token} if token is not None else {}),
        },
        actor=p.text,
    )

    def apply() -> str:
        reducers.apply(d, ev, now)
        return sid

    return Prepared([ev], [], apply)


def prepare_pause_for(d: Daemon, sid: str, why: str, now: int) -> Prepared:
    """Paused because the token it runs on ended (``why`` says which and when)."""
    s = d.schedules.items[sid]
    ev = _changed(
        d,
        s,
        {
            "id": sid,
            "state": "paused",
            "reason": f"paused: {why}; {s.owner} resumes it with a live token "
            f"(kliqued schedule resume {sid})",
        },
    )
    return Prepared([ev], [], lambda: reducers.apply(d, ev, now))


def prepare_lapsed(d: Daemon, sid: str, at: int, now: int, ov: Overlay) -> Prepared:
    """Paused if it is active and the token it runs on no longer works at ``at`` (the loop's
    clock: an expiry has no event of its own), else nothing."""
    s = d.schedules.items.get(sid)
    if s is None or s.state != "active":
        return Prepared()
    why = d.tokens.ended(s.token, at)
    return Prepared() if why is None else prepare_pause_for(d, sid, why, now)


def prepare_rebind(d: Daemon, sid: str, token: str, now: int) -> Prepared:
    """Bound to ``token`` (its token was rotated), its state and reason unchanged."""
    s = d.schedules.items[sid]
    ev = _changed(d, s, {"id": sid, "state": s.state, "reason": s.reason, "token": token})
    return Prepared([ev], [], lambda: reducers.apply(d, ev, now))


def prepare_recheck(d: Daemon, sid: str, now: int, ov: Overlay) -> Prepared:
    """After an estate change: a schedule whose owner may no longer send its work stops now,
    with the reason (rather than at its next run, maybe a month away)."""
    s = d.schedules.items.get(sid)
    if s is None or s.state != "active":
        return Prepared()
    why = denied(d, s)
    if why is None:
        return Prepared()
    return prepare_change(d, "kliqued", sid, "stopped", why, now, ov)


def _key(s: Schedule, due: int) -> str:
    return f"schedule:{s.id}:{due}"


def prepare_run(d: Daemon, sid: str, decide_at: int, now: int, ov: Overlay) -> Prepared:
    """The schedule's due times at ``decide_at`` (the loop's clock) dealt with: recorded
    (``schedule_run``) together with what the run does, in one commit at ``now`` (the
    sequencer's). Prepared in the sequencer, against the state of this very moment, so two
    looks at the same due time make one run."""
    s = d.schedules.items.get(sid)
    if s is None or s.state != "active":
        return Prepared()
    lapsed = prepare_lapsed(d, sid, decide_at, now, ov)
    if lapsed.events:  # its token ended: paused, and this due time is not run
        return lapsed
    dec = s.due(decide_at)
    if dec.run is None and dec.missed == 0:
        return Prepared()
    rev = d.idx().revision
    owner = Principal("user", s.owner)

    def run_event(
        due: int,
        outcome: str,
        text: str | None,
        task: str | None = None,
        pipeline: str | None = None,
    ) -> Event:
        return Event(
            "schedule_run",
            task,
            "kliqued",
            rev,
            None,
            s.owner,
            {
                "id": s.id,
                "due": due,
                "outcome": outcome,
                "text": text,
                "task": task,
                "pipeline_id": pipeline,
                "missed": dec.missed,
                "first_missed": dec.first_missed,
            },
        )

    if dec.run is None:
        last = iso(dec.cursor)
        ev = run_event(
            dec.cursor,
            "missed",
            f"{dec.missed} due time(s) up to {last} missed "
            f"(missed: {s.missed}"
            + (f", deadline {s.deadline_s} s)" if s.deadline_s is not None else ")"),
        )
        return _with(d, Prepared(), [ev], now)
    due = dec.run
    # Who may still send this: the owner's access, now, as for any submission.
    why = denied(d, s)
    if why is not None:
        ev = run_event(due, "failed", why)
        stop = _changed(d, s, {"id": s.id, "state": "stopped", "reason": why})
        return _with(d, Prepared(), [ev, stop], now)
    live = live_runs(d, s)
    parts: list[Prepared] = []
    if live and s.concurrency == "forbid":
        what = ", ".join(r.task or r.pipeline or "?" for r in live)
        ev = run_event(
            due, "skipped", f"the previous run ({what}) still runs (concurrency: forbid)"
        )
        return _with(d, Prepared(), [ev], now)
    if live and s.concurrency == "replace":
        for r in live:
            why = f"replaced by schedule {s.id}'s run of {iso(due)} (concurrency: replace)"
            if r.task is not None:
                parts.append(d.prepare_cancel(owner, r.task, now, ov, why))
            elif r.pipeline is not None:
                parts.append(pipelines.prepare_cancel(d, owner, r.pipeline, now, ov, why))
    try:
        if s.pipeline is not None:
            sub = pipelines.prepare_start(
                d,
                Principal("user", s.owner, s.token),
                s.pipeline,
                now,
                ov,
                schedule=s.id,
                loaded=_loaded(s),
            )
            pid = sub.events[0].data["id"]
            ev = run_event(due, "submitted", None, pipeline=pid)
        else:
            assert s.resource is not None  # a schedule of a command names its resource
            sub = prepare_as_owner(
                d,
                s.owner,
                "schedule",
                _key(s, due),
                now,
                ov,
                resource=s.resource,
                project=s.project,
                gpus_milli=s.gpus_milli,
                command=s.command,
                labels={**s.labels, "klique.schedule": s.id},
            )
            tid = sent(d, s.owner, sub, _key(s, due), ov)
            ev = run_event(
                due,
                "submitted",
                None if sub.events else "sent already under this run's idempotency key",
                task=tid,
            )
    except ApiError as exc:  # its quota, a pipeline that no longer loads: this run fails
        ev = run_event(due, "failed", exc.message)
        return _with(d, merged(parts), [ev], now)
    # The run first, then what it sends: in one commit.
    return _with(d, merged(parts), [ev], now, after=sub)


def denied(d: Daemon, s: Schedule) -> str | None:
    """Why the owner may no longer send this schedule's work, or None."""
    resources: list[tuple[str, str | None, int | None]] = []
    if s.pipeline is not None:
        try:
            loaded = _loaded(s)
        except ApiError as exc:
            return exc.message
        resources = [
            (st.resource, loaded.project_of(st), st.gpus_milli) for st in loaded.spec.steps
        ]
    elif s.resource is not None:
        resources = [(s.resource, s.project, s.gpus_milli)]
    for resource, project, milli in resources:
        why = submission.refusal(d.idx(), resource, s.owner, project, milli)
        if why is not None:
            return f"stopped: {s.owner} may no longer send to {resource}: {why}"
    return None


def _loaded(s: Schedule) -> P.Loaded:
    """The schedule's pipeline with its parameters, from the form parsed when it was made:
    a run reads no file (a 422 if it no longer loads)."""
    assert s.pipeline is not None
    if s.parsed is None:
        raise ApiError(422, "invalid-pipeline", s.invalid or "the pipeline does not load")
    try:
        return P.bind(s.parsed, s.pipeline.get("params") or {}, s.pipeline.get("project"))
    except P.PipelineError as exc:
        raise pipeline_cache.api_error(exc) from None


def _with(
    d: Daemon, before: Prepared, own: list[Event], now: int, after: Prepared | None = None
) -> Prepared:
    """``before``'s events, then ``own`` (applied through the reducers), then ``after``'s:
    one commit, applied in log order."""
    parts = [before, Prepared(own, [], lambda: [reducers.apply(d, e, now) for e in own])]
    if after is not None:
        parts.append(after)
    return merged(parts)
