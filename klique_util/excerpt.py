"""What a refusal may say of the caller's input: a short, escaped excerpt, never the input.

An error message that quotes the value it refuses is the clearest there is, until the value
is 200 kB: the refusal then echoes it whole (an MCP tool error did, an API 400 up to 2 KB),
costs the bandwidth twice, fills logs and an agent's context, and carries whatever control
characters the caller chose to a terminal. So every message that names a caller's value
goes through :func:`excerpt`, and :func:`clip` bounds a whole message as a last resort.
"""

from __future__ import annotations

import json

EXCERPT = 80
"""Characters of a caller's value a message may quote."""
MESSAGE = 1000
"""Characters of a refusal's message, whatever it quotes."""


def excerpt(value: object, limit: int = EXCERPT, quoted: bool = True) -> str:
    """``value`` quoted and escaped (control characters, quotes, backslashes as JSON writes
    them), cut to ``limit`` characters with an ellipsis and its full length when longer:
    ``'abc'``, ``'AAAA…' (200000 characters)``. ``quoted=False`` for a name or an id where
    the message has always shown it bare (``no task t-01…``)."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    escaped = json.dumps(text[:limit], ensure_ascii=False)[1:-1]
    q = "'" if quoted else ""
    if quoted:
        escaped = escaped.replace("'", "\\'")
    if len(text) <= limit:
        return f"{q}{escaped}{q}"
    return f"{q}{escaped}…{q} ({len(text)} characters)"


def clip(message: str, limit: int = MESSAGE) -> str:
    """``message`` when at most ``limit`` characters, else its start, an ellipsis and its
    length: a bound on a refusal that quotes more than it should."""
    if len(message) <= limit:
        return message
    return f"{message[:limit]}… ({len(message)} characters)"
