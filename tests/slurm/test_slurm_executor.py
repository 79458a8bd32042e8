"""The Slurm executor against the real single-node Slurm of tests/slurm/conftest.py (8 fake
GRES GPUs): GPUs from GRES, exit codes and signals, a stop that reaches a trapping child as
SIGTERM and cancels an ignoring one after the grace, adoption after a restart, and a whole
`klique-worker --executor slurm` against the protocol's reference peer."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.harness.wait import wait_for, wait_for_async, wait_for_text
from tests.workers.conftest import WorkerProcess
from tests.workers.protocol_peer import ProtocolPeer
from workers.executors.base import Exited
from workers.executors.slurm import SlurmExecutor, job_script, parse_exit_code, sbatch_command
from workers.gpus import Gpu

PY = sys.executable
TRAPS = """
import signal, sys, time
def term(*_):
    open(sys.argv[1], 'w').write('checkpoint')
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
print('ready', flush=True)
time.sleep(60)
"""
IGNORES = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print('ready', flush=True)
time.sleep(60)
"""


def lease(task: str, command: list[str], gpus: float = 1.0, **extra) -> dict:
    return {
        "task": task,
        "epoch": 1,
        "command": command,
        "gpus": gpus,
        "grace_s": 1.0,
        "user": "alice",
        "project": "p",
        "resource": "team/standard",
        "env": {},
        **extra,
    }


@pytest.fixture
def executor(slurm, tmp_path):
    ex = SlurmExecutor(
        tmp_path / "state",
        partition=slurm.partition,
        slurm_conf=slurm.conf,
        gpus=[Gpu(i, f"declared-{i}", 81920) for i in range(8)],
        poll_interval_s=0.2,
    )
    yield ex
    for h in list(ex._active.values()):
        subprocess.run(["scancel", h.job_id], env=ex.cmd_env, capture_output=True)


def run(coro):
    return asyncio.run(coro)


async def wait_exit(ex, h, timeout: float = 20.0) -> Exited:
    return await wait_for_async(
        lambda: r if isinstance(r := ex.poll(h), Exited) else None,
        timeout,
        f"slurm job {h.job_id} to end",
    )


def scontrol(ex, job: str) -> str:
    return subprocess.run(
        ["scontrol", "show", "job", "-o", job], env=ex.cmd_env, capture_output=True, text=True
    ).stdout


# pure ------------------------------------------------------------------------------------------
def test_the_sbatch_command_line_and_script():
    cmd = sbatch_command(
        lease("t/1", ["echo", "a b"], gpus=0.5),
        partition="gpu",
        log_path="/s/logs/t_1.e1.log",
        workdir="/w",
    )
    assert cmd == [
        "sbatch",
        "--parsable",
        "--gres=gpu:1",
        "--partition",
        "gpu",
        "--job-name",
        "klique-t_1",
        "--output",
        "/s/logs/t_1.e1.log",
        "--open-mode=append",
        "--export=ALL",
        "--chdir",
        "/w",
    ]
    assert "--gres=gpu:3" in sbatch_command(
        lease("x", ["true"], gpus=2.5), partition=None, log_path="/l%x", workdir=None
    )
    assert "/l%%x" in sbatch_command(
        lease("x", ["true"]), partition=None, log_path="/l%x", workdir=None
    )
    script = job_script(lease("t", ["echo", "a b"]), "/s/run/t.e1.exit", "/py", "/w.py")
    assert "/py -I /w.py /s/run/t.e1.exit -- echo 'a b' &" in script
    assert "trap ':' TERM INT HUP" in script and "trap 'kill -KILL 0' USR2" in script
    assert parse_exit_code("7:0") == (7, None) and parse_exit_code("0:9") == (None, "SIGKILL")


def test_a_gang_asks_slurm_for_its_nodes_and_runs_one_rank_per_node():
    """Issue 15: a gang leased whole to a Slurm worker is one job over its nodes; the script
    gives each node's command the rendezvous names (golden command line and script)."""
    gang = lease("g/1", ["python", "train.py", "--lr", "0.1"], gpus=16, nodes=2)
    cmd = sbatch_command(gang, partition="gpu", log_path="/s/logs/g_1.e1.log", workdir=None)
    assert cmd == [
        "sbatch",
        "--parsable",
        "--nodes",
        "2",
        "--ntasks-per-node",
        "1",
        "--gpus-per-node",
        "8",
        "--partition",
        "gpu",
        "--job-name",
        "klique-g_1",
        "--output",
        "/s/logs/g_1.e1.log",
        "--open-mode=append",
        "--export=ALL",
    ]
    script = job_script(gang, "/s/run/g_1.e1.exit", "/py", "/w.py")
    golden = Path(__file__).parent / "golden" / "gang-job.sh"
    if os.environ.get("KLIQUE_UPDATE_GOLDEN"):
        golden.write_text(script)
    assert script == golden.read_text()
    # one node: unchanged (no srun step, GRES as before)
    one = sbatch_command(
        lease("x", ["true"], gpus=2, nodes=1), partition=None, log_path="/l", workdir=None
    )
    assert "--gres=gpu:2" in one and "--nodes" not in one
    assert "srun" not in job_script(lease("x", ["true"]), "/e", "/py", "/w.py")


# against the real Slurm ------------------------------------------------------------------------
def test_a_job_gets_its_gpus_from_gres_and_its_environment(executor, tmp_path):
    log = tmp_path / "a.log"
    code = (
        "import os; print('cuda=' + os.environ['CUDA_VISIBLE_DEVICES'], "
        "os.environ['KLIQUE_TASK_ID'], os.environ['KLIQUE_GPUS'], os.environ['FOO'], "
        "os.environ.get('KLIQUE_GPU_MEMORY_MB'))"
    )
    h = executor.start(lease("whole", [PY, "-c", code], gpus=2, env={"FOO": "bar"}), [0, 1], log)
    info = scontrol(executor, h.job_id)
    assert "JobName=klique-whole" in info and "Partition=gpu" in info
    assert "TresPerNode=gres:gpu:2" in info
    r = run(wait_exit(executor, h))
    assert r.exit_code == 0 and r.signal is None
    assert f"slurm job {h.job_id}" in r.message and "started 20" in r.message
    assert log.read_text().split() == ["cuda=0,1", "whole", "2", "bar", "None"]
    # a fraction: one whole GRES GPU (Slurm cannot split one) plus the memory cap variables
    log2 = tmp_path / "f.log"
    code = (
        "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['KLIQUE_GPU_MEMORY_MB'],"
        " os.environ['CUDA_MPS_PINNED_DEVICE_MEM_LIMIT'])"
    )
    h = executor.start(lease("frac", [PY, "-c", code], gpus=0.25), [3], log2)
    assert "TresPerNode=gres:gpu:1" in scontrol(executor, h.job_id)
    assert run(wait_exit(executor, h)).exit_code == 0
    assert log2.read_text().split() == ["0", "20480", "0=20480M"]


def test_exit_codes_signals_and_times_come_back(executor, tmp_path):
    h1 = executor.start(lease("e3", ["sh", "-c", "echo out; exit 3"]), [0], tmp_path / "1.log")
    h2 = executor.start(lease("k9", ["sh", "-c", "kill -9 $$"]), [1], tmp_path / "2.log")
    h3 = executor.start(lease("nf", ["/no/such/command"]), [2], tmp_path / "3.log")
    r1, r2, r3 = (run(wait_exit(executor, h)) for h in (h1, h2, h3))
    assert (r1.exit_code, r1.signal) == (3, None)
    assert (r2.exit_code, r2.signal) == (None, "SIGKILL")
    assert r3.exit_code == 127
    # without the wrapper (no python on the node): the exit comes from Slurm's ExitCode
    bare = SlurmExecutor(
        tmp_path / "state2",
        partition="gpu",
        slurm_conf=executor.cmd_env["SLURM_CONF"],
        python="/nonexistent/python",
        poll_interval_s=0.2,
    )
    h4 = bare.start(lease("bare", ["sh", "-c", "exit 5"]), [0], tmp_path / "4.log")
    r4 = run(wait_exit(bare, h4))
    assert (r4.exit_code, r4.signal) == (5, None)
    assert "exit 5:0 from scontrol" in r4.message and "ended 20" in r4.message


def test_a_stop_reaches_a_trapping_child_as_sigterm(executor, tmp_path):
    marker, log = tmp_path / "checkpoint", tmp_path / "t.log"
    h = executor.start(lease("traps", [PY, "-c", TRAPS, str(marker)]), [0], log)
    wait_for_text(log, "ready")
    t0 = time.monotonic()
    r = run(executor.stop(h, 10))
    assert time.monotonic() - t0 < 3  # it exited by itself, well within the grace
    assert marker.read_text() == "checkpoint"
    assert (r.exit_code, r.signal) == (0, None)


def test_a_child_ignoring_sigterm_is_killed_after_the_grace(executor, tmp_path):
    log = tmp_path / "i.log"
    # a marker of this test's own command: other tests (tests/workers) run SIG_IGN scripts
    # in parallel xdist workers, and a bare `pgrep -f SIG_IGN` saw theirs (a run met it)
    marker = f"slurm-grace-{uuid.uuid4().hex}"
    h = executor.start(lease("ignores", [PY, "-c", IGNORES + f"# {marker}\n"]), [0], log)
    wait_for_text(log, "ready")

    def pids() -> str:
        return subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout

    assert pids().strip(), "the marker finds the running command (else the check below is void)"
    t0 = time.monotonic()
    r = run(executor.stop(h, 1.0))
    took = time.monotonic() - t0
    assert 1.0 <= took < 4.0, took
    assert (r.exit_code, r.signal) == (None, "SIGKILL")
    state = subprocess.run(
        ["squeue", "-h", "-t", "all", "-j", h.job_id, "-o", "%T"],
        env=executor.cmd_env,
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert state in ("FAILED", "CANCELLED", "COMPLETED", "COMPLETING")
    # the kill is sent; its reaping by slurmstepd may take a moment
    wait_for(lambda: pids().strip() == "", 5, "the command gone with its job")


def test_a_pending_job_is_just_cancelled(slurm, tmp_path):
    ex = SlurmExecutor(
        tmp_path / "s",
        partition="gpu",
        slurm_conf=slurm.conf,
        sbatch_args=["--hold"],
        poll_interval_s=0.2,
    )
    h = ex.start(lease("held", ["true"]), [0], tmp_path / "h.log")
    assert ex.poll(h, fresh=True) is not None and h.state == "PENDING"
    r = run(ex.stop(h, 5))
    assert (r.exit_code, r.signal) == (None, None) and "before it started" in r.message


def test_adopt_after_a_restart_by_job_id(executor, slurm, tmp_path):
    log = tmp_path / "ad.log"
    h = executor.start(
        lease("adopt", [PY, "-c", "import time; time.sleep(1.5); print('done')"]), [0], log
    )
    record = json.loads(json.dumps(h.to_record()))
    assert set(record) == {"job_id", "exit_path"}
    again = SlurmExecutor(
        tmp_path / "state", partition="gpu", slurm_conf=slurm.conf, poll_interval_s=0.2
    )
    h2 = again.adopt(record)
    assert again.poll(h2).__class__.__name__ == "Running"
    assert run(wait_exit(again, h2)).exit_code == 0
    # a job that ended while the worker was down: its end is still known
    h3 = executor.start(lease("gone", ["sh", "-c", "exit 4"]), [1], tmp_path / "g.log")
    run(wait_exit(executor, h3))
    third = SlurmExecutor(tmp_path / "state", partition="gpu", slurm_conf=slurm.conf)
    assert third.poll(third.adopt(h3.to_record())).exit_code == 4


# a whole worker ----------------------------------------------------------------------------
def test_a_worker_with_the_slurm_executor_runs_leases_end_to_end(slurm, tmp_path):
    peer = ProtocolPeer()
    (tmp_path / "w").mkdir()
    w = WorkerProcess(
        peer,
        tmp_path / "w" / "state",
        gpus="0,1,2,3",
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
        w.start()
        ok = peer.submit(
            [PY, "-c", "import os; print('gpus', os.environ['CUDA_VISIBLE_DEVICES'])"], gpus=2
        )
        bad = peer.submit(["sh", "-c", "exit 9"])
        marker = tmp_path / "ckpt"
        trap = peer.submit([PY, "-c", TRAPS, str(marker)], grace_s=10)
        peer.wait_for(lambda: peer.end(ok) and peer.end(bad), 20, "two ends")
        assert peer.end(ok)["event"] == "finished" and peer.events(ok) == ["started", "finished"]
        assert b"gpus 0,1" in peer.log(ok) or b"gpus 2,3" in peer.log(ok)
        assert peer.end(bad)["event"] == "failed" and peer.end(bad)["exit_code"] == 9
        assert "slurm job" in peer.end(bad)["message"]
        peer.wait_for(lambda: b"ready" in peer.log(trap), 20, "the trapping task runs")
        # the worker restarts in the middle: the job is taken back by its id
        w.kill9()
        w.start()
        peer.wait_for(
            lambda: (
                len(
                    [
                        b
                        for _, b, _ in peer.heartbeats
                        if any(r["task"] == trap for r in b["running"])
                    ]
                )
                > 0
            ),
            10,
            "heartbeat after restart",
        )
        peer.stop(trap, reason="preempted", grace_s=10)
        peer.wait_for(lambda: peer.end(trap), 20, "stopped")
        assert peer.end(trap)["event"] == "stopped" and peer.end(trap)["exit_code"] == 0
        assert marker.read_text() == "checkpoint"
        reg = next(iter(peer.workers.values()))
        assert reg["executor"] == "slurm"
    except BaseException:
        sys.stderr.write(w.stderr())
        raise
    finally:
        w.stop()
        peer.close()
        for path in (tmp_path / "w" / "state" / "tasks").glob("*.json"):
            job = (json.loads(path.read_text()).get("handle") or {}).get("job_id")
            if job:
                subprocess.run(["scancel", job], env=slurm.env, capture_output=True)
