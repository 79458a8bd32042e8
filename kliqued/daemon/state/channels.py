"""The channel a task came through: who asked is the user, how they asked is the channel.

Every task records its channel beside its user (issue 14, part 5), in its ``submitted``
event, its API view, its ledger intervals and the usage views finance reads. The channels:

- ``cli``, ``sdk``: declared by the client with the ``X-Klique-Channel`` header (the CLI
  and the Python SDK send it); ``api`` when the header is absent (any other HTTP client).
  A client cannot declare more than that: any other value is a 400 naming the header.
- ``mcp``, ``schedule``, ``pipeline``, ``session``: set by the daemon code that submits,
  never taken from a client, so finance can trust them: ``submission.submit_as`` for a
  request's handler (the API, MCP's tools), ``as_owner.prepare_as_owner`` for the unattended
  channels, which submit inside the sequencer as their owner, a session's start for
  ``session``. All end in ``Daemon.prepare_submit`` with a ``submission.Submission`` whose
  channel the ``submitted`` event records.

An event log written before channels existed replays its tasks as ``api``.
"""

from __future__ import annotations

from typing import Mapping

from klique_util.excerpt import excerpt

from kliqued.api_models.channels import CHANNELS as CHANNELS
from kliqued.api_models.channels import Channel as Channel
from kliqued.daemon.errors import bad_request

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
    why = " (set by the daemon itself, never by a client)" if value in SERVER else ""
    raise bad_request(
        f"header {HEADER}: {excerpt(value)} is not a channel a client may declare"
        f"{why}; it may be {' or '.join(DECLARED)}, or absent (api)",
        {"header": HEADER, "allowed": list(DECLARED)},
    )


def stored(value: object) -> Channel:
    """A channel as read back from an event or ledger row: an old row without one is
    ``api``."""
    for c in CHANNELS:
        if value == c:
            return c
    return DEFAULT


UNATTENDED: tuple[Channel, ...] = ("schedule", "pipeline")
"""The channels that send tasks as their owner with nobody at a keyboard."""
