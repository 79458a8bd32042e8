"""A worker whose state directory fills up (issue 26), for real: the state dir is an 8 MiB
tmpfs filled to ENOSPC while a task runs, against a real ``kliqued serve`` and a real
``klique-worker`` (process executor).

Before the fix the record of the task's end could not be written, the ``OSError`` ended the
task's supervisor silently and the worker heartbeated on: the task stayed ``running`` (GPUs
held, its ledger interval open and charged) until a restart. Now the end is reported from
memory at once with its true cause, the ledger interval closes then, the worker says it
cannot work (placed work waits with that reason instead of being leased to it), and once
space is freed the same worker process leases and runs work again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest

from .fleet import PY, RealWorker, running_fleet
from tests.harness.wait import wait_for

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0,
    reason="mounts a tmpfs as the worker's "
    "state dir: run as root (the fault needs a real full disk)",
)


@pytest.fixture
def fs(tmp_path: Path):
    yield from running_fleet(tmp_path)


def _fill(where: Path) -> Path:
    """Writes ``where/filler`` until the file system is full (ENOSPC)."""
    filler = where / "filler"
    chunk = b"x" * 65536
    with open(filler, "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(chunk)
        except OSError:
            pass
    with open(filler, "ab", buffering=0) as fh:  # the last page too
        try:
            while True:
                fh.write(b"x")
        except OSError:
            pass
    return filler


def _ms(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def test_a_full_state_dir_reports_the_true_end_and_takes_no_work_until_freed(
    fs, tmp_path: Path
) -> None:
    state = tmp_path / "w"
    state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(state)], check=True)
    w = RealWorker(fs, fs.wt, state, gpus="0")
    pidfile = tmp_path / "task.pid"  # outside the tmpfs
    try:
        w.start()
        wid = wait_for(lambda: (state / "worker-id").exists() and w.worker_id(), 15, "id")
        tid = fs.submit(
            fs.erin,
            "team-b/one",
            [
                PY,
                "-c",
                f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid()));"
                " time.sleep(120)",
            ],
        )
        pid = int(
            wait_for(lambda: pidfile.read_text() if pidfile.exists() else None, 20, "started")
        )
        wait_for(lambda: fs.task(tid)["state"] == "running", 10, "running")

        filler = _fill(state)

        def worker() -> dict:
            return next(x for x in fs.ok("GET", "/v1/workers")["workers"] if x["id"] == wid)

        time.sleep(3)  # the task outlives the fault: its wrapper sees a live worker
        assert fs.task(tid)["state"] == "running"

        os.kill(pid, signal.SIGKILL)
        ended_at = time.time()
        t = wait_for(
            lambda: (lambda t: t["state"] == "ended" and t)(fs.task(tid)),
            15,
            "the task's end reported while the disk is full",
        )
        assert t["signal"] == "SIGKILL", t  # its true cause, not "unknown"
        assert abs(_ms(t["ended_at"]) - ended_at) < 5, (t["ended_at"], ended_at)
        [[end_at, end_reason]] = fs.sql(
            f"SELECT strftime(end_at, '%Y-%m-%dT%H:%M:%S.%gZ'), end_reason FROM ledger "
            f"WHERE task = '{tid}'"
        )
        assert end_at is not None and abs(_ms(end_at) - ended_at) < 5, (end_at, ended_at)

        reason = wait_for(lambda: worker().get("cannot_work"), 10, "the worker says it cannot work")
        assert "ENOSPC" in reason and str(state) in reason, reason

        # placed work is not leased to a worker that cannot work; it waits with the reason
        t2 = fs.submit(fs.erin, "team-b/one", [PY, "-c", "pass"])
        time.sleep(3)
        task2 = fs.task(t2)
        assert task2["state"] == "placed", task2
        assert "cannot work" in str(task2["waiting_reason"]), task2

        filler.unlink()  # space again: the same worker process recovers by itself
        wait_for(lambda: worker()["cannot_work"] is None, 15, "the worker can work again")
        wait_for(lambda: fs.task(t2)["state"] == "ended", 30, "the waiting task ran")
        assert fs.task(t2)["end_reason"] == "finished", fs.task(t2)
        assert w.proc is not None and w.proc.poll() is None and w.runs == 1
        assert "Traceback" not in w.stderr(), w.stderr()
    finally:
        w.stop()
        try:
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass
        subprocess.run(["umount", "-l", str(state)], check=False)
