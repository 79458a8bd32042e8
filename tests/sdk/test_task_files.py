"""``kliqued.sdk.checkpoint()`` and ``preempt_notice()`` inside a task (docs/lending.md):
the checkpoint moves the file's time the worker watches; outside a task the error says the
variable is not set; the notice is what the worker wrote (workers/checkpoints.py)."""

from __future__ import annotations

import json

import pytest

from kliqued.sdk import KliqueError, checkpoint, preempt_notice
from workers import checkpoints


def test_checkpoint_moves_the_file_time_the_worker_watches(tmp_path, monkeypatch) -> None:
    log = str(tmp_path / "t.e1.log")
    for name, value in checkpoints.task_env(log).items():
        monkeypatch.setenv(name, value)
    assert checkpoints.changed(log, None) is None  # never checkpointed
    at = checkpoint()
    seen = checkpoints.changed(log, None)
    assert seen is not None and abs(seen / 1e9 - at.timestamp()) < 0.01
    assert checkpoints.changed(log, seen) is None  # the same time is not a new checkpoint
    assert preempt_notice() is None
    written = checkpoints.write_notice(log, "preempted", "reclaimed by team-a", 30.0)
    assert preempt_notice() == written
    assert json.loads(open(checkpoints.notice_path(log)).read())["reason"] == "preempted"


def test_outside_a_task_the_error_says_why(monkeypatch) -> None:
    monkeypatch.delenv("KLIQUE_CHECKPOINT_FILE", raising=False)
    with pytest.raises(KliqueError) as err:
        checkpoint()
    assert err.value.code == "not-in-task" and "KLIQUE_CHECKPOINT_FILE" in str(err.value)
