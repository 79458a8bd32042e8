"""Issue 25, item 10, on the real local Slurm (tests/slurm/conftest.py): a task leased by a
``klique-worker --executor slurm`` of a pool whose estate says ``settings: {partition,
account, qos}`` runs as a Slurm job with that account and partition, as ``scontrol show
job`` shows them. The worker is given no --partition and no --sbatch-arg: the account can
only come from the pool's settings, through the control plane's lease.

The test Slurm keeps no accounting (AccountingStorageType defaults to
accounting_storage/none): sbatch then takes any --account and --qos without checking them
against slurmdbd; slurmctld keeps the job's account (and, MinJobAge=300, the ended job in
``scontrol show job``) but drops its QOS, which only accounting keeps."""

from __future__ import annotations

import subprocess
import sys
from typing import Iterator

import pytest

from tests.daemon.fleet import ESTATE, FleetServer, RealWorker, write_estate
from tests.harness.wait import wait_for
from workers.executors.slurm import parse_keyvalues

HPC_POOL = """\
pools:
  - name: hpc-slurm
    kind: hpc
    capacity: 2
    gpu_type: l40s-48gb
    settings:
      scheduler: slurm
      partition: {partition}
      account: northwind-klique
      qos: normal
"""
PROFILES = """\
profiles:
  - name: one
    gpus: 1
    pools: [hpc-slurm]
    policies: [team-a, team-b]
"""


@pytest.fixture
def fs(slurm, tmp_path) -> Iterator[FleetServer]:
    files = {
        **ESTATE,
        "pools.yaml": HPC_POOL.format(partition=slurm.partition),
        "profiles.yaml": PROFILES,
    }
    s = FleetServer(tmp_path, estate=write_estate(tmp_path / "estate", files)).start()
    yield s
    log = s.log()
    assert s.stop() == 0, log
    assert "Traceback" not in log, log


def _job_of(slurm, task: str) -> dict[str, str]:
    """The Slurm job of a task (its name is klique-<task>), as scontrol shows it."""
    out = subprocess.run(
        ["scontrol", "show", "job", "-o"], env=slurm.env, capture_output=True, text=True
    ).stdout
    for line in out.splitlines():
        fields = parse_keyvalues(line)
        if fields.get("JobName") == f"klique-{task}":
            return fields
    return {}


def test_a_slurm_job_gets_the_pools_account_partition_and_qos(fs, slurm, tmp_path) -> None:
    erin = fs.token({"user": "erin"})
    w = RealWorker(
        fs,
        fs.token({"worker": True, "pool": "hpc-slurm"}),
        tmp_path / "w",
        pool="hpc-slurm",
        extra=["--executor", "slurm", "--slurm-conf", str(slurm.conf)],
    )
    try:
        w.start()
        tid = fs.submit(erin, "team-b/one", [sys.executable, "-c", "print('ran on slurm')"])
        wait_for(lambda: fs.task(tid)["state"] == "ended", 60, "the task to end")
        assert fs.task(tid)["end_reason"] == "finished", fs.task(tid)
        job = wait_for(lambda: _job_of(slurm, tid), 10, "the task's Slurm job")
        assert job["Account"] == "northwind-klique", job
        assert job["Partition"] == slurm.partition, job
        # QOS: slurmctld without accounting keeps none ("(null)"); sbatch took --qos=normal
        # without refusing it (the job ran), and the command line test shows it is passed
    except BaseException:
        sys.stderr.write(w.stderr())
        raise
    finally:
        w.stop()
    assert "Traceback" not in w.stderr(), w.stderr()
