"""A real single-node Slurm per test session, when Debian's packages are installed."""

from __future__ import annotations

import os

import pytest

from tests.harness.slurm import LocalSlurm, missing_binaries


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    missing = missing_binaries()
    if missing:
        pytest.skip(
            f"Slurm is not installed here ({', '.join(missing)} missing): "
            "`make test` installs slurm-wlm and munge from Debian's packages "
            "(tests/setup/system-packages.sh)"
        )
    if os.geteuid() != 0:
        pytest.skip("the local Slurm runs its daemons as root")
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"), gpus=8)
    cluster.start()
    yield cluster
    cluster.stop()
