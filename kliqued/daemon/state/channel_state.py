"""The unattended channels' state in the daemon: schedules with their cursor and last runs,
pipelines with their steps. Changed only by the reducers of their events (reducers.py), live
and in replay, so a restart rebuilds what the live daemon had; schedules.py and pipelines.py
read it and prepare the changes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from klique_util.excerpt import excerpt
from kliqued.schedule import cron as when  # (a Schedule has a field named cron)
from kliqued.schedule import pipeline as P

from kliqued.daemon.state import pipeline_cache
from kliqued.daemon.errors import ApiError, not_found
from kliqued.daemon.ids import IdMaker

log = logging.getLogger(__name__)

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
    token: str | None = None
    """The id of the token it runs on: the one that made it, or its owner's that resumed it
    (None: made before schedules recorded it). Its end pauses the schedule (binding.py)."""
    cursor: int = 0
    """The last due time dealt with (run, skipped or missed); due times after it are ahead."""
    runs: list[Run] = field(default_factory=list)
    """The latest runs, oldest first (``KEPT_RUNS``)."""
    live: list[Run] = field(default_factory=list)
    """Submitted runs whose task or pipeline may still run (for ``forbid``/``replace``)."""

    _next: tuple[int, int | None] | None = field(default=None, repr=False, compare=False)
    parsed: P.Parsed | None = field(default=None, repr=False, compare=False)
    """Its pipeline file, parsed once when it was made (or rebuilt): each run binds its
    parameters to this, no run reads the file again."""
    invalid: str | None = field(default=None, repr=False, compare=False)
    """Why its pipeline file no longer loads (a rebuilt schedule under stricter limits): its
    runs fail with it."""

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
            raise not_found(f"no schedule {excerpt(sid, quoted=False)}")
        return s

    def active(self) -> list[Schedule]:
        return [s for s in self.items.values() if s.state == "active"]

    # --- reducers' targets (live and replay)
    def on_created(self, data: dict[str, Any], at: int) -> Schedule:
        s = Schedule(
            data["id"],
            data["owner"],
            data["cron"],
            data.get("timezone") or "UTC",
            at,
            data.get("resource"),
            data.get("command"),
            data.get("project"),
            data.get("gpus_milli"),
            dict(data.get("labels") or {}),
            data.get("pipeline"),
            data.get("concurrency") or "allow",
            data.get("missed") or "run-once",
            data.get("deadline_s"),
            data.get("name"),
            token=data.get("token"),
            cursor=data.get("cursor") or at,
        )
        if s.pipeline is not None:
            try:
                s.parsed = pipeline_cache.load(s.pipeline).parsed
            except ApiError as exc:
                s.invalid = exc.message
        self.items[s.id] = s
        self.ids.seed(s.id)
        return s

    def on_changed(
        self,
        sid: str,
        state: str,
        reason: str | None,
        at: int,
        cursor: int | None = None,
        token: str | None = None,
    ) -> None:
        s = self.items.get(sid)
        if s is None:
            return
        if state == "deleted":
            del self.items[sid]
            return
        if token is not None:
            s.token = token
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


@dataclass
class PipelineRun:
    id: str
    owner: str
    name: str
    file: str
    text: str
    params: dict[str, str]
    started_at: int
    loaded: P.Loaded
    schedule: str | None = None
    token: str | None = None
    """The id of the token its steps are sent on (binding.py); None: started before runs
    recorded it."""
    state: str = "running"
    """running, paused (its token ended: no further step is sent), or how it ended."""
    reason: str | None = None
    """Why it is paused."""
    text_end: str | None = None
    ended_at: int | None = None
    steps: dict[str, P.StepRun] = field(default_factory=dict)


class PipelineBook:
    def __init__(self) -> None:
        self.items: dict[str, PipelineRun] = {}
        self.ids = IdMaker("p-")

    def get(self, pid: str) -> PipelineRun:
        pr = self.items.get(pid)
        if pr is None:
            raise not_found(f"no pipeline {excerpt(pid, quoted=False)}")
        return pr

    def running(self) -> list[PipelineRun]:
        return [p for p in self.items.values() if p.state == "running"]

    def unended(self) -> list[PipelineRun]:
        """Running or paused: what a user's running quota counts, and what may be
        cancelled."""
        return [p for p in self.items.values() if p.state in ("running", "paused")]

    def on_started(self, data: dict[str, Any], at: int) -> PipelineRun | None:
        """The file's parsed form is found in ``pipeline_cache`` (the handler or the
        schedule parsed it): a run does not parse it again, and shares it (and its text)
        with the other runs of it. A logged run whose file no longer loads (stricter
        limits since) is skipped with a warning rather than stopping the replay."""
        try:
            loaded = pipeline_cache.load(data)
        except ApiError as exc:
            log.warning(
                "pipeline %s is not rebuilt: its file no longer loads: %s", data["id"], exc.message
            )
            self.ids.seed(data["id"])
            return None
        pr = PipelineRun(
            data["id"],
            data["owner"],
            data["name"],
            data["file"],
            loaded.parsed.text,
            dict(loaded.params),
            at,
            loaded,
            data.get("schedule"),
            data.get("token"),
        )
        pr.steps = {s.name: P.StepRun(s.name) for s in loaded.spec.steps}
        self.items[pr.id] = pr
        self.ids.seed(pr.id)
        return pr

    def on_step(self, data: dict[str, Any]) -> None:
        pr = self.items.get(data["id"])
        if pr is None or data["step"] not in pr.steps:
            return
        run = pr.steps[data["step"]]
        run.state = data["state"]
        run.text = data.get("text")
        if data.get("task"):
            run.tasks.append(data["task"])
        if data.get("outputs") is not None:
            run.outputs = dict(data["outputs"])

    def on_changed(self, pid: str, state: str, text: str | None, token: str | None) -> None:
        """Paused (its token ended), running again (resumed), or rebound (a rotation: the
        state unchanged, ``token`` the new one)."""
        pr = self.items.get(pid)
        if pr is None or pr.state not in ("running", "paused"):
            return
        if token is not None:
            pr.token = token
        pr.state, pr.reason = state, (text if state == "paused" else None)

    def on_ended(self, pid: str, state: str, text: str | None, at: int) -> None:
        pr = self.items.get(pid)
        if pr is None:
            return
        pr.state, pr.reason, pr.text_end, pr.ended_at = state, None, text, at
