"""The worker's side of a task's checkpoint mark and preemption notice
(klique_util/taskfiles.py; docs/lending.md, "Checkpoints and the preemption notice").

Both files sit beside the task's log in the worker's state directory (like its outputs,
workers/outputs.py), one pair per attempt, removed when the attempt starts (a file of an
earlier attempt is not this one's), each in a directory of its own per attempt:

    STATE_DIR/logs/<key>.log.task/checkpoint     the task's mark (and its ``outputs``)
    STATE_DIR/logs/<key>.log.notice/preempt      the worker's notice

Two directories, not the log directory: a container mounts just these (the first writable,
the notice read-only: workers/executors/container.py), never the other tasks' logs. The
process executor shares the worker's file system; a batch job (Slurm, PBS, LSF) sees them
where it sees its log: the state directory on a file system its nodes share
(docs/executors.md).

- ``prepare``: an earlier attempt's files gone, the two directories there (0700).
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


def task_dir(log_path: str) -> str:
    """What the task writes: its checkpoint mark, its outputs."""
    return f"{log_path}.task"


def notice_dir(log_path: str) -> str:
    """What the worker writes for the task to read: the notice."""
    return f"{log_path}.notice"


def checkpoint_path(log_path: str) -> str:
    return os.path.join(task_dir(log_path), "checkpoint")


def notice_path(log_path: str) -> str:
    return os.path.join(notice_dir(log_path), "preempt")


def task_env(log_path: str) -> dict[str, str]:
    """The two variables a task gets (set by the worker, after the lease's own ``env``);
    their directories are made here, so that the paths handed out can be used at once."""
    _make_dirs(log_path)
    return {CHECKPOINT_ENV: checkpoint_path(log_path), PREEMPT_ENV: notice_path(log_path)}


def _make_dirs(log_path: str) -> None:
    for d in (task_dir(log_path), notice_dir(log_path)):
        os.makedirs(d, mode=0o700, exist_ok=True)


def clear(log_path: str) -> None:
    """Removes an attempt's files and their directories (once its task is forgotten)."""
    for path in (checkpoint_path(log_path), notice_path(log_path)):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    for d in (task_dir(log_path), notice_dir(log_path)):
        try:
            os.rmdir(d)
        except OSError:
            pass  # absent, or holds what the task left (its outputs): pruned with the log


def prepare(log_path: str) -> None:
    """Before an attempt starts: the earlier attempt's files gone, both directories there."""
    clear(log_path)
    _make_dirs(log_path)


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
    notice = Notice(
        reason, text, grace_s, deadline.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    )
    write_atomic(notice_path(log_path), notice.to_json(), fsync=False, mkdir=True)
    return notice
