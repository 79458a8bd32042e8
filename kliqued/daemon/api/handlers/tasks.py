"""Tasks: submit, list, get, cancel.

A submission is checked against the estate (``check_submission``) before anything is logged:
a refused one is a 422 with the engine's own words and leaves no trace. A task the caller may
not see is a 404, as if it did not exist: task ids are not disclosed to other users.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Any, Iterator, Sequence

from aiohttp import web

from kliqued.daemon import limits
from kliqued.daemon.api import views
from kliqued.daemon.state import channels, history
from kliqued.daemon.auth import Access, Principal
from kliqued.daemon.state.channels import Channel
from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.errors import forbidden, not_found
from kliqued.daemon.api.openapi import submission_surely_valid
from kliqued.daemon.records import TaskRecord
from kliqued.daemon.api.request import Context, ctx, principal, read_json, reply
from kliqued.daemon.api.routes import Route
from kliqued.daemon.api.submission import submit_as
from kliqued.daemon.api.dryrun import dry_run_as
from kliqued.daemon.api.handlers.params import int_param, str_param


def _visible(request: web.Request, rec: TaskRecord) -> TaskRecord:
    """``rec``, if the caller may see it (routes ``SEE_TASK``); a 404 otherwise."""
    return visible_task(ctx(request).daemon, principal(request), rec.id)


def visible_task(d: Daemon, p: Principal, task_id: str) -> TaskRecord:
    """Task ``task_id`` if ``p`` may see it (routes ``SEE_TASK``); a 404 otherwise, the same
    as for a task that does not exist: task ids are not disclosed to other users."""
    rec = d.record(task_id)
    if not d.acc().sees_task(p, rec.user, rec.group):
        raise not_found(f"no task {rec.id}")
    return rec


def _may_filter(
    acc: Access, name: str, mine: frozenset[str], user: str | None, group: str | None
) -> None:
    """A filter on tasks the caller may not see is a 403 saying so, not an empty list that
    reads as "no tasks" (issue 10): another user's tasks are for their groups' admins."""
    if user is not None and user != name and not acc.groups_of(user) & mine:
        raise forbidden(
            f"{name} may not see {user}'s tasks: only the admins of {user}'s "
            "groups and platform admins may"
        )
    if group is not None and group not in mine and group not in acc.groups_of(name):
        raise forbidden(
            f"{name} may not see group {group}'s tasks: {name} is neither in it "
            "nor one of its admins"
        )


async def submit(request: web.Request) -> web.Response:
    body = await read_json(request, "TaskSubmission", submission_surely_valid)
    if body.get("dry_run"):  # issue 31: the same checks, nothing stored
        return reply(
            dry_run_as(
                ctx(request),
                principal(request),
                body,
                channels.declared(request.headers),
                checked=True,
            )
        )
    status, rec = await submit_as(
        ctx(request),
        principal(request),
        body,
        channels.declared(request.headers),
        request.headers.get("Idempotency-Key"),
        checked=True,
    )
    return reply(views.task(ctx(request).daemon, rec), status)


async def get_task(request: web.Request) -> web.Response:
    c = ctx(request)
    await history.recall(c.store, c.daemon, request.match_info["id"])
    return reply(
        views.task(c.daemon, visible_task(c.daemon, principal(request), request.match_info["id"]))
    )


async def cancel(request: web.Request) -> web.Response:
    c = ctx(request)
    p = principal(request)
    await history.recall(c.store, c.daemon, request.match_info["id"])
    rec = visible_task(c.daemon, p, request.match_info["id"])  # before reading the body
    body = await read_json(request, "CancelRequest") if request.body_exists else None
    reason = (body or {}).get("reason") or None
    return reply(await cancel_as(c, p, rec.id, reason, channels.declared(request.headers)))


async def cancel_as(
    c: Context, p: Principal, task_id: str, reason: str | None, channel: Channel
) -> dict[str, Any]:
    """``cancelTask`` for ``p`` through ``channel``: a task they may not see is a 404;
    cancelling an ended task changes nothing (idempotent). Returns the task's view."""
    d = c.daemon
    await history.recall(c.store, d, task_id)
    rec = visible_task(d, p, task_id)
    await c.seq.submit(lambda now, ov: d.prepare_cancel(p, rec.id, now, ov, reason, channel))
    return views.task(d, rec)


async def list_tasks(request: web.Request) -> web.Response:
    c = ctx(request)
    d = c.daemon
    p = principal(request)
    state = str_param(request, "state", ("queued", "placed", "ended"))
    resource = str_param(request, "resource")
    user = str_param(request, "user")
    group = str_param(request, "group")
    pool = str_param(request, "pool")
    after = str_param(request, "after")
    newest = str_param(request, "order", ("oldest", "newest")) == "newest"
    limit = int_param(request, "limit", 100, 1, 1000)
    assert limit is not None
    acc = d.acc()
    mine = acc.admin_of(p.name) if p.is_user else frozenset()
    if p.is_user:
        _may_filter(acc, p.name, mine, user, group)
    # a department (any group with groups below it) lists its teams' tasks: a task's group
    # is always a team's
    in_group = acc.subtree(group) if group is not None else None
    # Evicted tasks (ended, history.py) come from the table, merged in id order with
    # those in memory; an id in both (a replay evicting again) is shown once, from memory.
    stored: list[TaskRecord] = []
    if state in (None, "ended"):
        stored = await c.store.read(
            lambda cur: history.page(
                cur,
                after,
                limit + 1,
                resource=resource,
                user=user,
                groups=in_group,
                pool=pool,
                visible_user=p.name if p.is_user else None,
                visible_groups=mine,
                newest=newest,
            )
        )
    if newest:
        end = bisect_left(d.ids, after) if after else len(d.ids)
        ids: Sequence[str] = d.ids[end - 1 :: -1] if end else []
    else:
        start = bisect_right(d.ids, after) if after else 0
        ids = d.ids[start:] if start else d.ids
    out: list[TaskRecord] = []
    more = False
    budget = limits.MAX_PAGE_BYTES
    for rec in _merged(d, ids, stored, newest):
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
    return reply(
        {
            "tasks": [views.task(d, r, many) for r in out],
            "next": out[-1].id if more and out else None,
        }
    )


def _merged(
    d: Daemon, ids: Sequence[str], stored: list[TaskRecord], newest: bool = False
) -> Iterator[TaskRecord]:
    """The records of ``ids`` in memory and ``stored`` (evicted), in id order (``newest``:
    both are newest first, and so is the result)."""
    records = d.records
    i = 0
    for tid in ids:
        rec = records.get(tid)
        if rec is None:
            continue  # evicted since: in ``stored`` if it is on this page
        while i < len(stored) and (stored[i].id > tid if newest else stored[i].id < tid):
            if stored[i].id not in records:
                yield stored[i]
            i += 1
        if i < len(stored) and stored[i].id == tid:
            i += 1
        yield rec
    for r in stored[i:]:
        if r.id not in records:
            yield r


PEOPLE = ("admin", "user")
SEE_TASK = "a user: their own tasks and those of groups they administer"

ROUTES = [
    Route(
        "POST",
        "/v1/tasks",
        submit,
        "submitTask",
        PEOPLE,
        rule="a user: to their groups' compute resources; an admin: on behalf of a user, "
        "with `user`",
        hint="use a user's token",
    ),
    Route("GET", "/v1/tasks", list_tasks, "listTasks", PEOPLE, rule=SEE_TASK),
    Route("GET", "/v1/tasks/{id}", get_task, "getTask", PEOPLE, rule=SEE_TASK),
    Route("POST", "/v1/tasks/{id}/cancel", cancel, "cancelTask", PEOPLE, rule=SEE_TASK),
]
