"""The session tunnel's wire format, shared by the daemon (kliqued/daemon/fleet/tunnels.py) and the
worker (workers/tunnel.py): why a module of its own is that the two sides may not import each
other (docs/architecture.md, "Layers").

The worker opens one WebSocket to the daemon per running session (outbound, over the
worker's usual HTTPS); the daemon sends the session's HTTP requests and WebSocket messages
over it as JSON text frames, each with the id of its exchange:

- ``{"op": "http", "id", "method", "path", "headers", "body", "stream": true}``, the request
  (body base64). Its answer is streamed: a head ``{"op": "http", "id", "status", "headers",
  "stream": true}``, the body in frames ``{"op": "http-data", "id", "data"}`` of at most
  ``CHUNK`` bytes each (base64), then ``{"op": "http-end", "id"}``. The worker sends at
  most ``WINDOW`` bytes of body the daemon has not acknowledged with ``{"op": "http-ack",
  "id", "n"}`` (written to the client), so neither side holds more of a response than
  that, however large it is; ``{"op": "http-cancel", "id"}`` from the daemon stops it (the
  client went away). A request without ``"stream"`` (a daemon of before streaming) is
  answered whole, ``{"op": "http", "id", "status", "headers", "body"}``, up to
  ``MAX_BODY``;
- ``{"op": "ws-open", "id", "path", "headers"}``, answered ``{"op": "ws-open", "id"}``;
  then ``{"op": "ws-msg", "id", "text" | "data"}`` both ways and ``{"op": "ws-close", "id",
  "code"}`` (the close code passed on, when known);
- ``{"op": "error", "id", "message"}``: the worker could not reach the app, or the app's
  answer broke off (after a head: the daemon cuts the client's connection, so the client
  sees an incomplete response, never a short one that looks whole).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from typing import Any

MAX_FRAME = 32 * 1024 * 1024
"""The largest frame either side accepts: a relayed WebSocket message of ``MAX_WS_MESSAGE``,
base64'ed and quoted, fits; a frame that would not is never sent (``FrameTooLarge``)."""
MAX_WS_MESSAGE = 16 * 1024 * 1024
"""The largest WebSocket message relayed, either way; a larger one closes that WebSocket with
1009 (message too big), the tunnel and its other exchanges carry on."""
MAX_BODY = 16 * 1024 * 1024
"""The largest response body answered whole, to a daemon that does not ask for a stream (a
bigger one is a 502 naming the limit). Streamed answers have no size limit."""
CHUNK = 256 * 1024
"""The most body bytes in one ``http-data`` frame."""
WINDOW = 1024 * 1024
"""The most body bytes of one response in flight, sent by the worker and not yet written to
the client by the daemon."""

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "sec-websocket-key",
        "sec-websocket-version",
        "sec-websocket-extensions",
        "sec-websocket-accept",
        "sec-websocket-protocol",
    }
)
"""Headers that belong to one connection (RFC 9110 7.6.1) or that the relay recomputes."""


class FrameTooLarge(ValueError):
    """A frame longer than ``MAX_FRAME``: the other side would close the whole tunnel on it,
    so it is refused before it is sent."""


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str | None) -> bytes:
    return base64.b64decode(text or "")


def frame(msg: dict[str, Any]) -> str:
    """``msg`` as one text frame (ASCII JSON); ``FrameTooLarge`` when the other side would
    refuse it."""
    text = json.dumps(msg, separators=(",", ":"))
    if len(text) > MAX_FRAME:
        raise FrameTooLarge(
            f"a {msg.get('op')} frame of {len(text)} bytes is more than the "
            f"tunnel's {MAX_FRAME // (1024 * 1024)} MiB"
        )
    return text


def close_code(code: object) -> int:
    """``code`` when a WebSocket may send it in a close frame (RFC 6455 7.4), else 1000: the
    app's close code passed on, never one only a peer's stack may report (1005, 1006)."""
    if (
        isinstance(code, int)
        and (1000 <= code <= 1014 or 3000 <= code < 5000)
        and code not in (1004, 1005, 1006)
    ):
        return code
    return 1000


def forwardable(
    headers: Iterable[tuple[str, str]], drop: frozenset[str] = frozenset()
) -> list[list[str]]:
    """The end-to-end headers of ``headers`` (and none named in ``drop``), as JSON pairs."""
    return [[k, v] for k, v in headers if k.lower() not in HOP_BY_HOP and k.lower() not in drop]
