"""Tasks: submit, list, get, cancel.

A submission is checked against the estate (``check_submission``) before anything is logged:
a refused one is a 422 with the engine's own words and leaves no trace. A task the caller may
not see is a 404, as if it did not exist: task ids are not disclosed to other users.
"""

from __future__ import annotations

from bisect import bisect_right

from aiohttp import web

from kliqued.engine import SubmissionError, check_submission

from .. import limits, views
from ..auth import Access
from ..core import Daemon
from ..errors import ApiError, bad_request, forbidden, not_found
from ..openapi import submission_surely_valid
from ..records import TaskRecord
from ..request import ctx, principal, read_json, reply
from ..routes import Route
from ..units import to_milli
from .params import int_param, str_param


def _visible(request: web.Request, rec: TaskRecord) -> TaskRecord:
    """``rec``, if the caller may see it (routes ``SEE_TASK``); a 404 otherwise."""
    if not ctx(request).daemon.acc().sees_task(principal(request), rec.user, rec.group):
        raise not_found(f"no task {rec.id}")
    return rec


def _may_filter(acc: Access, name: str, mine: frozenset[str], user: str | None,
                group: str | None) -> None:
    """A filter on tasks the caller may not see is a 403 saying so, not an empty list that
    reads as "no tasks" (issue 10): another user's tasks are for their groups' admins."""
    if user is not None and user != name and not acc.groups_of(user) & mine:
        raise forbidden(f"{name} may not see {user}'s tasks: only the admins of {user}'s "
                        "groups and platform admins may")
    if group is not None and group not in mine and group not in acc.groups_of(name):
        raise forbidden(f"{name} may not see group {group}'s tasks: {name} is neither in it "
                        "nor one of its admins")


def _with_options(d: Daemon, user: str, body: dict, exc: SubmissionError) -> str:
    """A resource the user may not send to names the ones they may (issue 10)."""
    cr = d.idx().resources.get(body["resource"])
    if cr is not None and user in d.idx().users.get(cr.group, ()):
        return str(exc)
    mine = views.submittable(d, user)
    return f"{exc}; {user} may submit to " + (", ".join(mine) if mine else "nothing")


async def submit(request: web.Request) -> web.Response:
    c = ctx(request)
    d = c.daemon
    p = principal(request)
    body = await read_json(request, "TaskSubmission", submission_surely_valid)
    if not body.get("command") and body.get("payload") is None:
        raise ApiError(422, "invalid-task", "a task needs `command` (a non-empty list of "
                       "arguments) or `payload` (data for its channel); both are missing",
                       {"fields": ["command", "payload"]})
    data_bytes = _sized(body)
    if "klique.channel" in (body.get("labels") or {}):
        raise ApiError(422, "invalid-field", "labels.klique.channel: the control plane sets "
                       "a task's channel (a session is started with POST /v1/sessions)",
                       {"field": "labels.klique.channel"})
    user = body.get("user")
    if p.is_admin:
        if not user:
            raise bad_request("an admin sends work only on behalf of a user: give `user`")
    elif user is None:
        user = p.name
    elif user != p.name:
        raise forbidden("only an admin may send work on behalf of another user")
    key = request.headers.get("Idempotency-Key")
    if key is not None and not 1 <= len(key) <= 256:
        raise bad_request("Idempotency-Key must be 1 to 256 characters")
    try:
        gpus = None if body.get("gpus") is None else to_milli(body["gpus"])
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    fields = {"resource": body["resource"], "user": user, "project": body.get("project"),
              "gpus_milli": gpus, "command": body.get("command"),
              "payload": body.get("payload"), "labels": body.get("labels") or {}}
    if key is None or (p.text, key) not in d.idem:
        try:  # fail fast; the sequencer checks again against the estate of the commit
            check_submission(d.idx(), fields["resource"], user, fields["project"], gpus,
                             require_project=True)
        except SubmissionError as exc:
            raise ApiError(422, "submission-refused", _with_options(d, user, body, exc),
                           {"field": exc.field}) from None
    status, task_id = await c.seq.submit(
        lambda now, ov: d.prepare_submit(p, fields, key, now, ov, data_bytes))
    return reply(views.task(d, d.records[task_id]), status)


def _sized(body: dict) -> int:
    """The task's data bytes; a command or payload over its cap is a 413 naming it."""
    cmd = limits.command_bytes(body.get("command"))
    if cmd > limits.MAX_COMMAND_BYTES:
        raise ApiError(413, "too-large", f"/command: {limits.mib(cmd)}; a task's command may "
                       f"hold {limits.mib(limits.MAX_COMMAND_BYTES)} at most (put data in a "
                       f"file the task reads)", {"pointer": "/command", "bytes": cmd,
                                                 "limit_bytes": limits.MAX_COMMAND_BYTES})
    pay = limits.payload_bytes(body.get("payload"))
    if pay > limits.MAX_PAYLOAD_BYTES:
        raise ApiError(413, "too-large", f"/payload: {limits.mib(pay)}; a task's payload may "
                       f"hold {limits.mib(limits.MAX_PAYLOAD_BYTES)} at most (send a "
                       f"reference to the data instead)",
                       {"pointer": "/payload", "bytes": pay,
                        "limit_bytes": limits.MAX_PAYLOAD_BYTES})
    return cmd + pay


async def get_task(request: web.Request) -> web.Response:
    d = ctx(request).daemon
    rec = _visible(request, d.record(request.match_info["id"]))
    return reply(views.task(d, rec))


async def cancel(request: web.Request) -> web.Response:
    c = ctx(request)
    d = c.daemon
    p = principal(request)
    rec = _visible(request, d.record(request.match_info["id"]))
    body = await read_json(request, "CancelRequest") if request.body_exists else None
    reason = (body or {}).get("reason") or None
    await c.seq.submit(lambda now, ov: d.prepare_cancel(p, rec.id, now, ov, reason))
    return reply(views.task(d, rec))


async def list_tasks(request: web.Request) -> web.Response:
    d = ctx(request).daemon
    p = principal(request)
    state = str_param(request, "state", ("queued", "placed", "ended"))
    resource = str_param(request, "resource")
    user = str_param(request, "user")
    group = str_param(request, "group")
    pool = str_param(request, "pool")
    after = str_param(request, "after")
    limit = int_param(request, "limit", 100, 1, 1000)
    assert limit is not None
    acc = d.acc()
    mine = acc.admin_of(p.name) if p.is_user else frozenset()
    if p.is_user:
        _may_filter(acc, p.name, mine, user, group)
    # a department (any group with groups below it) lists its teams' tasks: a task's group
    # is always a team's
    in_group = acc.subtree(group) if group is not None else None
    start = bisect_right(d.ids, after) if after else 0
    out: list[TaskRecord] = []
    more = False
    records = d.records
    budget = limits.MAX_PAGE_BYTES
    for tid in d.ids[start:] if start else d.ids:
        rec = records[tid]
        if state is not None and rec.state != state:
            continue
        if resource is not None and rec.resource != resource:
            continue
        if user is not None and rec.user != user:
            continue
        if in_group is not None and rec.group not in in_group:
            continue
        if pool is not None and rec.pool != pool:
            continue
        if p.is_user and rec.user != p.name and rec.group not in mine:
            continue
        if len(out) == limit or budget < 0:
            more = True
            break
        out.append(rec)
        budget -= rec.data_bytes + 1024  # with the rest of its view
    many = sum(r.state == "queued" for r in out) > 20
    return reply({"tasks": [views.task(d, r, many) for r in out],
                  "next": out[-1].id if more and out else None})


PEOPLE = ("admin", "user")
SEE_TASK = "a user: their own tasks and those of groups they administer"

ROUTES = [
    Route("POST", "/v1/tasks", submit, "submitTask", PEOPLE,
          rule="a user: to their groups' compute resources; an admin: on behalf of a user, "
               "with `user`", hint="use a user's token"),
    Route("GET", "/v1/tasks", list_tasks, "listTasks", PEOPLE, rule=SEE_TASK),
    Route("GET", "/v1/tasks/{id}", get_task, "getTask", PEOPLE, rule=SEE_TASK),
    Route("POST", "/v1/tasks/{id}/cancel", cancel, "cancelTask", PEOPLE, rule=SEE_TASK),
]
