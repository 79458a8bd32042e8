"""Submitting a task as a user through a channel: the one path a request takes.

``submit_as`` is what ``POST /v1/tasks`` runs, and what MCP's ``submit_task`` calls to submit
as the user it acts for: the body's shape checked (``TaskSubmission``), then every check of a
submission in one place (``state.submission.from_body``: sizes, on whose behalf, the key, the
estate's ``check_submission``), then the same sequencer and the same ``submitted`` event, with
the channel recorded beside the user. What goes down to the state is the typed
``Submission``, never the body. No channel gets a rule of its own (issue 14: "adding a
channel changes no rule"); sessions and the unattended channels make their ``Submission``
with the same ``from_body`` (or, before they submit, ask the same ``check``).
"""

from __future__ import annotations

from typing import Any

from kliqued.daemon.state import history
from kliqued.daemon.auth import Principal
from kliqued.daemon.state.channels import CHANNELS, Channel
from kliqued.daemon.state.submission import Submission, from_body
from kliqued.daemon.api.inputs import check_tree
from kliqued.daemon.api.openapi import submission_surely_valid
from kliqued.daemon.records import TaskRecord
from kliqued.daemon.api.request import Context, valid


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
    passed the HTTP edge's shape check (``read_json``); MCP leaves it False and its body is
    checked here the same way."""
    if channel not in CHANNELS:
        raise ValueError(f"unknown channel {channel!r}")  # a bug in the caller, not input
    if not checked:
        check_tree(body, "TaskSubmission")
        body = valid(body, "TaskSubmission", submission_surely_valid)
    d = c.daemon
    held = key is not None and (p.text, key) in d.idem
    evicted = key is not None and not held and d.eviction.may_hold(p.text, key)
    sub = from_body(d.idx(), p, body, channel, key, retry=held or evicted)
    if evicted:
        assert key is not None
        # a retry of a task evicted long after it ended (history.py): the same answer
        old = await c.store.read(lambda cur: history.by_key(cur, p.text, key))
        if old is not None:
            d.recalled.put(old)
            return 200, old
        sub = from_body(d.idx(), p, body, channel, key)  # no task holds the key: a new one
    return await submit(c, p, sub)


async def submit(c: Context, p: Principal, sub: Submission) -> tuple[int, TaskRecord]:
    """Sends a checked ``sub`` through the sequencer as ``p``: ``(201, record)`` for a new
    task, ``(200, record)`` for the one its idempotency key already names."""
    d = c.daemon
    status, task_id = await c.seq.submit(lambda now, ov: d.prepare_submit(p, sub, now, ov))
    rec = await history.recall(c.store, d, task_id)
    assert rec is not None  # in memory, or its row committed before it left
    return status, rec
