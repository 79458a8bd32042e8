"""The API's rules said in its schema (issue 32): what the daemon refuses for its form, the
OpenAPI document refuses too, and the other way round. tests/daemon/test_openapi.py's
``test_fuzz`` checks it over every operation with schemathesis; these are the cases the
issue named, on a real daemon (in process) and on the document's own schemas."""

from __future__ import annotations

from typing import Any, Iterator

import pytest
from jsonschema import Draft202012Validator

from kliqued.daemon.api.openapi import SCHEMAS, document, validator
from kliqued.daemon.api.schema_rules import NAME_PATTERN

from tests.harness.daemon import EXAMPLE_ESTATE
from tests.harness.inproc import InProcServer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcServer]:
    s = InProcServer(tmp_path_factory.mktemp("schema-rules"), estate=EXAMPLE_ESTATE).start()
    yield s
    assert s.stop() == 0, s.log()


def param(path: str, name: str) -> dict[str, Any]:
    op = document()["paths"][path]["get"]
    return next(p for p in op["parameters"] if p["name"] == name)["schema"]


def test_a_control_character_in_a_name_is_refused_by_the_schema() -> None:
    body = {"resource": "llm-research/h\x07100", "command": ["echo", "a\tb"]}
    assert not validator("TaskSubmission").is_valid(body)
    body["resource"] = "llm-research/h100"
    assert validator("TaskSubmission").is_valid(body)  # a tab in a command: free text
    props = SCHEMAS["TaskSubmission"]["properties"]
    assert props["project"]["pattern"] == NAME_PATTERN
    assert "pattern" not in props["command"]["items"] and "pattern" not in props["payload"]
    assert props["labels"]["propertyNames"]["pattern"] == NAME_PATTERN
    assert param("/v1/tasks/{id}", "id")["pattern"] == NAME_PATTERN


def test_a_body_the_daemon_builds_is_refused_in_words(server: InProcServer) -> None:
    """The MCP tools' bodies skip the edge's text check: the schema refuses them, said as
    the edge says it, naming the place."""
    from kliqued.daemon.api.request import valid
    from kliqued.daemon.errors import ApiError

    with pytest.raises(ApiError) as refused:
        valid({"resource": "llm-research/h100", "project": "ev\x1bals"}, "TaskSubmission")
    assert refused.value.message == (
        "/project: contains a control character; names and ids hold no control characters"
    )


def test_a_period_is_a_month_in_the_schema_and_the_daemon(server: InProcServer) -> None:
    month = Draft202012Validator(param("/v1/ledger/focus", "period"))
    assert month.is_valid("2026-11") and not month.is_valid("0000-00")
    assert not month.is_valid("2026-13") and not month.is_valid(" 2026-11")
    status, err = server.call("GET", "/v1/ledger/focus?period=0000-00")
    assert status == 400 and "is not a month" in err["error"]["message"], err


def test_empty_integer_parameters_are_refused(server: InProcServer) -> None:
    for query in ("limit=", "order=", "state=&limit=5"):
        status, err = server.call("GET", f"/v1/tasks?{query}")
        assert status == 400, (query, err)


def test_null_labels_are_refused(server: InProcServer) -> None:
    body = {"resource": "llm-research/h100", "command": ["true"], "labels": None}
    status, err = server.call("POST", "/v1/tasks", body, server.token("alice"))
    assert status == 400 and "/labels" in err["error"]["message"], err


def test_what_no_schema_can_judge_is_a_422(server: InProcServer) -> None:
    """A time of the right form the calendar lacks, an admin's task without its user."""
    planner = server.token({"role": "planner"})
    status, err = server.call("GET", "/v1/demand?since=2026-02-30T00:00:00Z", token=planner)
    assert status == 422 and err["error"]["details"]["field"] == "since", err
    status, err = server.call("GET", "/v1/demand?since=yesterday", token=planner)
    assert status == 400, err
    body = {"resource": "llm-research/h100", "command": ["true"], "project": "evals"}
    status, err = server.call("POST", "/v1/tasks", body)
    assert status == 422 and err["error"]["details"]["field"] == "user", err
