"""Refusals quote a short excerpt of the caller's input, never the input (issue 25, item 6):
an MCP tool error echoed a 200 kB value whole, an API 400 up to 2 KB of it. A real
``kliqued serve``; each operation gets a huge value in one place (a path id, a query
parameter, a body field, a label, a key) and answers a small refusal that quotes at most
``klique_util.excerpt.EXCERPT`` characters of it, escaped, with its length."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from klique_util.excerpt import EXCERPT, clip, excerpt
from tests.harness.daemon import Server
from tests.mcp.conftest import call

HUGE = "A" * 200_000
LONG = "A" * 7_000
"""What fits in a request line (aiohttp refuses lines over 8 KB before we see them)."""


def _small_without_the_value(text: str) -> None:
    assert len(text.encode()) < 2048, len(text)
    assert "A" * (EXCERPT + 1) not in text, text[:400]


def test_excerpt_is_short_escaped_and_says_the_length() -> None:
    assert excerpt("abc") == "'abc'"
    assert excerpt("a'b\n\x1b[2J") == "'a\\'b\\n\\u001b[2J'"
    cut = excerpt(HUGE)
    assert cut == "'" + "A" * EXCERPT + "…' (200000 characters)"
    assert excerpt({"k": 1}) == "'{\\\"k\\\": 1}'"  # quoted as JSON writes it
    assert clip("x" * 5, 10) == "x" * 5 and clip("x" * 20, 10) == "x" * 10 + "… (20 characters)"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("echo")).start()
    yield s, s.token({"user": "bob"})
    assert s.stop() == 0, s.log()


CMD = {"resource": "team-a/one", "command": ["true"]}
API = [
    ("GET", f"/v1/tasks/{LONG}", None),                       # an id in the path
    ("GET", f"/v1/events?task={LONG}", None),                 # a query parameter
    ("GET", f"/v1/policies/{LONG}", None),                    # a name in the path
    ("POST", "/v1/tasks", {"resource": HUGE, "command": ["true"]}),  # a body field
    ("POST", "/v1/tasks", {**CMD, "labels": {"a": HUGE}}),    # a label's value
    ("POST", "/v1/tasks", {**CMD, "labels": {HUGE: "a"}}),    # a label's key
    ("POST", "/v1/tasks", {**CMD, "project": HUGE}),
    ("POST", "/v1/tasks", {**CMD, "gpus": HUGE}),             # the wrong type
    ("POST", "/v1/tasks", {**CMD, HUGE: 1}),                  # an unknown property
]


@pytest.mark.parametrize("method,path,body", API, ids=[f"{m} {p[:20]} {str(b)[:40]}"
                                                       for m, p, b in API])
def test_api_refusals_quote_an_excerpt(server, method, path, body) -> None:
    s, bob = server
    status, answer = s.call(method, path, body, bob)
    assert 400 <= status < 500, answer
    _small_without_the_value(json.dumps(answer, ensure_ascii=False))
    assert "…" in answer["error"]["message"] and "characters" in answer["error"]["message"]


MCP = [
    ("show_task", {"task_id": HUGE}),
    ("cancel_task", {"task_id": HUGE}),
    ("read_log", {"task_id": HUGE}),
    ("submit_task", {"resource": HUGE, "command": ["x"]}),
    ("submit_task", {"resource": "team-a/one", "command": ["x"], "labels": {"a": HUGE}}),
    ("explain_task", {"kind": HUGE}),
    ("budget", {"policy": HUGE}),
]


@pytest.mark.parametrize("tool,args", MCP, ids=[f"{t} {list(a)}" for t, a in MCP])
def test_mcp_tool_errors_quote_an_excerpt(server, tool, args) -> None:
    s, bob = server
    err, text = call(s.url + "/mcp", bob, tool, args)
    assert err, text
    _small_without_the_value(str(text))
    assert "(200000 characters)" in str(text), str(text)[:400]
