"""``klique-worker --drain`` against a real ``kliqued serve``: on SIGTERM the worker stops its
task (the process really gets SIGTERM), hands it back without a loss and deregisters."""

from __future__ import annotations

import os
import signal
import subprocess

from .fleet import PY, FleetServer, RealWorker, pid_alive
from tests.harness.wait import wait_for
from tests.harness.typed import present


def test_drain_hands_the_tasks_back_and_deregisters(tmp_path) -> None:
    fs = FleetServer(tmp_path).start()
    try:
        erin = fs.token({"user": "erin"})
        w = RealWorker(fs, fs.token({"worker": True, "pool": "bare"}), tmp_path / "w", gpus="0")
        w.start()
        present(w.proc).terminate()  # restarted below with --drain
        present(w.proc).wait(10)
        w.proc = subprocess.Popen(
            [
                PY,
                "-m",
                "workers.cli",
                "--url",
                fs.url,
                "--pool",
                "bare",
                "--token-file",
                str(w.token_file),
                "--state-dir",
                str(w.state_dir),
                "--gpus",
                "0",
                "--grace",
                "2s",
                "--retry-max",
                "0.5s",
                "--log-level",
                "debug",
                "--drain",
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / "drain.stderr", "w"),
        )
        pidfile = tmp_path / "pid"
        tid = fs.submit(
            erin,
            "team-b/one",
            [
                PY,
                "-c",
                f"import os, time; open('{pidfile}', 'w').write(str(os.getpid())); time.sleep(60)",
            ],
        )
        pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text(), 15, "started"))
        wait_for(lambda: fs.task(tid)["state"] == "running", 10, "running")
        wid = w.worker_id()
        w.proc.send_signal(signal.SIGTERM)
        assert w.proc.wait(20) == 0, (tmp_path / "drain.stderr").read_text()
        assert not pid_alive(pid)
        t = fs.task(tid)
        assert t["last_preemption"]["kind"] == "returned", t
        assert t["state"] in ("queued", "placed")
        assert wid not in [x["id"] for x in fs.ok("GET", "/v1/workers")["workers"]]
        kinds = [e["kind"] for e in fs.events(tid)]
        assert kinds[:5] == ["submitted", "placed", "leased", "started", "preempted"], kinds
    finally:
        try:
            os.kill(int((tmp_path / "pid").read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass
        assert fs.stop() == 0
