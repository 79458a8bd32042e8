"""Sending a task as its owner: the one path of the unattended channels (a schedule, a
pipeline), inside the sequencer (channels.py says why the channel is set here).

Beside ``channels.py`` rather than in it: these take the ``Daemon`` and its prepares, which
the live state's own import of ``channels.stored`` must not pull in (issue 27).
"""

from __future__ import annotations

from typing import Any

from kliqued.daemon.auth import Principal
from kliqued.daemon.state.channels import UNATTENDED
from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.state.prepared import Overlay, Prepared


def prepare_as_owner(
    d: Daemon, owner: str, channel: str, fields: dict[str, Any], key: str, now: int, ov: Overlay
) -> Prepared:
    """The one place where an unattended channel (a schedule, a pipeline) sends a task as its
    owner: the owner's own identity (``user:<owner>`` is the actor, as if they had sent it),
    their access checked now by the same ``check_submission`` as any submission, the channel
    recorded with the task (and named in its labels, ``klique.channel``). Idempotent by
    ``key`` (the schedule's due time, the pipeline step's attempt): an ``ApiError`` when the
    owner may not send it (no longer in the group, the resource gone, their quota)."""
    assert channel in UNATTENDED
    labels = {**(fields.get("labels") or {}), "klique.channel": channel}
    body = {
        "resource": fields["resource"],
        "user": owner,
        "project": fields.get("project"),
        "gpus_milli": fields.get("gpus_milli"),
        "command": fields.get("command"),
        "payload": None,
        "labels": labels,
        "channel": channel,
    }
    return d.prepare_submit(Principal("user", owner), body, key, now, ov)


def sent(d: Daemon, owner: str, sub: Prepared, key: str, ov: Overlay) -> str | None:
    """The task ``sub`` (from ``prepare_as_owner``) sends, or the one its key already names
    (the owner sent it, or a retry): a run or a step records it either way, so it is never
    found due again."""
    if sub.events:
        return sub.events[0].task
    text = Principal("user", owner).text
    return ov.keys.get((text, key)) or d.idem.get((text, key))
