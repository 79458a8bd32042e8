"""A schedule's runs and a pipeline's steps still say how their tasks ended once those tasks
have left memory for the task history (issue 18's bounded state, ``--keep-ended 0``): the
views read the evicted tasks back (``history.recall_all``), one query per view."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from kliqued.daemon.server import CLOCK_OFFSET_ENV
from tests.daemon.fleet import FleetServer
from tests.daemon.test_bounded import records_in_memory
from tests.harness.wait import wait_for

PIPELINE = """\
pipeline: nightly
steps:
  - name: only
    resource: team-a/one
    command: ["sleep", "600"]
"""


@pytest.fixture
def fs(tmp_path: Path):
    s = FleetServer(tmp_path, extra=["--keep-ended", "0"]).start()
    s.alice = s.token({"user": "alice"})  # type: ignore[attr-defined]
    yield s
    log = s.log()
    assert s.stop() == 0, log
    assert "Traceback" not in log, log


def test_an_ended_pipelines_step_says_how_its_evicted_task_ended(fs: FleetServer) -> None:
    alice = fs.alice  # type: ignore[attr-defined]
    pid = fs.ok("POST", "/v1/pipelines", {"text": PIPELINE}, token=alice, expect=201)["id"]
    step = wait_for(
        lambda: fs.ok("GET", f"/v1/pipelines/{pid}", token=alice)["steps"][0].get("task"),
        10,
        "the step's task",
    )
    fs.ok("POST", f"/v1/pipelines/{pid}/cancel", token=alice)
    wait_for(lambda: fs.task(step)["state"] == "ended", 10, "the step's task to end")
    wait_for(lambda: records_in_memory(fs) == 0, 10, "the task evicted")
    view = fs.ok("GET", f"/v1/pipelines/{pid}", token=alice)
    (only,) = view["steps"]
    assert only["task"] == step
    assert only["task_state"] and "cancel" in only["task_state"], only
    listed = fs.ok("GET", "/v1/pipelines", token=alice)["pipelines"]
    assert [p["steps"][0]["task_state"] for p in listed] == [only["task_state"]]


def test_a_schedules_run_says_how_its_evicted_task_ended(
    fs: FleetServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice = fs.alice  # type: ignore[attr-defined]
    sid = fs.ok(
        "POST",
        "/v1/schedules",
        {"cron": "0 3 * * *", "resource": "team-a/one", "command": ["sleep", "600"]},
        token=alice,
        expect=201,
    )["id"]
    now = datetime.now(timezone.utc)
    due = now.replace(hour=3, minute=0, second=0, microsecond=0)
    due = due if due > now else due + timedelta(days=1)
    assert fs.stop() == 0  # back a minute after the next 03:00: the run is made
    monkeypatch.setenv(
        CLOCK_OFFSET_ENV, str(int((due + timedelta(minutes=1) - now).total_seconds() * 1000))
    )
    fs.start()
    run = wait_for(
        lambda: fs.ok("GET", f"/v1/schedules/{sid}", token=alice)["last_runs"],
        20,
        "the schedule's run",
    )[0]
    tid = run["task"]
    fs.ok("POST", f"/v1/tasks/{tid}/cancel", token=alice)
    wait_for(lambda: fs.task(tid)["state"] == "ended", 10, "the run's task to end")
    wait_for(lambda: records_in_memory(fs) == 0, 10, "the task evicted")
    (after,) = fs.ok("GET", f"/v1/schedules/{sid}", token=alice)["last_runs"]
    assert after["task"] == tid
    assert after["state"] and "cancel" in after["state"], after
    (listed,) = fs.ok("GET", "/v1/schedules", token=alice)["schedules"]
    assert listed["last_runs"][0]["state"] == after["state"]
