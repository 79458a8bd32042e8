"""The worker's side of a task's checkpoint mark and preemption notice
(klique_util/taskfiles.py; docs/lending.md, "Checkpoints and the preemption notice").

Both files sit beside the task's log in the worker's state directory (like its outputs,
workers/outputs.py), one pair per attempt, removed when the attempt starts (a file of an
earlier attempt is not this one's). The process executor shares the worker's file system;
a Slurm job sees them only when the state directory is on a file system its nodes share
(docs/executors.md).

- ``changed``: the checkpoint file's modification time, if it moved since the last look.
  The supervisor looks every 0.25 s; a new time goes to the control plane with the next
  heartbeat, which the worker then sends at once (fenced by the lease's epoch there).
- ``write_notice``: the notice, written atomically just before the SIGTERM of a stop.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone

from klique_util.files import write_atomic
from klique_util.taskfiles import CHECKPOINT_ENV, PREEMPT_ENV, Notice


def checkpoint_path(log_path: str) -> str:
    return f"{log_path}.checkpoint"


def notice_path(log_path: str) -> str:
    return f"{log_path}.preempt"


def task_env(log_path: str) -> dict[str, str]:
    """The two variables a task gets (set by the worker, after the lease's own ``env``)."""
    return {CHECKPOINT_ENV: checkpoint_path(log_path), PREEMPT_ENV: notice_path(log_path)}


def clear(log_path: str) -> None:
    """Removes an earlier attempt's files (before this attempt starts)."""
    for path in (checkpoint_path(log_path), notice_path(log_path)):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def changed(log_path: str, seen_ns: int | None) -> int | None:
    """The checkpoint file's modification time (ns since the epoch) when it differs from
    ``seen_ns``, else None (unchanged, or no file: the task never checkpointed)."""
    try:
        ns = os.stat(checkpoint_path(log_path)).st_mtime_ns
    except OSError:
        return None
    return ns if ns != seen_ns else None


def rfc3339(ns: int) -> str:
    at = datetime.fromtimestamp(ns / 1e9, timezone.utc)
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def write_notice(log_path: str, reason: str, text: str, grace_s: float) -> Notice:
    """Writes the stop's notice for the task (before its SIGTERM). Raises ``OSError`` when
    the state directory cannot be written (the stop goes on without it)."""
    deadline = datetime.now(timezone.utc) + timedelta(seconds=grace_s)
    notice = Notice(reason, text, grace_s,
                    deadline.isoformat(timespec="milliseconds").replace("+00:00", "Z"))
    write_atomic(notice_path(log_path), notice.to_json(), fsync=False, mkdir=False)
    return notice
