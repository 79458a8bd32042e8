"""How much task data one request and one user may store, and how much one page may carry.

The daemon keeps every task's command and payload in memory (records) and in the event log,
and sends them back in listings: without these caps one user could fill the daemon's memory
and make every listing, and every request queued behind it, slow (issue 9, finding 6).
"""

from __future__ import annotations

import json
from typing import Any

MAX_COMMAND_BYTES = 64 * 1024
"""A task's command: its arguments' UTF-8 bytes, one more each (the NUL of argv). Linux
allows 128 KiB for one argument and 2 MiB for all with the environment."""

MAX_PAYLOAD_BYTES = 64 * 1024
"""A task's payload, as compact JSON in UTF-8."""

MAX_USER_BYTES = 16 * 1024 * 1024
"""The commands and payloads of one user's tasks not yet ended, together (at least 128 tasks
at both maximums, tens of thousands of ordinary ones). A submission over it is a 429 until
some of them end."""

MAX_PAGE_BYTES = 4 * 1024 * 1024
"""A listing page stops (with a ``next`` cursor) once its tasks' or events' data passes
this, whatever ``limit`` asked: one page never costs the daemon more than a few MiB."""


def command_bytes(command: list[str] | None) -> int:
    return sum(len(a.encode("utf-8")) + 1 for a in command) if command else 0


def payload_bytes(payload: Any) -> int:
    if payload is None:
        return 0
    return len(json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))


def task_bytes(command: list[str] | None, payload: Any) -> int:
    """What a task's data costs against its user's ``MAX_USER_BYTES``."""
    return command_bytes(command) + payload_bytes(payload)


def mib(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MiB" if n >= 1024 * 1024 else f"{n / 1024:.1f} KiB"
