"""The facts the Slurm executor relies on, checked on the real Slurm the suite starts."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from tests.harness.wait import wait_for


def _state(slurm, job: str) -> str:
    """The job's state in squeue, or "" once it left the queue."""
    return subprocess.run(
        ["squeue", "-h", "-j", job, "-o", "%T"], env=slurm.env, capture_output=True, text=True
    ).stdout.strip()


def _wait_gone(slurm, job: str, timeout: float = 30) -> None:
    wait_for(lambda: not _state(slurm, job), timeout, f"job {job} to leave squeue", every=0.2)


def _sbatch(slurm, tmp: Path, script: str, *args: str) -> str:
    path = tmp / "job.sh"
    path.write_text("#!/bin/bash\n" + script)
    p = subprocess.run(
        ["sbatch", "--parsable", "-o", str(tmp / "out-%j.txt"), *args, str(path)],
        env=slurm.env,
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp,
    )
    return p.stdout.strip().split(";")[0]


def test_gres_gives_gpu_indices(slurm, tmp_path: Path) -> None:
    job = _sbatch(slurm, tmp_path, "echo gpus=$CUDA_VISIBLE_DEVICES\n", "--gres=gpu:3")
    _wait_gone(slurm, job)
    assert (tmp_path / f"out-{job}.txt").read_text().strip() == "gpus=0,1,2"


def test_scancel_full_term_reaches_the_batch_script(slurm, tmp_path: Path) -> None:
    marker = tmp_path / "got-term"
    script = f"trap 'touch {marker}; exit 0' TERM\nsleep 60 &\nwait\n"
    job = _sbatch(slurm, tmp_path, script, "--gres=gpu:1")
    wait_for(lambda: _state(slurm, job) == "RUNNING", 20, f"job {job} to run", every=0.2)
    time.sleep(0.5)  # RUNNING is slurmd's word: the batch shell may not have set its trap yet
    subprocess.run(["scancel", "--signal=TERM", "--full", job], env=slurm.env, check=True)
    _wait_gone(slurm, job)
    assert marker.exists()
