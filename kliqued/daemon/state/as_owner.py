"""Sending a task as its owner: the one path of the unattended channels (a schedule, a
pipeline), inside the sequencer (channels.py says why the channel is set here).

Beside ``channels.py`` rather than in it: these take the ``Daemon`` and its prepares, which
the live state's own import of ``channels.stored`` must not pull in (issue 27).
"""

from __future__ import annotations

from typing import Mapping

from kliqued.daemon.auth import Principal
from kliqued.daemon.state.channels import UNATTENDED, Channel
from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.state.prepared import Overlay, Prepared
from kliqued.daemon.state.submission import Submission


def prepare_as_owner(
    d: Daemon,
    owner: str,
    channel: Channel,
    key: str,
    now: int,
    ov: Overlay,
    *,
    resource: str,
    project: str | None,
    gpus_milli: int | None,
    command: list[str] | None,
    labels: Mapping[str, str],
) -> Prepared:
    """The one place where an unattended channel (a schedule, a pipeline) sends a task as its
    owner: a ``Submission`` with the owner's own identity (``user:<owner>`` is the actor, as
    if they had sent it), their access checked now by the same ``submission.refusal`` as any
    submission (in ``prepare_submit``), the channel recorded with the task (and named in its
    labels, ``klique.channel``). Its fields were checked by ``submission.from_body`` when the
    schedule was made, or by the pipeline file's checks. Idempotent by ``key`` (the
    schedule's due time, the pipeline step's attempt): an ``ApiError`` when the owner may not
    send it (no longer in the group, the resource gone, their quota)."""
    assert channel in UNATTENDED
    sub = Submission(
        resource=resource,
        user=owner,
        project=project,
        gpus_milli=gpus_milli,
        command=command,
        labels={**labels, "klique.channel": channel},
        channel=channel,
        idempotency_key=key,
    )
    return d.prepare_submit(Principal("user", owner), sub, now, ov)


def sent(d: Daemon, owner: str, sub: Prepared, key: str, ov: Overlay) -> str | None:
    """The task ``sub`` (from ``prepare_as_owner``) sends, or the one its key already names
    (the owner sent it, or a retry): a run or a step records it either way, so it is never
    found due again."""
    if sub.events:
        return sub.events[0].task
    text = Principal("user", owner).text
    return ov.keys.get((text, key)) or d.idem.get((text, key))
