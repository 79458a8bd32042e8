"""Orphans (issue 9, finding 11): a worker killed with -9 leaves its task running, and the
control plane requeues the task after the worker's heartbeat TTL. The task's wrapper must stop
the orphan *before* that requeue, so that two copies never run; and a worker restarted
quickly must still take its task back (workers/liveness.py, docs/workers.md).

Real processes throughout: a real ``kliqued serve`` (tests/daemon/fleet.py) with a 6 s TTL
(the orphan gets SIGTERM 2 s before it, SIGKILL 1 s before it), real ``klique-worker``
processes, and the wrapper alone against a liveness file written by hand.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.daemon.fleet import FleetServer, RealWorker, kill_pids_in, pid_alive, trap
from workers.daemon import TEST_PAUSE_ENV
from workers.executors.process import WRAPPER
from workers.liveness import Liveness, margin
from tests.harness.wait import wait_for

PY = sys.executable


def _at(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@pytest.fixture
def fs(tmp_path, request):
    ttl = request.node.get_closest_marker("worker_ttl")
    s = FleetServer(tmp_path, ttl=ttl.args[0] if ttl else "6s").start()
    s.erin = s.token({"user": "erin"})  # type: ignore[attr-defined]
    s.wt = s.token({"worker": True, "pool": "bare"})  # type: ignore[attr-defined]
    workers: list[RealWorker] = []
    s.workers = workers  # type: ignore[attr-defined]
    yield s
    for w in workers:
        w.stop()
    kill_pids_in(list(tmp_path.glob("*.pid")))
    log = s.log()
    assert s.stop() == 0, log
    for w in workers:
        assert "Traceback" not in w.stderr(), w.stderr()


def real(fs, tmp_path: Path, name: str, gpus: str = "0") -> RealWorker:
    w = RealWorker(fs, fs.wt, tmp_path / name, gpus=gpus).start()
    fs.workers.append(w)
    return w


def test_the_orphan_of_a_killed_worker_is_gone_before_its_task_is_requeued(fs, tmp_path):
    w1 = real(fs, tmp_path, "w1")
    tid = fs.submit(fs.erin, "team-b/one", trap(tmp_path, "k1"))
    wait_for(lambda: fs.task(tid)["state"] == "running", 20, "running")
    old = int(
        wait_for(lambda: (tmp_path / "k1.pid").exists() and (tmp_path / "k1.pid").read_text())
    )
    w1.kill9()
    assert pid_alive(old)  # the worker's death alone does not stop its task
    wait_for(lambda: fs.task(tid)["preemptions"] == 1, 20, "requeued after the TTL")
    lost = fs.events(tid, "preempted")[-1]
    assert lost["data"]["kind"] == "lost"
    # the orphan was stopped (SIGTERM first: it could checkpoint) before the requeue
    assert not pid_alive(old)
    assert (tmp_path / "k1.term").read_text() == "TERM"
    (exit_file,) = (tmp_path / "w1" / "run").glob("*.exit")
    ended = json.loads(exit_file.read_text())
    assert ended["message"].startswith("worker-lost: its worker")
    assert _at(ended["ended_at"]) < _at(lost["at"]), (ended, lost)
    # the requeued copy runs on another worker; the old one is long gone
    real(fs, tmp_path, "w2")
    wait_for(
        lambda: fs.task(tid)["state"] == "running" and fs.task(tid)["epoch"] == 2,
        20,
        "running again at epoch 2",
    )
    wait_for(lambda: (tmp_path / "k1.pid").read_text() not in ("", str(old)), 10, "new copy")
    assert not pid_alive(old)
    (task_log,) = (tmp_path / "w1" / "logs").glob(f"{tid}.e1.log")
    assert "worker-lost: its worker" in task_log.read_text()  # why, in the task's own log


def test_a_worker_restarted_quickly_after_kill_9_keeps_its_task(fs, tmp_path):
    w1 = real(fs, tmp_path, "w1")
    tid = fs.submit(fs.erin, "team-b/one", trap(tmp_path, "q1", seconds=9))
    wait_for(lambda: fs.task(tid)["state"] == "running", 20, "running")
    pid = int(
        wait_for(lambda: (tmp_path / "q1.pid").exists() and (tmp_path / "q1.pid").read_text())
    )
    w1.kill9()
    w1.start()  # back well within TTL - margin: the task is taken back
    # beyond the TTL of the killed worker's last contact: the task still runs
    time.sleep(7)
    assert pid_alive(pid) and not (tmp_path / "q1.term").exists()
    wait_for(lambda: fs.task(tid)["state"] == "ended", 20, "ended")
    t = fs.task(tid)
    assert (t["end_reason"], t["epoch"], t["preemptions"]) == ("finished", 1, 0), t
    assert not fs.events(kind="worker_lost")


def _counted(tmp_path: Path, name: str, seconds: float) -> list[str]:
    """A task that appends a line to ``<name>.runs`` each time it starts, then sleeps."""
    runs = tmp_path / f"{name}.runs"
    return [
        PY,
        "-c",
        "import os, time\n"
        f"open({str(runs)!r}, 'a').write(str(os.getpid()) + '\\n')\n"
        f"time.sleep({seconds})\n",
    ]


@pytest.mark.worker_ttl("30s")  # the pause and the restart, on a busy machine, fit in it
def test_a_worker_killed_between_the_start_and_its_record_runs_each_task_once(fs, tmp_path):
    """kill -9 after the fork server forked the batch's wrappers and before the worker wrote
    their records (the test hook holds it there): the restarted worker finds no record, but
    the wrappers' start markers (or, for a task that ended meanwhile, its exit record); it
    takes both tasks back and reports them, and neither starts a second time."""
    short = fs.submit(fs.erin, "team-b/one", _counted(tmp_path, "short", 0.2))
    long = fs.submit(fs.erin, "team-b/one", _counted(tmp_path, "long", 3))
    paused = tmp_path / "paused"
    w1 = RealWorker(fs, fs.wt, tmp_path / "w1", gpus="0,1")
    w1.env = {TEST_PAUSE_ENV: str(paused)}
    fs.workers.append(w1)
    w1.start()
    keys = wait_for(lambda: paused.exists() and paused.read_text().split(), 20, "the pause")
    assert sorted(keys) == sorted([f"{short}.e1", f"{long}.e1"]), keys  # one batch, both
    run = tmp_path / "w1" / "run"
    assert not list((tmp_path / "w1" / "tasks").glob("*.json"))  # no record written yet
    w1.kill9()
    # the short task ends while its worker is down: only its exit record is left
    wait_for(lambda: (run / f"{short}.e1.exit").exists(), 10, "short's exit")
    assert (run / f"{long}.e1.exit.reserve").exists()  # the long one's wrapper still runs
    w1.env = {}
    w1.start()  # back well within TTL - margin
    for tid in (short, long):
        wait_for(lambda: fs.task(tid)["state"] == "ended", 20, f"{tid} ended")
        t = fs.task(tid)
        assert (t["end_reason"], t["epoch"], t["preemptions"]) == ("finished", 1, 0), t
    for name in ("short", "long"):
        assert len((tmp_path / f"{name}.runs").read_text().split()) == 1, name  # ran once
    assert not fs.events(kind="worker_lost")
    assert "taken back, not started again" in w1.stderr()


# ------------------------------------------------------------------ the wrapper by itself
def _liveness(path: Path, pid: int, term_in: float, kill_in: float) -> None:
    now = time.monotonic()
    path.write_text(
        json.dumps(
            {
                "pid": pid,
                "start_ticks": None,
                "alive_at": now,
                "contact_at": now - 10,
                "ttl_s": 10,
                "term_at": now + term_in,
                "kill_at": now + kill_in,
            }
        )
    )


def _wrapped(tmp_path: Path, watch: Path, *cmd: str, orphan_kill: list[str] | None = None):
    extra = ["--orphan-kill", json.dumps(orphan_kill)] if orphan_kill else []
    return subprocess.Popen(
        [PY, "-I", WRAPPER, str(tmp_path / "t.exit"), "--watch", str(watch), *extra, "--", *cmd],
        start_new_session=True,
        stderr=subprocess.PIPE,
    )


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_the_wrapper_stops_its_task_once_the_worker_is_gone_past_term_at(tmp_path):
    watch = tmp_path / "worker.json"
    _liveness(watch, _dead_pid(), term_in=0.3, kill_in=0.8)
    marker = tmp_path / "killed"
    p = _wrapped(
        tmp_path,
        watch,
        "sh",
        "-c",
        "trap '' TERM; sleep 30 & wait; sleep 30",
        orphan_kill=["touch", str(marker)],
    )
    t0 = time.monotonic()
    _, err = p.communicate(timeout=10)
    took = time.monotonic() - t0
    assert 0.2 < took < 3, took  # SIGTERM ignored: SIGKILL at kill_at
    rec = json.loads((tmp_path / "t.exit").read_text())
    assert rec["signal"] == "SIGKILL" and rec["message"].startswith("worker-lost:")
    assert b"worker-lost" in err and marker.exists()  # --orphan-kill ran before it


def test_the_wrapper_leaves_the_task_of_a_live_worker_alone(tmp_path):
    """A worker that runs but cannot reach the control plane (term_at long past) keeps its
    tasks: a control-plane outage must not stop work."""
    watch = tmp_path / "worker.json"
    me = os.getpid()
    _liveness(watch, me, term_in=-5, kill_in=-4)
    p = _wrapped(tmp_path, watch, "sleep", "1.5")
    for _ in range(10):  # the worker keeps writing the file
        time.sleep(0.1)
        _liveness(watch, me, term_in=-5, kill_in=-4)
    assert p.wait(10) == 0
    rec = json.loads((tmp_path / "t.exit").read_text())
    assert rec["exit_code"] == 0 and "message" not in rec


def test_a_restarted_worker_inherits_the_last_contact(tmp_path):
    first = Liveness(tmp_path)
    first.contact(time.monotonic() - 3, 15.0)
    first.write()
    second = Liveness(tmp_path)
    second.inherit()
    assert second.contact_at == first.contact_at and second.ttl_s == 15.0
    rec = second.record()
    assert rec["pid"] == os.getpid()
    assert rec["term_at"] == pytest.approx(first.contact_at + 15 - margin(15))
    assert rec["kill_at"] == pytest.approx(first.contact_at + 15 - margin(15) / 2)
    assert margin(15) == 3 and margin(1.5) == 0.75 and margin(6) == 2


def test_kill_9_of_a_worker_does_not_kill_the_orphan_at_once(tmp_path):
    """The wrapper only acts at term_at: a worker killed while in contact leaves its task a
    window to be taken back (the test above with real processes covers the rest)."""
    watch = tmp_path / "worker.json"
    _liveness(watch, _dead_pid(), term_in=1.5, kill_in=2)
    p = _wrapped(tmp_path, watch, "sleep", "0.8")
    assert p.wait(10) == 0
    assert "message" not in json.loads((tmp_path / "t.exit").read_text())
