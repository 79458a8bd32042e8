"""The session-end check that no process a test started outlives the run.

Why by environment and not by a list of handles: a test can start a process in many ways (the
harness's ``Server``, a worker's ``start_new_session`` child, a daemon that forks, Ansible's
pid-file start) and the ones that leak are exactly those no list knew about. At session start
the root conftest puts a unique ``KLIQUE_TEST_RUN`` marker in ``os.environ``; every process a
test starts inherits it (``subprocess`` copies the environment, and the harness builds its
daemons' environments from ``os.environ``), and keeps it after its parent dies or it is
re-parented to init. At session end (after the session's fixtures are torn down; under xdist in
the controller, after its workers have ended) :func:`find` scans ``/proc/*/environ`` for the
marker; the conftest prints what it found, kills it, and fails the run.

A machine-wide service that is meant to outlive the run (munged, shared by every test Slurm on
the machine) is started with the marker removed (:func:`unmarked_env`).
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

VAR = "KLIQUE_TEST_RUN"
"""The environment variable carrying this run's marker."""


@dataclass(frozen=True)
class Leftover:
    """A live process carrying the run's marker."""

    pid: int
    ppid: int
    cmdline: str


def new_marker() -> str:
    return f"run-{uuid.uuid4().hex}"


def unmarked_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) without the run's marker, for a service that is meant
    to outlive the run."""
    return {k: v for k, v in (os.environ if env is None else env).items() if k != VAR}


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:  # gone, or not ours to read
        return None


def _state_and_ppid(pid: int) -> tuple[str, int] | None:
    stat = _read(Path(f"/proc/{pid}/stat"))
    if stat is None:
        return None
    fields = stat.decode(errors="replace").rsplit(")", 1)[1].split()
    return fields[0], int(fields[1])


def carries(environ: bytes, marker: str) -> bool:
    """Whether a ``/proc/PID/environ`` blob (NUL-separated) holds ``VAR=marker``."""
    return f"{VAR}={marker}".encode() in environ.split(b"\0")


def find(marker: str, exclude: frozenset[int] = frozenset()) -> list[Leftover]:
    """Every live (not zombie) process but ``exclude`` whose environment carries ``marker``."""
    found: list[Leftover] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in exclude:
            continue
        pid = int(entry.name)
        environ = _read(entry / "environ")
        if environ is None or not carries(environ, marker):
            continue
        sp = _state_and_ppid(pid)
        if sp is None or sp[0] in ("Z", "X"):
            continue
        cmd = (_read(entry / "cmdline") or b"").replace(b"\0", b" ").decode(errors="replace")
        found.append(Leftover(pid, sp[1], cmd.strip()))
    return found


def settle(marker: str, exclude: frozenset[int], within: float = 5.0) -> list[Leftover]:
    """:func:`find`, given ``within`` seconds for processes already ending (a daemon sent
    SIGTERM by its fixture's teardown, an xdist worker shutting down) to be gone."""
    deadline = time.monotonic() + within
    while True:
        found = find(marker, exclude)
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.2)


def kill(found: list[Leftover]) -> None:
    for p in found:
        try:
            os.kill(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def report(found: list[Leftover]) -> str:
    lines = [f"{len(found)} process(es) started by the tests outlived the run (killed now):"]
    lines += [f"  pid {p.pid} (parent {p.ppid}): {p.cmdline[:300]}" for p in found]
    return "\n".join(lines)
