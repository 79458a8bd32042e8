"""The MCP tools' input schemas take the API's words and bounds: each argument that is a
field of the API's request body is described by the document's schema of that field,
generated from the API's models (kliqued/api_models/requests.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.server.mcpserver.tools import Tool

from kliqued.daemon.api.schema_rules import with_name_rule
from kliqued.api_models.requests import TaskSubmission
from kliqued.api_models.schema import components
from kliqued.daemon.api.agents import tools
from kliqued.daemon.api.openapi import SCHEMAS

from tests.mcp.test_mcp_inprocess import _daemon, _stop


def _input_schemas(tmp_path: Path) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        c, runner = await _daemon(tmp_path)
        try:
            async with Client(tools.build(c)) as client:
                return {t.name: t.input_schema for t in (await client.list_tools()).tools}
        finally:
            await _stop(c, runner)

    return asyncio.run(go())


def test_tool_arguments_that_are_api_fields_have_the_api_s_schema(tmp_path: Path) -> None:
    schemas = _input_schemas(tmp_path)
    submit, body = schemas["submit_task"], SCHEMAS["TaskSubmission"]["properties"]
    for name in ("resource", "gpus", "project", "labels"):
        assert submit["properties"][name] == body[name], name
    # command: required by the tool, so the body's array without its null
    assert submit["properties"]["command"] == {**body["command"], "type": "array"}
    assert submit["required"] == ["resource", "command"]
    assert submit["properties"]["gpus"]["multipleOf"] == 0.001  # the bounds reach the agent
    dry = schemas["dry_run_task"]  # issue 31: the same fields as submit_task's
    for name in ("resource", "command", "gpus", "project", "labels"):
        assert dry["properties"][name] == submit["properties"][name], name
    assert dry["required"] == ["resource", "command"]
    cancel = schemas["cancel_task"]
    assert cancel["properties"]["reason"] == SCHEMAS["CancelRequest"]["properties"]["reason"]
    assert cancel["required"] == ["task_id"]
    # arguments that are not body fields keep the SDK's schema from the signature
    assert submit["properties"]["idempotency_key"]["anyOf"] == [
        {"type": "string"},
        {"type": "null"},
    ]
    assert set(schemas) == {
        "whoami",
        "list_resources",
        "submit_task",
        "dry_run_task",
        "show_task",
        "explain_task",
        "cancel_task",
        "read_log",
        "budget",
        "list_pools",
    }


def test_every_argument_of_a_body_tool_is_a_field_of_its_model(tmp_path: Path) -> None:
    """The tools, the document and the SDK share one model per body: a tool's argument is a
    field of it (with the schema generated from the model itself, not only the document's
    copy) or one of the declared others."""
    schemas = _input_schemas(tmp_path)
    assert set(tools.BODIES) == {"submit_task", "dry_run_task", "cancel_task"}
    for name, model in tools.BODIES.items():
        # the model's own schema, with the rule the document states for a request's names
        own = with_name_rule(components([model]), [model.__name__])[model.__name__]["properties"]
        tool = schemas[name]
        for arg, schema in tool["properties"].items():
            if arg in tools.NOT_FIELDS:
                assert arg not in model.model_fields, (name, arg)
                continue
            assert arg in model.model_fields, (name, arg)
            want = tools._required(own[arg]) if arg in tool["required"] else own[arg]
            assert schema == want, (name, arg)


def test_a_tool_argument_that_is_no_field_of_its_model_fails_the_build() -> None:
    """A field renamed in the model (``gpus`` to ``gpu_count``, say) cannot leave the tool
    behind: the server is not built."""

    async def submit_task(resource: str, command: list[str], gpu_count: float) -> None:
        """A tool whose argument drifted from ``TaskSubmission``."""

    with pytest.raises(ValueError, match="gpu_count is no field of TaskSubmission"):
        tools.with_api_fields(Tool.from_function(submit_task))
    with pytest.raises(TypeError, match="gpu_count: no field of TaskSubmission"):
        tools.api_body(TaskSubmission, resource="a/b", gpu_count=1)
    assert tools.api_body(TaskSubmission, resource="a/b", gpus=None, labels={}) == {
        "resource": "a/b",
        "labels": {},
    }
