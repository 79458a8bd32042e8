"""The schedules' and pipelines' answers against the document's schemas, now generated from
models (kliqued/api_models/responses.py): a schedule of a command, one of a pipeline,
a pipeline run and the task lists they make, from a real daemon, validate against
``Schedule``, ``ScheduleList``, ``Pipeline``, ``PipelineList`` and ``TaskList``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from kliqued.daemon.api.openapi import validator

from tests.daemon.fleet import FleetServer, running_fleet
from tests.harness.wait import wait_for

PIPELINE = """\
pipeline: answers
steps:
  - name: first
    resource: team-a/one
    command: ["true"]
  - name: second
    resource: team-a/one
    needs: [first]
    command: ["true"]
"""


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[FleetServer]:
    yield from running_fleet(tmp_path, ("alice",))


def valid(schema: str, body: Any) -> Any:
    errors = [e.message for e in validator(schema).iter_errors(body)]
    assert not errors, (schema, errors[:3], body)
    return body


def test_schedules_pipelines_and_their_tasks_answer_as_the_document_says(fs) -> None:
    token = fs.alice  # type: ignore[attr-defined]
    made = fs.ok(
        "POST",
        "/v1/schedules",
        {"cron": "0 3 * * *", "resource": "team-a/one", "command": ["true"], "name": "n"},
        token=token,
        expect=201,
    )
    assert valid("Schedule", made)["next_runs"]
    piped = fs.ok(
        "POST",
        "/v1/schedules",
        {"cron": "0 4 * * *", "pipeline": {"text": PIPELINE}},
        token=token,
        expect=201,
    )
    assert valid("Schedule", piped)["pipeline"]["file"]
    paused = fs.ok("POST", f"/v1/schedules/{made['id']}/pause", token=token)
    assert valid("Schedule", paused)["state"] == "paused"
    assert len(valid("ScheduleList", fs.ok("GET", "/v1/schedules", token=token))["schedules"]) == 2
    run = fs.ok("POST", "/v1/pipelines", {"text": PIPELINE}, token=token, expect=201)
    assert [s["name"] for s in valid("Pipeline", run)["steps"]] == ["first", "second"]
    listed = valid("PipelineList", fs.ok("GET", "/v1/pipelines", token=token))
    assert [p["id"] for p in listed["pipelines"]] == [run["id"]]

    def some_tasks() -> Any:
        body = fs.ok("GET", "/v1/tasks", token=token)
        return body if body["tasks"] else None

    tasks = wait_for(some_tasks, 10, "the first step's task")
    assert [t["channel"] for t in valid("TaskList", tasks)["tasks"]] == ["pipeline"]
    fs.ok("POST", f"/v1/pipelines/{run['id']}/cancel", token=token)
    assert valid("Pipeline", fs.ok("GET", f"/v1/pipelines/{run['id']}", token=token))
