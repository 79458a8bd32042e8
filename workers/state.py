"""The worker's state directory: its stable id, a lock, one record per task, the task logs.

    STATE_DIR/worker-id             the stable worker id (created once)
    STATE_DIR/worker-key            the worker's secret key, 0600 (created once): proves to
                                    the control plane that this worker owns its id and leases
    STATE_DIR/lock                  flock'ed by the running worker: one worker per state dir
    STATE_DIR/tasks/<key>.json      one record per task on this worker (written atomically)
    STATE_DIR/logs/<key>.log        the task's stdout+stderr
    STATE_DIR/logs/<key>.log.task/  what the task writes: checkpoint, outputs
    STATE_DIR/logs/<key>.log.notice/ the stop's notice, for the task (workers/checkpoints.py)
    STATE_DIR/run/<key>.exit        the task's exit, written by the wrapper
    STATE_DIR/run/<key>.exit.reserve the wrapper's start marker (its pid, the task's record)
                                    and the disk space its exit record may need; removed
                                    once the exit is recorded
    STATE_DIR/run/spawn.lock        flock'ed by the worker and whatever starts wrappers for
                                    it, until their markers are written
                                    (workers/executors/spawnlock.py)

``<key>`` is ``<task>.e<epoch>``: the same task leased again (a new epoch) is another record.
A record lives from the lease until the control plane acknowledged the task's last report.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import secrets
import shutil
import socket
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from klique_util.filemodes import open_private, private_dir
from klique_util.files import write_atomic
from workers.errors import StateDirBusy

log = logging.getLogger(__name__)

STARTING, RUNNING, ENDED = "starting", "running", "ended"


def default_state_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/klique-worker")
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "klique-worker"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:200]


@dataclass
class TaskRecord:
    task: str
    epoch: int
    lease: dict
    state: str = STARTING  # starting (leased, waiting for GPUs) | running | ended
    leased_at: float = field(default_factory=time.time)
    milli: int = 0  # milli-GPUs the lease asked for
    gpus: list[int] = field(default_factory=list)
    handle: dict | None = None  # the executor's record (pid, pgid, ...)
    started_at: str | None = None
    log_path: str = ""
    log_uploaded: int = 0  # bytes of the log the control plane has
    log_broken: str | None = None  # why the log upload was given up
    started_reported: bool = False
    stop: dict | None = None  # {"reason", "text", "grace_s", "at"}
    fenced: bool = False  # stale epoch: killed at once, never reported again
    outcome: dict | None = None  # {"event", "exit_code", "signal", "at", "message"}
    checkpoint_ns: int | None = (
        None  # the checkpoint file's last seen time (workers/checkpoints.py)
    )
    checkpoint_at: str | None = None  # the same, RFC 3339: relayed with the heartbeats

    @property
    def key(self) -> str:
        return f"{_safe(self.task)}.e{self.epoch}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "TaskRecord":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


class StateDir:
    def __init__(self, root: str | Path):
        self.root = Path(root).expanduser().resolve()
        self.tasks = self.root / "tasks"
        self.logs = self.root / "logs"
        # task records hold commands and environments, logs what tasks print: 0700 / 0600
        for d in (self.root, self.tasks, self.logs):
            private_dir(d)
        self._lock_fd: int | None = None

    def lock(self) -> None:
        """Only one worker may use a state dir (two with the same id would fight over the
        same tasks). The lock dies with the process, so a kill -9 leaves nothing to clean."""
        path = self.root / "lock"
        fd = open_private(path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                holder = path.read_text().strip() or "?"
                raise StateDirBusy(
                    f"another klique-worker (pid {holder}) uses the state dir "
                    f"{self.root}; give each worker its own --state-dir"
                ) from None
            raise
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def worker_id(self) -> str:
        path = self.root / "worker-id"
        if path.exists():
            wid = path.read_text(encoding="utf-8").strip()
            if wid:
                return wid
        host = _safe(socket.gethostname().split(".")[0]).lower() or "worker"
        wid = f"w-{host}-{secrets.token_hex(4)}"
        write_atomic(path, wid + "\n")
        return wid

    def worker_key(self) -> str:
        """The random key this worker proves its id with (sent on every call; the control
        plane binds the id to it at the first registration). Kept beside the id, so a
        restart, which adopts the running tasks, proves the same identity."""
        path = self.root / "worker-key"
        try:
            key = path.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            key = ""
        if key:
            return key
        key = secrets.token_urlsafe(32)
        write_atomic(path, key + "\n")  # a mkstemp file: 0600 whatever the umask
        return key

    def log_path(self, rec: TaskRecord) -> Path:
        return self.logs / f"{rec.key}.log"

    def delete(self, rec: TaskRecord) -> None:
        (self.tasks / f"{rec.key}.json").unlink(missing_ok=True)

    def load_all(self) -> list[TaskRecord]:
        out = []
        for path in sorted(self.tasks.glob("*.json")):
            try:
                out.append(TaskRecord.from_json(json.loads(path.read_text(encoding="utf-8"))))
            except (OSError, ValueError, TypeError) as exc:
                bad = path.with_suffix(".json.bad")
                log.error("task record %s is unreadable (%s); moved to %s", path, exc, bad)
                path.replace(bad)
        out.sort(key=lambda r: r.leased_at)
        return out

    def prune_logs(self, keep_s: float, active: set[str]) -> int:
        """Removes logs (and exit files, and the task's files) of ended tasks older than
        `keep_s` seconds."""
        now, removed = time.time(), 0
        for d, suffix in (
            (self.logs, ".log"),
            (self.root / "run", ".exit"),
            (self.root / "run", ".exit.reserve"),
        ):
            if not d.is_dir():
                continue
            for path in d.glob(f"*{suffix}"):
                if path.name[: -len(suffix)] in active:
                    continue
                try:
                    if now - path.stat().st_mtime > keep_s:
                        path.unlink()
                        removed += 1
                except OSError:
                    pass
        # the task's files (workers/checkpoints.py): directories beside its log
        for suffix in (".log.task", ".log.notice"):
            for path in self.logs.glob(f"*{suffix}") if self.logs.is_dir() else []:
                if path.name[: -len(suffix)] in active:
                    continue
                try:
                    if now - path.stat().st_mtime > keep_s:
                        shutil.rmtree(path)
                        removed += 1
                except OSError:
                    pass
        return removed
