"""Fractions on a node: the memory share of a fractional task (workers/gpus.py), in the
environment the process executor gives it, and through a whole worker placing fractions."""

from __future__ import annotations

import sys

from workers.executors import RUNNING
from workers.executors.process import ProcessExecutor
from workers.gpus import Gpu, fraction_memory_mb, memory_cap_env
from tests.harness.wait import wait_for

PY = sys.executable
SHOW = (
    "import os; print(*(os.environ.get(k) for k in ('CUDA_VISIBLE_DEVICES', "
    "'KLIQUE_GPU_MEMORY_FRACTION', 'KLIQUE_GPU_MEMORY_MB', "
    "'CUDA_MPS_PINNED_DEVICE_MEM_LIMIT')))"
)


def test_the_memory_share_of_a_fraction():
    gpus = [Gpu(0, "GPU-a", 81920), Gpu(1, "GPU-b", 40960), Gpu(2, "declared-2", None)]
    assert memory_cap_env(gpus, [1], 250) == {
        "KLIQUE_GPU_MEMORY_FRACTION": "0.25",
        "KLIQUE_GPU_MEMORY_MB": "10240",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=10240M",
    }  # MPS counts visible devices: 0
    assert memory_cap_env(gpus, [2], 500) == {"KLIQUE_GPU_MEMORY_FRACTION": "0.5"}
    assert memory_cap_env(gpus, [0], 1000) == {}  # a whole GPU: no cap
    assert memory_cap_env(gpus, [0, 1], 2000) == {}
    assert fraction_memory_mb(81920, 333) == 27279  # rounded down, never above
    assert fraction_memory_mb(None, 500) is None


def lease(gpus, **extra):
    return {"task": "t-1", "epoch": 1, "command": [PY, "-c", SHOW], "gpus": gpus, **extra}


def run(ex, lease_, indices, log):
    h = ex.start(lease_, indices, log)
    wait_for(lambda: ex.poll(h) is not RUNNING, 10, "exit")
    return log.read_text().split()


def test_the_process_executor_sets_the_cap_of_a_fraction(tmp_path):
    ex = ProcessExecutor(tmp_path / "s", gpus=[Gpu(0, "GPU-a", 81920), Gpu(1, "GPU-b", 24576)])
    assert run(ex, lease(0.5, env={"KLIQUE_GPU_MEMORY_MB": "999999"}), [1], tmp_path / "a") == [
        "1",
        "0.5",
        "12288",
        "0=12288M",
    ]  # a lease cannot raise its cap
    assert run(ex, lease(1.0), [0], tmp_path / "b") == ["0", "None", "None", "None"]
    unknown = ProcessExecutor(tmp_path / "s2")  # declared GPUs: memory unknown
    assert run(unknown, lease(0.25), [3], tmp_path / "c") == ["3", "0.25", "None", "None"]


def test_a_worker_with_known_gpu_memory_caps_its_fractions(peer, worker, tmp_path):
    worker("0", extra=["--gpu-memory", "16384"])
    tid = peer.submit([PY, "-c", SHOW], gpus=0.25)
    peer.wait_for(lambda: peer.end(tid), 10, "finished")
    assert peer.log(tid).split() == [b"0", b"0.25", b"4096", b"0=4096M"]
    reg = next(iter(peer.workers.values()))
    assert reg["gpus"][0]["memory_mb"] == 16384
