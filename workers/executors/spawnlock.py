"""``STATE_DIR/run/spawn.lock``: whether a start of an earlier run of the worker may still be
under way.

The worker flocks this file at its start and keeps it; every process that starts a task's
wrapper for it inherits the same open file (the fork server, and each wrapper between its
fork and its start marker, workers/executors/wrapper.py), so the lock is held until the last
of them is done. A worker restarted after ``kill -9`` therefore takes the lock only once every
start the killed one asked for has either left its marker or will never happen, and only
then reads the markers: a start it sent just before it died is never mistaken for one that
did not happen (which would start the task a second time).

The file also holds the pid and start time of the fork server it started, so that a restart
that waits too long for the lock can end that one server (stopped, hung) and go on.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import signal
import time
from pathlib import Path

from klique_util.filemodes import open_private
from workers.errors import SpawnsUnsettled

log = logging.getLogger(__name__)

FILE_NAME = "spawn.lock"
WAIT_S = 10.0
"""How long a restart waits for the lock before it ends the recorded fork server, and then
again before it gives up (a start of a wrapper takes milliseconds)."""


def _start_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read().decode("ascii", "replace")
        return int(data[data.rindex(")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


_HELD: dict[str, list[int]] = {}
"""The locks this process holds, by path: [descriptor, users]. The lock tells an earlier
*process* from this one, so executors of one process on one state dir (tests, tools) share
it rather than wait for each other."""


class SpawnLock:
    """The worker's side: ``fd()`` takes the lock (waiting as above) and gives the
    descriptor its starters inherit; ``holder(pid)`` records the fork server."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / FILE_NAME
        self._fd: int | None = None

    def fd(self) -> int:
        if self._fd is None:
            key = str(self.path.resolve())
            held = _HELD.get(key)
            if held is None:
                held = _HELD[key] = [self._take(), 0]
            held[1] += 1
            self._fd = held[0]
        return self._fd

    def _take(self) -> int:
        fd = open_private(self.path, os.O_RDWR | os.O_CREAT)
        deadline, ended_server = time.monotonic() + WAIT_S, False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise
            if time.monotonic() >= deadline:
                if ended_server:
                    os.close(fd)
                    raise SpawnsUnsettled(
                        f"{self.path} is still locked after {2 * WAIT_S:.0f}s: a process "
                        "started by an earlier run of this worker (its fork server or a "
                        "task's wrapper being started) still holds it; find it with "
                        f"`fuser {self.path}`, end it, and start the worker again"
                    )
                ended_server = True
                self._end_server(fd)
                deadline = time.monotonic() + WAIT_S
            time.sleep(0.01)

    def _end_server(self, fd: int) -> None:
        """Ends the fork server the earlier run recorded, if it is that same process."""
        try:
            pid_s, ticks_s = os.pread(fd, 64, 0).decode("ascii").split()[:2]
            pid, ticks = int(pid_s), int(ticks_s)
        except (OSError, ValueError):
            return
        if pid <= 0 or _start_ticks(pid) != ticks:
            return
        log.warning(
            "the fork server of an earlier run of this worker (pid %d) still holds %s "
            "after %.0fs: ending it (SIGKILL); the wrappers it started live on",
            pid,
            self.path,
            WAIT_S,
        )
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass

    def holder(self, pid: int) -> None:
        """Records the fork server just started (see the module's docstring)."""
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, f"{pid} {_start_ticks(pid)}\n".encode(), 0)
        except OSError as exc:  # only the restart's last resort needs it
            log.debug("cannot record the fork server in %s: %s", self.path, exc)

    def close(self) -> None:
        if self._fd is None:
            return
        self._fd = None
        key = str(self.path.resolve())
        held = _HELD.get(key)
        if held is not None:
            held[1] -= 1
            if held[1] <= 0:
                del _HELD[key]
                os.close(held[0])
