"""The worker's exceptions: one base (WorkerError), documented in workers/errors.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers import errors
from workers.cli import main
from workers.executors import make_executor


def test_every_worker_exception_is_a_worker_error_importable_where_it_was() -> None:
    from workers.autoscaler.providers import CapacityUnavailable
    from workers.client import ApiError, StaleEpoch, Unreachable
    from workers.executors.base import StartError
    from workers.gpus import GpuDiscoveryError, PlacementError
    from workers.rollout import RolloutError
    from workers.state import StateDirBusy

    for cls in (
        CapacityUnavailable,
        ApiError,
        StaleEpoch,
        Unreachable,
        StartError,
        GpuDiscoveryError,
        PlacementError,
        RolloutError,
        StateDirBusy,
        errors.ConfigError,
    ):
        assert issubclass(cls, errors.WorkerError), cls
        assert getattr(errors, cls.__name__) is cls


def test_a_worker_that_cannot_start_as_configured_raises_config_error(tmp_path: Path) -> None:
    with pytest.raises(errors.ConfigError, match="unknown executor 'nope'") as info:
        make_executor("nope")
    assert isinstance(info.value, ValueError)  # what callers caught before
    with pytest.raises(errors.ConfigError, match="no bin/ directory there"):
        make_executor("process", state_dir=tmp_path / "state", venv=tmp_path)


def test_an_unreadable_token_file_is_a_clear_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "--url",
            "http://127.0.0.1:9",
            "--pool",
            "p",
            "--gpus",
            "0",
            "--token-file",
            str(tmp_path / "missing.token"),
            "--state-dir",
            str(tmp_path / "state"),
        ]
    )
    assert code == 2
    assert "cannot read the token file" in capsys.readouterr().err
