"""The worker protocol's answers against the document's schemas, now that these are
generated from models (kliqued/api_models/responses.py): what a real daemon answers a
worker, spoken by hand over HTTP, validates against ``Registered``, ``Leases``,
``HeartbeatAnswer`` (with a stop instruction), ``LogSize``, ``ReportAnswer``,
``ReportResults`` and ``Deregistered``."""

from __future__ import annotations

from typing import Any

import pytest

from kliqued.daemon.api.openapi import validator

from .fleet import HttpWorker, now_rfc3339, running_fleet
from tests.harness.wait import wait_for


@pytest.fixture
def fs(tmp_path):
    yield from running_fleet(tmp_path, ("erin",))


def valid(schema: str, answer: tuple[int, Any] | Any) -> Any:
    body = answer
    if isinstance(answer, tuple):
        status, body = answer
        assert status == 200, body
    errors = [e.message for e in validator(schema).iter_errors(body)]
    assert not errors, (schema, errors[:3], body)
    return body


def test_every_answer_to_a_worker_is_what_the_document_says(fs) -> None:
    w = HttpWorker(fs, fs.wt, "w-answers")
    assert valid("Registered", w.register())["worker_id"] == "w-answers"
    first = fs.submit(fs.erin, "team-b/one", ["echo", "hi"])
    second = fs.submit(fs.erin, "team-b/one", ["sleep", "60"])
    wait_for(lambda: all(fs.task(t)["state"] == "placed" for t in (first, second)))
    leases = valid(
        "Leases", w.call("POST", f"/v1/workers/{w.id}/lease?wait=0", {"free_gpus": [0, 1]})
    )
    assert sorted(x["task"] for x in leases["leases"]) == sorted([first, second])
    assert valid("ReportAnswer", w.report(first, 1, "started"))["task"]["state"] == "running"
    size = w.call("POST", f"/v1/tasks/{first}/log?offset=0&epoch=1", raw=b"hi\n")
    assert valid("LogSize", size) == {"size": 3}
    fs.ok("POST", f"/v1/tasks/{second}/cancel", {"reason": "not needed"})
    beat = valid("HeartbeatAnswer", w.heartbeat([(first, 1), (second, 1)]))
    assert [s["task"] for s in beat["stop"]] == [second]
    batch = {
        "reports": [
            {"task": first, "epoch": 1, "event": "finished", "exit_code": 0, "at": now_rfc3339()},
            {"task": second, "epoch": 1, "event": "stopped", "at": now_rfc3339()},
            {"task": "t-nope", "epoch": 1, "event": "finished", "at": now_rfc3339()},
        ]
    }
    results = valid("ReportResults", w.call("POST", f"/v1/workers/{w.id}/reports", batch))
    assert [r["status"] for r in results["results"]][:2] == [200, 200]
    assert results["results"][2]["status"] == 404 and results["results"][2]["error"]
    gone = valid("Deregistered", w.call("DELETE", f"/v1/workers/{w.id}"))
    assert (gone["worker"], gone["pool"]) == ("w-answers", "bare")
