"""Checkpoints from real work and the preemption notice (issue 28, lending.md): a real
``kliqued serve`` and a real ``klique-worker`` (process executor). Team-b borrows both GPUs
of pool ``bare`` with two tasks; the older marks a checkpoint (``kliqued checkpoint`` in its
command) after the younger started; team-a then takes a GPU back.

With ``victims: least_lost_work`` the reclaim takes the older task, the one that
checkpointed, and its ``preempted`` event counts the lost work from its checkpoint, not from
its start; with ``newest`` (the default) the younger goes. Either way the task's SIGTERM
handler finds the worker's notice (``$KLIQUE_PREEMPT_FILE``) already written."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from kliqued.daemon.units import parse_iso
from tests.harness.wait import wait_for

from .fleet import ESTATE, PY, FleetServer, RealWorker, kill_pids_in, read_json, write_estate


def borrower(tmp: Path, name: str) -> list[str]:
    """A training job: waits for ``<name>.go`` (which the test creates), runs ``kliqued
    checkpoint``, then sleeps; on SIGTERM it writes the notice it finds (and the checkpoint
    file's name it was given) to ``<name>.seen`` and exits 0."""
    pid, go, seen, marked = (tmp / f"{name}.{x}" for x in ("pid", "go", "seen", "marked"))
    return [
        PY,
        "-c",
        "import json, os, signal, subprocess, sys, time\n"
        f"open({str(pid)!r}, 'w').write(str(os.getpid()))\n"
        "def term(*_):\n"
        "    path = os.environ.get('KLIQUE_PREEMPT_FILE')\n"
        "    notice = open(path).read() if path and os.path.exists(path) else None\n"
        f"    json.dump({{'notice': notice}}, open({str(seen)!r}, 'w'))\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, term)\n"
        f"while not os.path.exists({str(go)!r}):\n"
        "    time.sleep(0.05)\n"
        "out = subprocess.run([sys.executable, '-m', 'kliqued.cli', 'checkpoint'],\n"
        "                     capture_output=True, text=True)\n"
        f"open({str(marked)!r}, 'w').write(str(out.returncode) + out.stdout + out.stderr)\n"
        "time.sleep(120)\n",
    ]


def one(events: list[dict], kind: str) -> dict:
    found = [e for e in events if e["kind"] == kind]
    assert len(found) == 1, (kind, events)
    return found[0]


@pytest.mark.parametrize("victims", ["least_lost_work", "newest"])
def test_the_reclaim_takes_the_checkpointed_task_and_counts_from_its_checkpoint(
    tmp_path: Path, victims: str
) -> None:
    files = dict(ESTATE)
    files["settings.yaml"] += f"  lending:\n    victims: {victims}\n"
    fs = FleetServer(tmp_path, estate=write_estate(tmp_path / "estate", files)).start()
    w: RealWorker | None = None
    try:
        erin, alice = fs.token({"user": "erin"}), fs.token({"user": "alice"})
        w = RealWorker(
            fs, fs.token({"worker": True, "pool": "bare"}), tmp_path / "w1", gpus="0,1"
        ).start()
        older = fs.submit(erin, "team-b/one", borrower(tmp_path, "older"))
        wait_for(lambda: fs.task(older)["state"] == "running", 20, "the older task runs")
        younger = fs.submit(erin, "team-b/one", borrower(tmp_path, "younger"))
        wait_for(lambda: fs.task(younger)["state"] == "running", 20, "the younger task runs")

        (tmp_path / "older.go").write_text(
            ""
        )  # the older one checkpoints, after the younger started
        wait_for(lambda: (tmp_path / "older.marked").exists(), 20, "kliqued checkpoint ran")
        assert (tmp_path / "older.marked").read_text().startswith("0checkpoint marked at"), (
            tmp_path / "older.marked"
        ).read_text()
        saved = wait_for(
            lambda: fs.events(older, "task_checkpointed"), 20, "the worker relayed the checkpoint"
        )[0]

        fs.submit(alice, "team-a/one", [PY, "-c", "import time; time.sleep(1)"])
        preempted = wait_for(lambda: fs.events(kind="preempted"), 20, "a reclaim")
        assert len(preempted) == 1, preempted
        ev = preempted[0]
        victim = older if victims == "least_lost_work" else younger
        assert ev["task"] == victim, (victims, ev, older, younger)
        assert ev["data"]["by"] == "team-a" and ev["data"]["kind"] == "reclaimed", ev

        placed_at = parse_iso(one(fs.events(victim), "placed")["at"])
        at = parse_iso(ev["at"])
        data = ev["data"]
        assert data["size_milli"] == 1000, data
        if victim == older:
            # counted from the checkpoint the worker relayed, after the younger was placed
            ck = saved["data"]["at"]
            assert data["checkpoint_at"] == ck, (data, saved)
            assert ck > parse_iso(one(fs.events(younger), "placed")["at"]) > placed_at
            assert data["lost_ms"] == at - ck, data
            assert data["lost_ms"] < at - placed_at
            reported = parse_iso(saved["data"]["reported"])
            assert saved["data"]["clamped"] or ck == reported, saved
        else:
            assert data["checkpoint_at"] is None and data["lost_ms"] == at - placed_at, data
        assert data["lost_gpu_hours"] == pytest.approx(data["lost_ms"] / 3_600_000), data

        # The notice was in place when the task's SIGTERM handler ran.
        name = "older" if victim == older else "younger"
        seen = wait_for(
            lambda: read_json(tmp_path / f"{name}.seen"), 20, "the victim's SIGTERM handler ran"
        )
        assert seen["notice"] is not None, seen
        notice = json.loads(seen["notice"])
        assert notice["reason"] == "preempted" and "team-a" in notice["text"], notice
        assert notice["grace_s"] == 2.0, notice
        deadline = datetime.fromisoformat(notice["deadline"].replace("Z", "+00:00"))
        assert abs(deadline.timestamp() * 1000 - (at + 2000)) < 30_000, (notice, ev)
        spared = younger if victim == older else older
        assert fs.task(spared)["state"] == "running"
    finally:
        if w is not None:
            w.stop()
        kill_pids_in(list(tmp_path.glob("*.pid")))
        log = fs.log()
        assert fs.stop() == 0, log
        assert "Traceback" not in log, log
        if w is not None:
            assert "Traceback" not in w.stderr(), w.stderr()
