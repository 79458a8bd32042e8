"""The channel a task came through: who asked is the user, how they asked is the channel.

Every task records its channel beside its user (issue 14, part 5), in its ``submitted``
event, its API view, its ledger intervals and the usage views finance reads. The channels:

- ``cli``, ``sdk``: declared by the client with the ``X-Klique-Channel`` header (the CLI
  and the Python SDK send it); ``api`` when the header is absent (any other HTTP client).
  A client cannot declare more than that: any other value is a 400 naming the header.
- ``mcp``, ``schedule``, ``pipeline``, ``session``: set by the daemon code that submits,
  never taken from a client, so finance can trust them: ``submission.submit_as`` for a
  request's handler (the API, MCP's tools), ``prepare_as_owner`` below for the unattended
  channels, which submit inside the sequencer as their owner. Both end in
  ``Daemon.prepare_submit`` with the channel in the ``submitted`` event.

An event log written before channels existed replays its tasks as ``api``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Mapping

from klique_util.excerpt import excerpt

from kliqued.daemon.auth import Principal
from kliqued.daemon.errors import bad_request

if TYPE_CHECKING:  # core imports this module (``stored``): no import cycle at run time
    from kliqued.daemon.state.core import Daemon, Overlay, Prepared

Channel = Literal["cli", "sdk", "api", "mcp", "schedule", "pipeline", "session"]

CHANNELS: tuple[Channel, ...] = ("cli", "sdk", "api", "mcp", "schedule", "pipeline",
                                 "session")
"""Every channel, in the order docs and the OpenAPI enum list them."""

DECLARED: tuple[Channel, ...] = ("cli", "sdk")
"""What a client may declare in the header."""

SERVER: tuple[Channel, ...] = ("mcp", "schedule", "pipeline", "session")
"""Set by the daemon's own code that submits, never by a client."""

DEFAULT: Channel = "api"
"""No header: a plain HTTP client (and every task of an event log from before channels)."""

HEADER = "X-Klique-Channel"


def declared(headers: Mapping[str, str]) -> Channel:
    """The channel an HTTP request declares: ``cli`` or ``sdk`` from the header, ``api``
    without it; any other value (a server-side channel included) is a 400 naming the
    header and what it may hold."""
    value = headers.get(HEADER)
    if value is None:
        return DEFAULT
    for c in DECLARED:
        if value == c:
            return c
    why = (" (set by the daemon itself, never by a client)" if value in SERVER else "")
    raise bad_request(f"header {HEADER}: {excerpt(value)} is not a channel a client may declare"
                      f"{why}; it may be {' or '.join(DECLARED)}, or absent (api)",
                      {"header": HEADER, "allowed": list(DECLARED)})


def stored(value: object) -> Channel:
    """A channel as read back from an event or ledger row: an old row without one is
    ``api``."""
    for c in CHANNELS:
        if value == c:
            return c
    return DEFAULT


UNATTENDED: tuple[Channel, ...] = ("schedule", "pipeline")
"""The channels that send tasks as their owner with nobody at a keyboard."""


def prepare_as_owner(d: Daemon, owner: str, channel: str, fields: dict[str, Any],
                     key: str, now: int, ov: Overlay) -> Prepared:
    """The one place where an unattended channel (a schedule, a pipeline) sends a task as its
    owner: the owner's own identity (``user:<owner>`` is the actor, as if they had sent it),
    their access checked now by the same ``check_submission`` as any submission, the channel
    recorded with the task (and named in its labels, ``klique.channel``). Idempotent by
    ``key`` (the schedule's due time, the pipeline step's attempt): an ``ApiError`` when the
    owner may not send it (no longer in the group, the resource gone, their quota)."""
    assert channel in UNATTENDED
    labels = {**(fields.get("labels") or {}), "klique.channel": channel}
    body = {"resource": fields["resource"], "user": owner, "project": fields.get("project"),
            "gpus_milli": fields.get("gpus_milli"), "command": fields.get("command"),
            "payload": None, "labels": labels, "channel": channel}
    return d.prepare_submit(Principal("user", owner), body, key, now, ov)


def sent(d: Daemon, owner: str, sub: Prepared, key: str, ov: Overlay) -> str | None:
    """The task ``sub`` (from ``prepare_as_owner``) sends, or the one its key already names
    (the owner sent it, or a retry): a run or a step records it either way, so it is never
    found due again."""
    if sub.events:
        return sub.events[0].task
    text = Principal("user", owner).text
    return ov.keys.get((text, key)) or d.idem.get((text, key))
