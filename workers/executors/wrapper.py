"""The tiny wrapper every task command runs under.

    python -I wrapper.py EXIT_FILE -- COMMAND [ARGS...]

It starts COMMAND as its child (same process group, same stdout/stderr: the task's log),
waits for it and writes its end to EXIT_FILE atomically:

    {"exit_code": 0 | null, "signal": "SIGTERM" | null, "pid": <child pid>, "ended_at": "..."}

and then exits with the child's code (128 + signal number for a signal). The worker reads
EXIT_FILE when the wrapper is gone, so a task whose worker restarted, and which is no longer
the worker's child, still reports its real exit code: its result is never lost.

The wrapper ignores SIGTERM/SIGINT/SIGHUP sent to the task's process group (the worker sends
SIGTERM to the group on a stop instruction; the command itself decides what to do with it),
so that it stays to record the exit. It installs Python handlers rather than SIG_IGN, so the
command starts with default dispositions. Standard library only, run with ``-I`` so that
neither the task's environment (PYTHONPATH, ...) nor its virtual env can break it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time


def _write_exit(path: str, record: dict) -> None:
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".exit.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(record, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _now() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"SIG{signum}"


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("usage: wrapper.py EXIT_FILE -- COMMAND [ARGS...]\n")
        return 2
    exit_file, command = argv[0], argv[2:]
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)
    try:
        child = subprocess.Popen(command)
    except OSError as exc:
        code = 127 if isinstance(exc, FileNotFoundError) else 126
        sys.stderr.write(f"[klique-worker] cannot run {command[0]!r}: {exc.strerror or exc}\n")
        sys.stderr.flush()
        _write_exit(exit_file, {"exit_code": code, "signal": None, "pid": None,
                                "ended_at": _now(), "message": f"cannot run {command[0]!r}"})
        return code
    rc = child.wait()
    if rc < 0:
        record = {"exit_code": None, "signal": _signal_name(-rc)}
        code = 128 - rc
    else:
        record = {"exit_code": rc, "signal": None}
        code = rc
    record.update(pid=child.pid, ended_at=_now())
    _write_exit(exit_file, record)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
