"""The worker's liveness file: how a task's wrapper knows that its worker is gone.

A task outlives its worker on purpose (a restart takes it back), but a worker that stays
gone is declared lost by the control plane after its heartbeat TTL, and the task is
requeued and runs again elsewhere. The orphan must be gone before that: so the running
worker keeps ``STATE_DIR/run/worker.json`` up to date (rewritten atomically every second):

    {"pid", "start_ticks", "boot_id", "alive_at", "contact_at", "ttl_s", "term_at", "kill_at"}

Times are ``time.monotonic()`` seconds (CLOCK_MONOTONIC: one clock for every process of the
machine, so the worker and the wrappers compare them directly).

- ``contact_at``: when the worker *sent* the last request the control plane answered. The
  control plane saw the worker at that moment or later, so it declares it lost no earlier
  than ``contact_at + ttl_s``.
- ``term_at = contact_at + ttl_s - margin`` and ``kill_at = contact_at + ttl_s - margin / 2``
  (``margin(ttl_s)``): when an orphan gets SIGTERM and SIGKILL.
- ``alive_at``: the worker's last write; with ``pid`` + ``start_ticks`` it says whether the
  worker still runs (a worker whose loop hangs counts as gone after the wrapper's
  ``stale_s``, 5 s: ``wrapper.worker_gone``).

The wrapper (``workers/executors/wrapper.py``, standard library only, so it reads these keys
itself) stops its task only when the worker is gone *and* ``term_at`` has passed: a worker
that is alive but cannot reach the control plane keeps its tasks (the control plane being
down must not stop work), and a worker restarted before ``term_at`` takes its tasks back (it
keeps the previous ``contact_at`` until its own first contact).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from klique_util.files import write_atomic

FILE_NAME = "worker.json"
WRITE_EVERY_S = 1.0
SIZE = 1024
"""The file's size: a record padded with spaces (it fits in 400 bytes), so that a rewrite
in place on a full disk never grows it."""


def margin(ttl_s: float) -> float:
    """How long before the control plane's earliest requeue an orphan gets SIGTERM (it gets
    SIGKILL at half of it): 20% of the TTL, at least 2 s, at most half the TTL."""
    return min(max(2.0, ttl_s / 5), ttl_s / 2)


def path_in(state_dir: str | Path) -> Path:
    return Path(state_dir) / "run" / FILE_NAME


def boot_id() -> str | None:
    """This boot of the machine (monotonic times of another boot mean nothing)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return None


def _start_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read().decode("ascii", "replace")
        return int(data[data.rindex(")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


class Liveness:
    """The worker's side: records contacts with the control plane and rewrites the file."""

    def __init__(self, state_dir: str | Path) -> None:
        self.path = path_in(state_dir)
        self.pid = os.getpid()
        self.start_ticks = _start_ticks(self.pid)
        self.boot = boot_id()
        self.contact_at: float | None = None
        self.ttl_s: float | None = None

    def inherit(self) -> None:
        """Takes over the previous run's last contact (same boot only): until this worker
        reaches the control plane itself, its tasks' deadlines stay those the control plane
        counts from."""
        try:
            old = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return
        if not isinstance(old, dict) or old.get("boot_id") != self.boot:
            return
        contact, ttl = old.get("contact_at"), old.get("ttl_s")
        if (
            isinstance(contact, (int, float))
            and isinstance(ttl, (int, float))
            and contact <= time.monotonic()
        ):
            self.contact_at, self.ttl_s = float(contact), float(ttl)

    def contact(self, sent_at: float, ttl_s: float) -> None:
        """A request sent at ``sent_at`` (monotonic) was answered by the control plane."""
        if self.contact_at is None or sent_at > self.contact_at:
            self.contact_at = sent_at
        self.ttl_s = ttl_s

    def record(self) -> dict:
        rec: dict = {
            "pid": self.pid,
            "start_ticks": self.start_ticks,
            "boot_id": self.boot,
            "alive_at": time.monotonic(),
            "contact_at": self.contact_at,
            "ttl_s": self.ttl_s,
            "term_at": None,
            "kill_at": None,
        }
        if self.contact_at is not None and self.ttl_s:
            m = margin(self.ttl_s)
            rec["term_at"] = self.contact_at + self.ttl_s - m
            rec["kill_at"] = self.contact_at + self.ttl_s - m / 2
        return rec

    def write(self) -> None:
        """Rewrites the file atomically (a wrapper never reads half of it).

        On a full disk (no room for the temporary file) the record is written over the old
        one in place instead: always ``SIZE`` bytes (padded), so it needs no new block, and
        the wrappers keep seeing a live worker (otherwise they stop every task as an orphan
        while the worker runs: issue 26). A wrapper reading it mid-write gets invalid JSON,
        which it ignores until its next read. The original error is raised after that, so
        the worker knows its state dir is full."""
        data = json.dumps(self.record()).ljust(SIZE).encode()
        try:
            write_atomic(self.path, data, fsync=False)
        except OSError:
            try:
                fd = os.open(self.path, os.O_WRONLY)
                try:
                    os.pwrite(fd, data, 0)
                finally:
                    os.close(fd)
            except OSError:
                pass
            raise
