"""A gang on the real Slurm (issue 15): the Slurm executor's job over two node entries of
one machine (tests/harness/slurm.py ``TwoNodeSlurm``) runs the command once per node with
the rendezvous environment, and the ranks meet: rank 0 listens on MASTER_PORT, rank 1
connects to MASTER_ADDR (no torch)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys

import pytest

from tests.harness.slurm import TwoNodeSlurm, missing_binaries
from tests.harness.wait import wait_for_async
from workers.executors.base import Exited
from workers.executors.slurm import SlurmExecutor
from workers.gpus import Gpu

PY = sys.executable


@pytest.fixture(scope="module")
def slurm2(tmp_path_factory):
    missing = missing_binaries()
    if missing:
        pytest.skip(f"Slurm is not installed here ({', '.join(missing)} missing)")
    if os.geteuid() != 0:
        pytest.skip("the local Slurm runs its daemons as root")
    cluster = TwoNodeSlurm(tmp_path_factory.mktemp("slurm2"), gpus=2, nodes=2)
    cluster.start()
    yield cluster
    cluster.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


RANK = """
import json, os, socket, sys, time
env = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK",
       "NODE_RANK", "LOCAL_WORLD_SIZE", "SLURMD_NODENAME", "CUDA_VISIBLE_DEVICES")}
rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
heard = []
if rank == 0:
    srv = socket.create_server(("0.0.0.0", int(env["MASTER_PORT"])))
    srv.settimeout(30)
    for _ in range(world - 1):
        c, _a = srv.accept()
        heard.append(int(c.recv(16).decode()))
        c.sendall(b"ok")
        c.close()
else:
    deadline = time.time() + 30
    while True:
        try:
            c = socket.create_connection((env["MASTER_ADDR"], int(env["MASTER_PORT"])), 2)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)
    c.sendall(str(rank).encode())
    assert c.recv(16) == b"ok"
    c.close()
json.dump({**env, "heard": heard}, open(sys.argv[1] + f"/rank{rank}.json", "w"))
"""


def test_a_gang_runs_one_rank_per_slurm_node_and_the_ranks_meet(slurm2, tmp_path):
    ex = SlurmExecutor(
        tmp_path / "state",
        partition=slurm2.partition,
        slurm_conf=slurm2.conf,
        gpus=[Gpu(i, f"declared-{i}", None) for i in range(4)],
        poll_interval_s=0.2,
    )
    port = free_port()
    lease = {
        "task": "g-1",
        "epoch": 1,
        "command": [PY, "-c", RANK, str(tmp_path)],
        "gpus": 4,
        "nodes": 2,
        "grace_s": 1.0,
        "user": "alice",
        "project": None,
        "resource": "team/pair",
        "env": {"MASTER_PORT": str(port)},
    }
    h = ex.start(lease, [0, 1, 2, 3], tmp_path / "g.log")
    try:
        info = subprocess.run(
            ["scontrol", "show", "job", "-o", h.job_id],
            env=ex.cmd_env,
            capture_output=True,
            text=True,
        ).stdout
        assert "NumNodes=2" in info and "TresPerNode=gres:gpu:2" in info, info
        result = asyncio.run(
            wait_for_async(
                lambda: r if isinstance(r := ex.poll(h), Exited) else None,
                60,
                f"slurm job {h.job_id} to end",
            )
        )
    finally:
        subprocess.run(["scancel", h.job_id], env=ex.cmd_env, capture_output=True)
    log = (tmp_path / "g.log").read_text() if (tmp_path / "g.log").exists() else ""
    assert result.exit_code == 0, (result, log)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["heard"] == [1]
    assert {r["SLURMD_NODENAME"] for r in ranks} == {"n1", "n2"}  # one rank per node
    for r, env in enumerate(ranks):
        assert (env["RANK"], env["NODE_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == (
            str(r),
            str(r),
            "2",
            "1",
        )
        assert env["MASTER_PORT"] == str(port) and env["MASTER_ADDR"] == "localhost"
        assert env["CUDA_VISIBLE_DEVICES"] == "0,1"  # each node's 2 GRES GPUs
