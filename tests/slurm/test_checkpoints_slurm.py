"""Checkpoints and the preemption notice under Slurm (issue 28, lending.md), for real: a real
``kliqued serve``, a real ``klique-worker --executor slurm`` and the real local Slurm of
tests/slurm/conftest.py; no stand-in anywhere.

Team-b borrows both GPUs of pool ``bare`` with two tasks, each a Slurm job. Each finds its
``$KLIQUE_CHECKPOINT_FILE`` in the job's environment (sbatch ``--export=ALL``) and marks a
checkpoint: the younger through the SDK (``kliqued.sdk.checkpoint()``), then the older
through the CLI (``kliqued checkpoint``); the worker relays each to the control plane. Team-a
then takes a GPU back: with ``victims: least_lost_work`` the reclaim takes the older task
(its checkpoint is the newer), its ``preempted`` event counts the lost work from that
checkpoint, and its SIGTERM handler, reached through ``scancel --signal=TERM --full``, finds
the worker's notice in ``$KLIQUE_PREEMPT_FILE`` already written. The tests of the process
executor: tests/daemon/test_checkpoints.py."""

from __future__ import annotations

import json
import subprocess
from datetime import datetime
from pathlib import Path

from kliqued.daemon.units import parse_iso
from tests.daemon.fleet import (
    ESTATE,
    PY,
    FleetServer,
    RealWorker,
    kill_pids_in,
    read_json,
    write_estate,
)
from tests.harness.wait import wait_for

SDK = "from kliqued.sdk import checkpoint; checkpoint()"
CLI = (
    "out = subprocess.run([sys.executable, '-m', 'kliqued.cli', 'checkpoint'],\n"
    "                     capture_output=True, text=True)\n"
    "assert out.returncode == 0 and out.stdout.startswith('checkpoint marked at'), out\n"
)


def borrower(tmp: Path, name: str, mark: str) -> list[str]:
    """A training job: waits for ``<name>.go``, marks its checkpoint (``mark``), writes
    ``<name>.marked`` with the two files' names it was given, then sleeps; on SIGTERM it
    writes the notice it finds (through the SDK) to ``<name>.seen`` and exits 0."""
    pid, go, seen, marked = (tmp / f"{name}.{x}" for x in ("pid", "go", "seen", "marked"))
    return [
        PY,
        "-c",
        (
            "import json, os, signal, subprocess, sys, time\n"
            "from kliqued.sdk import preempt_notice\n"
            f"open({str(pid)!r}, 'w').write(str(os.getpid()))\n"
            "def term(*_):\n"
            "    n = preempt_notice()\n"
            f"    json.dump({{'notice': n and n.to_json()}}, open({str(seen)!r}, 'w'))\n"
            "    sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, term)\n"
            f"while not os.path.exists({str(go)!r}):\n"
            "    time.sleep(0.05)\n"
            f"{mark}\n"
            f"json.dump({{k: os.environ.get(k) for k in ('KLIQUE_CHECKPOINT_FILE',"
            f" 'KLIQUE_PREEMPT_FILE', 'SLURM_JOB_ID')}}, open({str(marked)!r}, 'w'))\n"
            "time.sleep(120)\n"
        ),
    ]


def one(events: list[dict], kind: str) -> dict:
    found = [e for e in events if e["kind"] == kind]
    assert len(found) == 1, (kind, events)
    return found[0]


def test_a_slurm_task_checkpoints_and_the_reclaim_counts_from_its_checkpoint(
    slurm, tmp_path: Path
) -> None:
    files = dict(ESTATE)
    files["settings.yaml"] += "  lending:\n    victims: least_lost_work\n"
    fs = FleetServer(tmp_path, estate=write_estate(tmp_path / "estate", files)).start()
    w = RealWorker(
        fs,
        fs.token({"worker": True, "pool": "bare"}),
        tmp_path / "w1",
        gpus="0,1",
        extra=[
            "--executor",
            "slurm",
            "--partition",
            slurm.partition,
            "--slurm-conf",
            str(slurm.conf),
        ],
    )
    try:
        erin, alice = fs.token({"user": "erin"}), fs.token({"user": "alice"})
        w.start()
        older = fs.submit(erin, "team-b/one", borrower(tmp_path, "older", CLI))
        wait_for(lambda: fs.task(older)["state"] == "running", 60, "the older task runs")
        younger = fs.submit(erin, "team-b/one", borrower(tmp_path, "younger", SDK))
        wait_for(lambda: fs.task(younger)["state"] == "running", 60, "the younger task runs")
        wait_for(
            lambda: (tmp_path / "older.pid").exists() and (tmp_path / "younger.pid").exists(),
            30,
            "both Slurm jobs run",
        )

        (tmp_path / "younger.go").write_text("")  # the SDK's checkpoint first
        env = wait_for(lambda: read_json(tmp_path / "younger.marked"), 30, "the SDK marked")
        assert env["SLURM_JOB_ID"], env  # it ran as a Slurm job
        assert env["KLIQUE_CHECKPOINT_FILE"].endswith("/checkpoint"), env
        assert Path(env["KLIQUE_CHECKPOINT_FILE"]).exists(), env
        wait_for(
            lambda: fs.events(younger, "task_checkpointed"),
            20,
            "the worker relayed the SDK's checkpoint",
        )
        (tmp_path / "older.go").write_text("")  # then the CLI's, newer
        wait_for(lambda: read_json(tmp_path / "older.marked"), 30, "kliqued checkpoint ran")
        saved = wait_for(
            lambda: fs.events(older, "task_checkpointed"),
            20,
            "the worker relayed the CLI's checkpoint",
        )[0]

        fs.submit(alice, "team-a/one", [PY, "-c", "import time; time.sleep(1)"])
        preempted = wait_for(lambda: fs.events(kind="preempted"), 30, "a reclaim")
        assert len(preempted) == 1, preempted
        ev = preempted[0]
        assert ev["task"] == older, (ev, older, younger)  # the least lost work
        assert ev["data"]["by"] == "team-a" and ev["data"]["kind"] == "reclaimed", ev
        at, data, ck = parse_iso(ev["at"]), ev["data"], saved["data"]["at"]
        assert data["checkpoint_at"] == ck, (data, saved)
        assert ck > parse_iso(one(fs.events(younger), "placed")["at"])
        assert data["lost_ms"] == at - ck, data
        assert data["lost_ms"] < at - parse_iso(one(fs.events(older), "placed")["at"])

        # The notice was in place when the job's SIGTERM handler ran.
        seen = wait_for(
            lambda: read_json(tmp_path / "older.seen"), 30, "the victim's SIGTERM handler ran"
        )
        assert seen["notice"] is not None, seen
        notice = json.loads(seen["notice"])
        assert notice["reason"] == "preempted" and "team-a" in notice["text"], notice
        assert notice["grace_s"] == 2.0, notice
        deadline = datetime.fromisoformat(notice["deadline"])
        assert abs(deadline.timestamp() * 1000 - (at + 2000)) < 30_000, (notice, ev)
        wait_for(lambda: fs.task(older)["state"] != "running", 30, "the victim ended")
        assert fs.task(younger)["state"] == "running"
        assert not (tmp_path / "younger.seen").exists()
    finally:
        w.stop()
        for path in (tmp_path / "w1" / "tasks").glob("*.json"):
            job = ((read_json(path) or {}).get("handle") or {}).get("job_id")
            if job:
                subprocess.run(
                    ["scancel", str(job)], env=slurm.env, capture_output=True, check=False
                )
        kill_pids_in(list(tmp_path.glob("*.pid")))
        log = fs.log()
        assert fs.stop() == 0, log
        assert "Traceback" not in log, log
        assert "Traceback" not in w.stderr(), w.stderr()
