"""Refusals quote a short excerpt of the caller's input, never the input (issue 25, item 6):
an MCP tool error echoed a 200 kB value whole, an API 400 up to 2 KB of it. A real
``kliqued serve``; each operation gets a huge value in one place (a path id, a query
parameter, a body field, a label, a key) and answers a small refusal that quotes at most
``klique_util.excerpt.EXCERPT`` characters of it, escaped, with its length."""

from __future__ import annotations

import json

import pytest

from klique_util.excerpt import EXCERPT, clip, excerpt
from tests.harness.daemon import Server
from tests.harness.inproc import InProcServer
from tests.mcp.conftest import call

HUGE = "A" * 200_000
LONG = "A" * 7_000
"""What fits in a request line (aiohttp refuses lines over 8 KB before we see them)."""


def _small_without_the_value(text: str) -> None:
    assert len(text.encode()) < 2048, len(text)
    assert "a" * (EXCERPT + 1) not in text.lower(), text[:400]  # SQL names come lowercased


def test_excerpt_is_short_escaped_and_says_the_length() -> None:
    assert excerpt("abc") == "'abc'"
    assert excerpt("a'b\n\x1b[2J") == "'a\\'b\\n\\u001b[2J'"
    cut = excerpt(HUGE)
    assert cut == "'" + "A" * EXCERPT + "…' (200000 characters)"
    assert excerpt({"k": 1}) == "'{\\\"k\\\": 1}'"  # quoted as JSON writes it
    assert clip("x" * 5, 10) == "x" * 5 and clip("x" * 20, 10) == "x" * 10 + "… (20 characters)"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = InProcServer(tmp_path_factory.mktemp("echo")).start()
    yield s, s.token({"user": "bob"})
    assert s.stop() == 0, s.log()


CMD = {"resource": "team-a/one", "command": ["true"]}
API = [
    ("GET", f"/v1/tasks/{LONG}", None),  # an id in the path
    ("GET", f"/v1/events?task={LONG}", None),  # a query parameter
    ("GET", f"/v1/policies/{LONG}", None),  # a name in the path
    ("POST", "/v1/tasks", {"resource": HUGE, "command": ["true"]}),  # a body field
    ("POST", "/v1/tasks", {**CMD, "labels": {"a": HUGE}}),  # a label's value
    ("POST", "/v1/tasks", {**CMD, "labels": {HUGE: "a"}}),  # a label's key
    ("POST", "/v1/tasks", {**CMD, "project": HUGE}),
    ("POST", "/v1/tasks", {**CMD, "gpus": HUGE}),  # the wrong type
    ("POST", "/v1/tasks", {**CMD, HUGE: 1}),  # an unknown property
]


@pytest.mark.parametrize(
    "method,path,body", API, ids=[f"{m} {p[:20]} {str(b)[:40]}" for m, p, b in API]
)
def test_api_refusals_quote_an_excerpt(server, method, path, body) -> None:
    s, bob = server
    status, answer = s.call(method, path, body, bob)
    assert 400 <= status < 500, answer
    _small_without_the_value(json.dumps(answer, ensure_ascii=False))
    assert "…" in answer["error"]["message"] and "characters" in answer["error"]["message"]


MCP: list[tuple[str, dict[str, object]]] = [
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


# ----------------------------------------------------------------- the remaining sites
# Each refusal below once quoted the caller's value whole (``{x!r}``, ``no session {id}``):
# only the 1,000-character cut bounded it. Who asks matters (a finance token reaches the
# ledger, a worker token the worker protocol, the admin tokens and workers), so each probe
# names its caller.

PIPELINE = """pipeline: p
steps:
  - name: a
    resource: team-a/one
    command: ["{arg}"]
    needs: [{needs}]
"""
"""A pipeline whose step needs a step, uses a parameter, or is given one: each unknown."""

SITES = [
    ("bob", "GET", f"/v1/resources/{LONG}/one/queue", None),  # no compute resource
    ("bob", "GET", f"/v1/sessions/{LONG}", None),
    ("bob", "POST", f"/v1/sessions/{LONG}/stop", {}),
    ("bob", "GET", f"/v1/pipelines/{LONG}", None),
    ("bob", "GET", f"/v1/schedules/{LONG}", None),
    ("bob", "POST", f"/v1/schedules/{LONG}/pause", {}),
    ("admin", "DELETE", f"/v1/tokens/{LONG}", None),
    ("admin", "POST", f"/v1/tokens/{LONG}/rotate", {}),
    ("admin", "DELETE", f"/v1/workers/{LONG}", None),
    ("admin", "POST", f"/v1/pools/{LONG}/autoscaler", {}),  # no pool (cloud)
    ("worker", "POST", f"/v1/workers/{LONG}/heartbeat", {}),  # the worker protocol
    ("worker", "POST", f"/v1/workers/{LONG}/lease", {}),
    ("bob", "GET", f"/v1/tasks?limit={LONG}", None),  # an integer parameter
    ("bob", "GET", f"/v1/tasks?state={LONG}", None),  # a choice
    ("admin", "GET", f"/v1/demand?since={LONG}", None),
    ("finance", "GET", f"/v1/ledger/focus?period={LONG}", None),
    ("finance", "GET", f"/v1/ledger/statement?group={LONG}&period=2026-11", None),
    ("finance", "GET", f"/v1/ledger/statement?group=team-a&period={LONG}", None),
    ("finance", "GET", f"/v1/ledger/export?from={LONG}", None),
    ("finance", "GET", f"/v1/ledger/feed?cursor={LONG}", None),
    ("finance", "GET", f"/v1/ledger/feed?limit={LONG}", None),
    # The SQL's own bound (the schema) refuses a 200 kB query; names within it reach the
    # sandbox, which names the relation it refuses.
    ("finance", "POST", "/v1/ledger/sql", {"sql": "SELECT * FROM " + "A" * 3000}),
    ("finance", "POST", "/v1/ledger/sql", {"sql": "SELECT * FROM x." + "A" * 3000}),
    ("bob", "POST", "/v1/schedules", {**CMD, "cron": HUGE}),
    ("bob", "POST", "/v1/schedules", {**CMD, "cron": "0 3 * * *", "timezone": HUGE}),
    # Within the schema's bounds (cron 256, resource 512 characters), so the cron parser and
    # the engine are the ones that refuse (a time zone's 64 are shorter than an excerpt).
    ("bob", "POST", "/v1/schedules", {**CMD, "cron": "0 3 * * * " + "A" * 200}),
    ("bob", "POST", "/v1/schedules", {**CMD, "cron": "A" * 200 + " 3 * * *"}),
    ("bob", "POST", "/v1/tasks", {**CMD, "resource": "team-a/" + "A" * 400}),
    (
        "bob",
        "POST",
        "/v1/schedules",
        {**CMD, "cron": "0 3 * * *", "resource": "team-a/" + "A" * 400},
    ),
    ("admin", "POST", "/v1/tokens", {"worker": True, "pool": "A" * 200}),  # schema: 256
    ("bob", "POST", "/v1/pipelines", {"text": PIPELINE.format(needs="A" * 3000, arg="x")}),
    (
        "bob",
        "POST",
        "/v1/pipelines",
        {"text": PIPELINE.format(needs="", arg="${params." + "A" * 3000 + "}")},
    ),
    (
        "bob",
        "POST",
        "/v1/pipelines",
        {"text": PIPELINE.format(needs="", arg="x"), "params": {"A" * 3000: "x"}},
    ),
]


@pytest.fixture(scope="module")
def callers(server) -> dict[str, str]:
    s, bob = server
    return {
        "bob": bob,
        "admin": s.admin or "",
        "finance": s.token({"role": "finance"}),
        "worker": s.token({"worker": True, "pool": "pool-1"}),
    }


@pytest.mark.parametrize(
    "who,method,path,body", SITES, ids=[f"{w} {m} {p[:28]} {str(b)[:40]}" for w, m, p, b in SITES]
)
def test_every_site_quotes_an_excerpt(server, callers, who, method, path, body) -> None:
    s, _ = server
    status, answer = s.call(method, path, body, callers[who])
    assert 400 <= status < 500, (status, str(answer)[:400])
    _small_without_the_value(json.dumps(answer, ensure_ascii=False))
    assert "characters)" in answer["error"]["message"], answer


def test_a_channel_header_is_quoted_as_an_excerpt(server) -> None:
    s, bob = server
    status, answer = s.call("POST", "/v1/tasks", CMD, bob, headers={"X-Klique-Channel": LONG})
    assert status == 400, answer
    message = answer["error"]["message"]
    _small_without_the_value(message)
    assert "(7000 characters)" in message, message


def test_a_session_host_is_quoted_as_an_excerpt(tmp_path) -> None:
    """With ``--sessions-domain`` the sessions' listener names a Host it does not know: the
    caller's header."""
    import http.client
    from tests.harness.daemon import free_port

    port = free_port()
    s = Server(
        tmp_path,
        extra=[
            "--sessions-listen",
            f"127.0.0.1:{port}",
            "--sessions-domain",
            f"http://sessions.test:{port}",
        ],
    ).start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            conn.request("GET", "/", headers={"Host": "h" + "A" * 6000})
            resp = conn.getresponse()
            text = resp.read().decode("utf-8", "replace")
        finally:
            conn.close()
    finally:
        assert s.stop() == 0, s.log()
    assert resp.status == 404, text[:400]
    _small_without_the_value(text)
    assert "(6001 characters)" in text, text


DASHBOARD = [
    "/orchestration?window=",
    "/my-work?state=",
    "/usage?from=",
    "/usage?by=",
    "/audit?kind=",
    "/usage/export?format=",
]


@pytest.mark.parametrize("path", DASHBOARD)
def test_dashboard_error_pages_quote_an_excerpt(server, path) -> None:
    from tests.web.browser import Browser

    s, _ = server
    b = Browser(s.url)
    b.sign_in(s.admin or "")
    page = b.get(path + "x" + LONG)
    assert page.status == 400, page.text[:400]
    assert "A" * (EXCERPT + 1) not in page.text
    assert "(7001 characters)" in page.text, page.text[-2000:]
