"""Schedules: create, list, show, pause, resume, delete (docs/channels.md, "Schedules").

A schedule is made by a user and runs as that user, on the token that made it: what it
sends is checked now, as a submission would be (and again at each run), and it is paused once
that token stops working; its owner resumes it with a live token (binding.py). Who sees and
changes it: its owner, the admins of the owner's groups, platform admins; to anyone else it
does not exist (404), as tasks.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from compiler.units import parse_duration
from klique_util.excerpt import excerpt
from kliqued.schedule import cron
from kliqued.schedule import pipeline as P

from kliqued.daemon.state import history, pipeline_cache, schedules
from kliqued.daemon.state.channel_state import Schedule
from kliqued.daemon.state.submission import from_body
from kliqued.daemon.errors import ApiError
from kliqued.daemon.state.pipelines import check_access
from kliqued.daemon.api.request import ctx, principal, read_json, reply
from kliqued.daemon.api.routes import Route

MAX_DEADLINE_S = 366 * 24 * 3600


def _invalid(field: str, message: str) -> ApiError:
    return ApiError(422, "invalid-field", f"{field}: {message}", {"field": field})


def _fields(
    request: web.Request, body: dict[str, Any], now: int, loaded: P.Loaded | None = None
) -> dict[str, Any]:
    """The schedule's fields, each checked; a 422 naming the first that is wrong.
    ``loaded``: the body's pipeline, already parsed (off the event loop, by ``create``)."""
    d = ctx(request).daemon
    owner = principal(request).name
    tz = body.get("timezone") or "UTC"
    try:
        cron.check(body["cron"], tz, now)
    except cron.CronError as exc:
        raise _invalid("timezone" if "time zone" in str(exc) else "cron", str(exc)) from None
    deadline = body.get("deadline")
    deadline_s = None
    if deadline is not None:
        try:
            deadline_s = parse_duration(deadline)
        except ValueError as exc:
            raise _invalid("deadline", str(exc)) from None
        if not 0 < deadline_s <= MAX_DEADLINE_S:
            raise _invalid("deadline", "must be more than 0 and at most 366d")
    missed = body.get("missed") or "run-once"
    if missed == "skip" and deadline_s is not None:
        raise _invalid(
            "deadline", "a deadline is for missed: run-once (skip runs only what is on time)"
        )
    f: dict[str, Any] = {
        "cron": body["cron"],
        "timezone": tz,
        "concurrency": body.get("concurrency") or "allow",
        "missed": missed,
        "deadline_s": deadline_s,
        "name": body.get("name"),
    }
    pipe = body.get("pipeline")
    if (pipe is None) == (not body.get("command")):
        raise ApiError(
            422,
            "invalid-schedule",
            "a schedule runs either a `command` on a `resource` or a `pipeline`: give one of them",
            {"fields": ["command", "pipeline"]},
        )
    if pipe is not None:
        if body.get("resource") is not None:
            raise _invalid("resource", "a pipeline's steps name their compute resources")
        if loaded is None:
            loaded = pipeline_cache.load(pipe)
        check_access(d, owner, loaded, pipe.get("file") or "pipeline.yaml")
        f["pipeline"] = {
            "file": pipe.get("file") or "pipeline.yaml",
            "text": pipe["text"],
            "params": pipe.get("params") or {},
            "project": pipe.get("project"),
            "name": loaded.spec.pipeline,
        }
        return f
    if not body.get("resource"):
        raise _invalid("resource", "a command needs the compute resource it runs on")
    task = {k: body.get(k) for k in ("resource", "command", "project", "gpus", "labels")}
    # the same checks as a task sent now (sizes, the estate's), as the owner
    sub = from_body(d.idx(), principal(request), task, "schedule")
    f.update(
        {
            "resource": sub.resource,
            "command": sub.command,
            "project": sub.project,
            "gpus_milli": sub.gpus_milli,
            "labels": dict(sub.labels),
        }
    )
    return f


def _get(request: web.Request) -> schedules.Schedule:
    d = ctx(request).daemon
    sid = request.match_info["id"]
    s = d.schedules.items.get(sid)
    if s is None or not schedules.visible(d, principal(request), s):
        raise ApiError(404, "not-found", f"no schedule {excerpt(sid, quoted=False)}")
    return s


async def create(request: web.Request) -> web.Response:
    c = ctx(request)
    d = c.daemon
    p = principal(request)
    body = await read_json(request, "ScheduleCreate")
    pipe = body.get("pipeline")
    # its pipeline parsed in a thread; held here, so the reducer finds it parsed
    loaded = None if pipe is None else await pipeline_cache.load_async(pipe)
    now = d.clock.now()
    f = {**_fields(request, body, now, loaded), "cursor": now}
    sid = await c.seq.submit(lambda now, ov: schedules.prepare_create(d, p, f, now, ov))
    return reply(schedules.view(d, d.schedules.items[sid], d.clock.now()), 201)


async def _view(request: web.Request, s: Schedule, n_next: int = 5) -> dict[str, Any]:
    """The schedule's view, its runs' evicted tasks read back first."""
    c = ctx(request)
    known = await history.recall_all(c.store, c.daemon, schedules.run_tasks(s))
    return schedules.view(c.daemon, s, c.daemon.clock.now(), n_next, known)


async def list_schedules(request: web.Request) -> web.Response:
    c = ctx(request)
    d = c.daemon
    p = principal(request)
    shown = [s for s in d.schedules.items.values() if schedules.visible(d, p, s)]
    # every listed run's evicted task in one read, not one per schedule
    known = await history.recall_all(c.store, d, (t for s in shown for t in schedules.run_tasks(s)))
    now = d.clock.now()
    return reply({"schedules": [schedules.view(d, s, now, 1, known) for s in shown]})


async def get_schedule(request: web.Request) -> web.Response:
    return reply(await _view(request, _get(request)))


def _changer(state: str):
    async def change(request: web.Request) -> web.Response:
        c = ctx(request)
        d = c.daemon
        p = principal(request)
        s = _get(request)
        if state == "active" and s.state == "stopped":
            why = schedules.denied(d, s)
            if why is not None:
                raise ApiError(409, "conflict", f"schedule {s.id} cannot resume: {why}")
        if state == "active":  # by its owner: bound to this request's token
            await c.seq.submit(lambda now, ov: schedules.prepare_resume(d, p, s.id, now, ov))
            return reply(await _view(request, d.schedules.items[s.id]))
        await c.seq.submit(
            lambda now, ov: schedules.prepare_change(
                d,
                p.text,
                s.id,
                state,
                None if state == "active" else f"{state} by {p.text}",
                now,
                ov,
                now if state == "active" else None,
            )
        )
        if state == "deleted":
            return web.Response(status=204)
        return reply(await _view(request, d.schedules.items[s.id]))

    return change


SEE = "a user: their own schedules and those of users in groups they administer"

ROUTES = [
    Route(
        "POST",
        "/v1/schedules",
        create,
        "createSchedule",
        ("user",),
        rule="a user: runs as that user, to their groups' compute resources",
        hint="use a user's token: a schedule runs as the user who made it",
    ),
    Route("GET", "/v1/schedules", list_schedules, "listSchedules", ("admin", "user"), rule=SEE),
    Route("GET", "/v1/schedules/{id}", get_schedule, "getSchedule", ("admin", "user"), rule=SEE),
    Route(
        "POST",
        "/v1/schedules/{id}/pause",
        _changer("paused"),
        "pauseSchedule",
        ("admin", "user"),
        rule=SEE,
    ),
    Route(
        "POST",
        "/v1/schedules/{id}/resume",
        _changer("active"),
        "resumeSchedule",
        ("admin", "user"),
        rule=SEE,
    ),
    Route(
        "DELETE",
        "/v1/schedules/{id}",
        _changer("deleted"),
        "deleteSchedule",
        ("admin", "user"),
        rule=SEE,
    ),
]
