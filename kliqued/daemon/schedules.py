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
reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kliqued.engine import SubmissionError, check_submission
from kliqued.schedule import cron as when  # (a Schedule has a field named cron)

from . import reducers
from .auth import Principal
from .errors import ApiError, not_found
from .events import Event
from .ids import IdMaker
from .units import gpus, iso

if TYPE_CHECKING:
    from .core import Daemon, Overlay, Prepared

CONCURRENCY = ("allow", "forbid", "replace")
STATES = ("active", "paused", "stopped", "deleted")
KEPT_RUNS = 20
"""Runs kept per schedule for ``show`` (the log keeps them all)."""


@dataclass
class Run:
    due: int
    at: int
    outcome: str
    text: str | None = None
    task: str | None = None
    pipeline: str | None = None
    missed: int = 0
    first_missed: int | None = None


@dataclass
class Schedule:
    id: str
    owner: str
    cron: str
    timezone: str
    created_at: int
    resource: str | None = None
    command: list[str] | None = None
    project: str | None = None
    gpus_milli: int | None = None
    labels: dict[str, str] = field(default_factory=dict)
    pipeline: dict[str, Any] | None = None
    concurrency: str = "allow"
    missed: str = "run-once"
    deadline_s: int | None = None
    name: str | None = None
    state: str = "active"
    reason: str | None = None
    cursor: int = 0
    """The last due time dealt with (run, skipped or missed); due times after it are ahead."""
    runs: list[Run] = field(default_factory=list)
    """The latest runs, oldest first (``KEPT_RUNS``)."""
    live: list[Run] = field(default_factory=list)
    """Submitted runs whose task or pipeline may still run (for ``forbid``/``replace``)."""

    _next: tuple[int, int | None] | None = field(default=None, repr=False, compare=False)

    def next_due(self) -> int | None:
        """The first due time after the cursor (cached per cursor: the loop asks every
        active schedule four times a second)."""
        if self._next is None or self._next[0] != self.cursor:
            nxt = when.after(self.cron, self.timezone, self.cursor)
            self._next = (self.cursor, nxt[0] if nxt else None)
        return self._next[1]

    def due(self, now: int) -> when.Due:
        deadline = None if self.deadline_s is None else self.deadline_s * 1000
        return when.due(self.cron, self.timezone, self.cursor, now, self.missed, deadline)


class ScheduleBook:
    """Every schedule not deleted, by id; changed only by the reducers."""

    def __init__(self) -> None:
        self.items: dict[str, Schedule] = {}
        self.ids = IdMaker("s-")

    def get(self, sid: str) -> Schedule:
        s = self.items.get(sid)
        if s is None:
            raise not_found(f"no schedule {sid}")
        return s

    def active(self) -> list[Schedule]:
        return [s for s in self.items.values() if s.state == "active"]

    # --- reducers' targets (live and replay)
    def on_created(self, data: dict[str, Any], at: int) -> Schedule:
        s = Schedule(data["id"], data["owner"], data["cron"], data.get("timezone") or "UTC",
                     at, data.get("resource"), data.get("command"), data.get("project"),
                     data.get("gpus_milli"), dict(data.get("labels") or {}),
                     data.get("pipeline"), data.get("concurrency") or "allow",
                     data.get("missed") or "run-once", data.get("deadline_s"),
                     data.get("name"), cursor=data.get("cursor") or at)
        self.items[s.id] = s
        self.ids.seed(s.id)
        return s

    def on_changed(self, sid: str, state: str, reason: str | None, at: int,
                   cursor: int | None = None) -> None:
        s = self.items.get(sid)
        if s is None:
            return
        if state == "deleted":
            del self.items[sid]
            return
        if state == "active" and s.state in ("paused", "stopped"):
            # resumed: the due times while it was paused are gone
            s.cursor = max(s.cursor, cursor if cursor is not None else at)
        s.state, s.reason = state, reason

    def on_run(self, sid: str, run: Run) -> None:
        s = self.items.get(sid)
        if s is None:
            return
        s.cursor = max(s.cursor, run.due)
        s.runs.append(run)
        del s.runs[:-KEPT_RUNS]
        if run.outcome == "submitted":
            s.live.append(run)


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
        return pr is not None and pr.state == "running"
    return False


def live_runs(d: Daemon, s: Schedule) -> list[Run]:
    """Its submitted runs still going (and it forgets the others)."""
    s.live = [r for r in s.live if _alive(d, r)]
    return list(s.live)


def view(d: Daemon, s: Schedule, now: int, n_next: int = 5) -> dict[str, Any]:
    nxt = (when.after(s.cron, s.timezone, max(s.cursor, now), n_next)
           if s.state == "active" else [])
    runs = []
    for r in reversed(s.runs):
        item: dict[str, Any] = {"due": iso(r.due), "at": iso(r.at), "outcome": r.outcome,
                                "text": r.text, "task": r.task, "pipeline": r.pipeline,
                                "missed": r.missed, "state": None}
        if r.task is not None and r.task in d.records:
            from .views import end_text, state
            rec = d.records[r.task]
            item["state"] = state(rec) if rec.state != "ended" else end_text(rec)
        elif r.pipeline is not None and r.pipeline in d.pipelines.items:
            item["state"] = d.pipelines.items[r.pipeline].state
        runs.append(item)
    pipe = None
    if s.pipeline is not None:
        pipe = {"file": s.pipeline.get("file"), "name": s.pipeline.get("name"),
                "params": s.pipeline.get("params") or {}}
    return {"id": s.id, "name": s.name, "owner": s.owner, "cron": s.cron,
            "timezone": s.timezone, "resource": s.resource, "command": s.command,
            "project": s.project,
            "gpus": gpus(s.gpus_milli),
            "labels": s.labels, "pipeline": pipe, "concurrency": s.concurrency,
            "missed": s.missed, "deadline_s": s.deadline_s, "state": s.state,
            "reason": s.reason, "created_at": iso(s.created_at),
            "next_runs": [iso(t) for t in nxt], "last_runs": runs}


# ---------------------------------------------------------------------- changes


def prepare_create(d: Daemon, p: Principal, f: dict[str, Any], now: int,
                   ov: Overlay) -> Prepared:
    """``f`` is checked (handlers/schedules.py); the id is made here, in log order."""
    from .core import Prepared
    sid = d.schedules.ids.next(now)
    data = {"id": sid, "owner": p.name, **f}
    ev = Event("schedule_created", None, p.text, d.idx().revision, None, p.name, data)

    def apply() -> str:
        reducers.apply(d, ev, now)
        return sid
    return Prepared([ev], [], apply)


def prepare_change(d: Daemon, actor: str, sid: str, state: str, reason: str | None,
                   now: int, ov: Overlay, cursor: int | None = None) -> Prepared:
    """``cursor``: for a resume, the time from which due times count again (the handler's
    clock; recorded, so a replay rebuilds the same cursor)."""
    from .core import Prepared
    s = d.schedules.get(sid)
    if s.state == state or (state == "paused" and s.state != "active"):
        if state == "paused" and s.state == "stopped":
            raise ApiError(409, "conflict", f"schedule {sid} is stopped ({s.reason}): "
                           f"resume it once the reason is fixed, or delete it")
        return Prepared(apply=lambda: sid)
    ev = Event("schedule_changed", None, actor, d.idx().revision, None, s.owner,
               {"id": sid, "state": state, "reason": reason,
                **({"cursor": cursor} if cursor is not None else {})})

    def apply() -> str:
        reducers.apply(d, ev, now)
        return sid
    return Prepared([ev], [], apply)


def prepare_recheck(d: Daemon, sid: str, now: int, ov: Overlay) -> Prepared:
    """After an estate change: a schedule whose owner may no longer send its work stops now,
    with the reason (rather than at its next run, maybe a month away)."""
    from .core import Prepared
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
    from .core import Prepared, merged
    s = d.schedules.items.get(sid)
    if s is None or s.state != "active":
        return Prepared()
    dec = s.due(decide_at)
    if dec.run is None and dec.missed == 0:
        return Prepared()
    rev = d.idx().revision
    owner = Principal("user", s.owner)

    def run_event(due: int, outcome: str, text: str | None, task: str | None = None,
                  pipeline: str | None = None) -> Event:
        return Event("schedule_run", task, "kliqued", rev, None, s.owner,
                     {"id": s.id, "due": due, "outcome": outcome, "text": text,
                      "task": task, "pipeline_id": pipeline, "missed": dec.missed,
                      "first_missed": dec.first_missed})
    if dec.run is None:
        last = iso(dec.cursor)
        ev = run_event(dec.cursor, "missed", f"{dec.missed} due time(s) up to {last} missed "
                       f"(missed: {s.missed}" + (f", deadline {s.deadline_s} s)"
                                                 if s.deadline_s is not None else ")"))
        return _with(d, Prepared(), [ev], now)
    due = dec.run
    # Who may still send this: the owner's access, now, as for any submission.
    why = denied(d, s)
    if why is not None:
        ev = run_event(due, "failed", why)
        stop = Event("schedule_changed", None, "kliqued", rev, None, s.owner,
                     {"id": s.id, "state": "stopped", "reason": why})
        return _with(d, Prepared(), [ev, stop], now)
    live = live_runs(d, s)
    parts: list[Prepared] = []
    if live and s.concurrency == "forbid":
        what = ", ".join(r.task or r.pipeline or "?" for r in live)
        ev = run_event(due, "skipped", f"the previous run ({what}) still runs "
                                       f"(concurrency: forbid)")
        return _with(d, Prepared(), [ev], now)
    if live and s.concurrency == "replace":
        for r in live:
            why = f"replaced by schedule {s.id}'s run of {iso(due)} (concurrency: replace)"
            if r.task is not None:
                parts.append(d.prepare_cancel(owner, r.task, now, ov, why))
            elif r.pipeline is not None:
                from .pipelines import prepare_cancel
                parts.append(prepare_cancel(d, owner, r.pipeline, now, ov, why))
    try:
        if s.pipeline is not None:
            from .pipelines import prepare_start
            sub = prepare_start(d, owner, s.pipeline, now, ov, schedule=s.id)
            pid = sub.events[0].data["id"]
            ev = run_event(due, "submitted", None, pipeline=pid)
        else:
            from .channels import prepare_as_owner
            sub = prepare_as_owner(d, s.owner, "schedule", {
                "resource": s.resource, "project": s.project, "gpus_milli": s.gpus_milli,
                "command": s.command, "labels": {**s.labels, "klique.schedule": s.id}},
                _key(s, due), now, ov)
            if not sub.events:  # its key says it was sent already: recorded as such
                return Prepared()
            ev = run_event(due, "submitted", None, task=sub.events[0].task)
    except ApiError as exc:  # its quota, a pipeline that no longer loads: this run fails
        ev = run_event(due, "failed", exc.message)
        return _with(d, merged(parts), [ev], now)
    # The run first, then what it sends: in one commit.
    return _with(d, merged(parts), [ev], now, after=sub)


def denied(d: Daemon, s: Schedule) -> str | None:
    """Why the owner may no longer send this schedule's work, or None."""
    resources: list[tuple[str, str | None, int | None]] = []
    if s.pipeline is not None:
        from .pipelines import load_for
        try:
            loaded = load_for(s.pipeline)
        except ApiError as exc:
            return exc.message
        resources = [(st.resource, st.project, None if st.gpus is None else
                      round(st.gpus * 1000)) for st in loaded.spec.steps]
    elif s.resource is not None:
        resources = [(s.resource, s.project, s.gpus_milli)]
    for resource, project, gpus in resources:
        try:
            check_submission(d.idx(), resource, s.owner, project, gpus,
                             require_project=True)
        except SubmissionError as exc:
            return f"stopped: {s.owner} may no longer send to {resource}: {exc}"
    return None


def _with(d: Daemon, before: Prepared, own: list[Event], now: int,
          after: Prepared | None = None) -> Prepared:
    """``before``'s events, then ``own`` (applied through the reducers), then ``after``'s:
    one commit, applied in log order."""
    from .core import Prepared, merged
    parts = [before, Prepared(own, [], lambda: [reducers.apply(d, e, now) for e in own])]
    if after is not None:
        parts.append(after)
    return merged(parts)
