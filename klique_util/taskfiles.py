"""The files a running task shares with its worker, named in its environment: its
checkpoint mark and its preemption notice (docs/lending.md, "Checkpoints and the preemption
notice").

- ``$KLIQUE_CHECKPOINT_FILE``: touching it (or writing anything into it) says "my work up
  to now is saved". The worker watches the file's modification time and relays each new one
  to the control plane, which then counts a preemption's lost work from it
  (lending.md, ``victims: least_lost_work``). The SDK's ``checkpoint()`` and ``kliqued
  checkpoint`` do the touching; a shell task can run ``touch "$KLIQUE_CHECKPOINT_FILE"``.
- ``$KLIQUE_PREEMPT_FILE``: the worker writes it (one JSON object: ``reason``, ``text``,
  ``grace_s``, ``deadline``) just before it sends SIGTERM to a task it stops, so a task's
  SIGTERM handler can tell a preemption (save now, before ``deadline``) from other ends.

Here, not in the SDK or the worker: both sides use it (the task through the SDK and the
CLI, the worker when it watches and writes), and neither may import the other (the import
contracts, docs/architecture.md). Standard library only.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

CHECKPOINT_ENV = "KLIQUE_CHECKPOINT_FILE"
PREEMPT_ENV = "KLIQUE_PREEMPT_FILE"


class NotInTask(Exception):
    """The caller runs outside a Klique task (its environment names no checkpoint file)."""


@dataclass(frozen=True, slots=True)
class Notice:
    """A stop the worker announced before its SIGTERM."""

    reason: str
    """``preempted``, ``budget``, ``cancelled``, ``idle``, ``shutdown``: why it stops."""
    text: str
    """As a person reads it (``reclaimed by team-a``)."""
    grace_s: float
    """SIGTERM to SIGKILL: how long the task has to save its work."""
    deadline: str
    """When the SIGKILL comes at the latest (RFC 3339, the worker's clock)."""

    def to_json(self) -> str:
        return json.dumps(
            {
                "reason": self.reason,
                "text": self.text,
                "grace_s": self.grace_s,
                "deadline": self.deadline,
            },
            separators=(",", ":"),
        )


def checkpoint(environ: Mapping[str, str] | None = None) -> float:
    """Marks a checkpoint now: sets the checkpoint file's time to now (creating it). Returns
    that time (seconds since the epoch). Raises :class:`NotInTask` outside a task, and
    ``OSError`` if the file cannot be written."""
    path = (environ if environ is not None else os.environ).get(CHECKPOINT_ENV)
    if not path:
        raise NotInTask(
            f"{CHECKPOINT_ENV} is not set: a checkpoint is marked from inside a "
            f"Klique task, whose worker sets it (run this in the task's command)"
        )
    now = time.time()
    Path(path).touch()
    os.utime(path, (now, now))  # an existing file gets this moment exactly
    return now


def read_notice(environ: Mapping[str, str] | None = None) -> Notice | None:
    """The preemption notice the worker wrote for this task, or None (no stop announced,
    or outside a task)."""
    path = (environ if environ is not None else os.environ).get(PREEMPT_ENV)
    if not path:
        return None
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return Notice(
            str(data["reason"]),
            str(data.get("text") or ""),
            float(data.get("grace_s") or 0),
            str(data.get("deadline") or ""),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
