"""The session tunnel's wire format, shared by the daemon (kliqued/daemon/tunnels.py) and the
worker (workers/tunnel.py): why a module of its own is that the two sides may not import each
other (docs/architecture.md, "Layers").

The worker opens one WebSocket to the daemon per running session (outbound, over the
worker's usual HTTPS); the daemon sends the session's HTTP requests and WebSocket messages
over it as JSON text frames, each with the id of its exchange:

- ``{"op": "http", "id", "method", "path", "headers", "body"}`` and the answer
  ``{"op": "http", "id", "status", "headers", "body"}`` (bodies base64);
- ``{"op": "ws-open", "id", "path", "headers"}``, answered ``{"op": "ws-open", "id"}``;
  then ``{"op": "ws-msg", "id", "text" | "data"}`` both ways and ``{"op": "ws-close", "id"}``;
- ``{"op": "error", "id", "message"}``: the worker could not reach the app.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable

MAX_FRAME = 32 * 1024 * 1024
"""The largest frame either side accepts: a response body of up to 16 MiB, base64'ed."""
MAX_BODY = 16 * 1024 * 1024
"""The largest response body relayed (a bigger one is a 502 naming the limit)."""

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
    "trailer", "transfer-encoding", "upgrade", "host", "content-length",
    "sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions",
    "sec-websocket-accept", "sec-websocket-protocol"})
"""Headers that belong to one connection (RFC 9110 7.6.1) or that the relay recomputes."""


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str | None) -> bytes:
    return base64.b64decode(text or "")


def forwardable(headers: Iterable[tuple[str, str]],
                drop: frozenset[str] = frozenset()) -> list[list[str]]:
    """The end-to-end headers of ``headers`` (and none named in ``drop``), as JSON pairs."""
    return [[k, v] for k, v in headers
            if k.lower() not in HOP_BY_HOP and k.lower() not in drop]
