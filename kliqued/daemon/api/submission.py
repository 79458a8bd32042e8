"""Submitting a task as a user through a channel: the one path every channel takes.

``submit_as`` is what ``POST /v1/tasks`` runs, and what the daemon's own channels (MCP,
schedules, pipelines, sessions) call to submit as the user they act for: the same checks
(the estate's ``check_submission``, sizes, the per-user quota, idempotency), the same
sequencer, the same ``submitted`` event, with the channel recorded beside the user. No
channel gets a rule of its own (issue 14: "adding a channel changes no rule").
"""

from __future__ import annotations

from typing import Any

from kliqued.engine import SubmissionError, check_submission

from kliqued.daemon import limits
from kliqued.daemon.state.pipelines import submittable
from kliqued.daemon.state import history
from kliqued.daemon.auth import Principal
from kliqued.daemon.state.channels import CHANNELS, Channel
from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.errors import ApiError, bad_request, forbidden
from kliqued.daemon.api.inputs import check_tree
from kliqued.daemon.api.openapi import submission_surely_valid
from kliqued.daemon.records import TaskRecord
from kliqued.daemon.api.request import Context, valid
from kliqued.daemon.units import to_milli


async def submit_as(
    c: Context,
    p: Principal,
    body: Any,
    channel: Channel,
    key: str | None = None,
    *,
    checked: bool = False,
) -> tuple[int, TaskRecord]:
    """Submits ``body`` (a ``TaskSubmission``) for principal ``p`` through ``channel``.

    Returns ``(201, record)`` for a new task, ``(200, record)`` for a retry with the same
    idempotency ``key``; raises ``ApiError`` (400 a wrong body, 403, 413, 422 refused by the
    estate, 429 over the user's quota) with nothing submitted. ``checked``: the body already
    passed the HTTP edge's checks (``read_json``); the daemon's own channels leave it False
    and their bodies are checked here the same way."""
    if channel not in CHANNELS:
        raise ValueError(f"unknown channel {channel!r}")  # a bug in the caller, not input
    if not checked:
        check_tree(body, "TaskSubmission")
        body = valid(body, "TaskSubmission", submission_surely_valid)
    d = c.daemon
    if not body.get("command") and body.get("payload") is None:
        raise ApiError(
            422,
            "invalid-task",
            "a task needs `command` (a non-empty list of "
            "arguments) or `payload` (data for its channel); both are missing",
            {"fields": ["command", "payload"]},
        )
    data_bytes = _sized(body)
    if "klique.channel" in (body.get("labels") or {}):
        raise ApiError(
            422,
            "invalid-field",
            "labels.klique.channel: the control plane sets "
            "a task's channel (a session is started with POST /v1/sessions)",
            {"field": "labels.klique.channel"},
        )
    user = body.get("user")
    if p.is_admin:
        if not user:
            raise bad_request("an admin sends work only on behalf of a user: give `user`")
    elif user is None:
        user = p.name
    elif user != p.name:
        raise forbidden("only an admin may send work on behalf of another user")
    if key is not None and not 1 <= len(key) <= 256:
        raise bad_request("Idempotency-Key must be 1 to 256 characters")
    try:
        gpus = None if body.get("gpus") is None else to_milli(body["gpus"])
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    fields = {
        "resource": body["resource"],
        "user": user,
        "project": body.get("project"),
        "gpus_milli": gpus,
        "command": body.get("command"),
        "payload": body.get("payload"),
        "labels": body.get("labels") or {},
        "channel": channel,
    }
    if key is not None and (p.text, key) not in d.idem and d.eviction.may_hold(p.text, key):
        # a retry of a task evicted long after it ended (history.py): the same answer
        old = await c.store.read(lambda cur: history.by_key(cur, p.text, key))
        if old is not None:
            d.recalled.put(old)
            return 200, old
    if key is None or (p.text, key) not in d.idem:
        try:  # fail fast; the sequencer checks again against the estate of the commit
            check_submission(
                d.idx(), fields["resource"], user, fields["project"], gpus, require_project=True
            )
        except SubmissionError as exc:
            raise ApiError(
                422, "submission-refused", with_options(d, user, body, exc), {"field": exc.field}
            ) from None
    status, task_id = await c.seq.submit(
        lambda now, ov: d.prepare_submit(p, fields, key, now, ov, data_bytes)
    )
    rec = await history.recall(c.store, d, task_id)
    assert rec is not None  # in memory, or its row committed before it left
    return status, rec


def with_options(d: Daemon, user: str, body: dict, exc: SubmissionError) -> str:
    """A resource the user may not send to names the ones they may (issue 10)."""
    cr = d.idx().resources.get(body["resource"])
    if cr is not None and user in d.idx().users.get(cr.group, ()):
        return str(exc)
    mine = submittable(d, user)
    return f"{exc}; {user} may submit to " + (", ".join(mine) if mine else "nothing")


def _sized(body: dict) -> int:
    """The task's data bytes; a command or payload over its cap is a 413 naming it."""
    cmd = limits.command_bytes(body.get("command"))
    if cmd > limits.MAX_COMMAND_BYTES:
        raise ApiError(
            413,
            "too-large",
            f"/command: {limits.mib(cmd)}; a task's command may "
            f"hold {limits.mib(limits.MAX_COMMAND_BYTES)} at most (put data in a "
            f"file the task reads)",
            {"pointer": "/command", "bytes": cmd, "limit_bytes": limits.MAX_COMMAND_BYTES},
        )
    pay = limits.payload_bytes(body.get("payload"))
    if pay > limits.MAX_PAYLOAD_BYTES:
        raise ApiError(
            413,
            "too-large",
            f"/payload: {limits.mib(pay)}; a task's payload may "
            f"hold {limits.mib(limits.MAX_PAYLOAD_BYTES)} at most (send a "
            f"reference to the data instead)",
            {"pointer": "/payload", "bytes": pay, "limit_bytes": limits.MAX_PAYLOAD_BYTES},
        )
    return cmd + pay
