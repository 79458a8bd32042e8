"""Agents over MCP, for real: ``kliqued serve``'s ``/mcp`` over HTTP with the SDK's client.

An agent acts as its user and can never do more (two users' tokens, a forged one, a revoked
one, a worker's); everything it submits or cancels is the user's, with channel ``mcp``, in the
task, the event log and the ledger; bad input is a tool error in words, never a 5xx.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from typing import Any

import pytest

from tests.daemon.fleet import HttpWorker
from tests.harness.daemon import Server
from tests.harness.wait import wait_for

from .conftest import Tokens, call, mcp_client

TOOLS = {
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


def _url(s: Server) -> str:
    return s.url + "/mcp"


def _submit(s: Server, token: str, **kw) -> dict:
    err, task = call(
        _url(s),
        token,
        "submit_task",
        {"resource": "team-a/one", "command": ["python", "train.py"], **kw},
    )
    assert not err, task
    return task


def test_the_tools_are_listed_and_act_as_the_token_s_user(server: Server, tokens: Tokens) -> None:
    async def go() -> set[str]:
        async with mcp_client(_url(server), tokens.bob) as c:
            return {t.name for t in (await c.list_tools()).tools}

    assert asyncio.run(go()) == TOOLS
    err, me = call(_url(server), tokens.bob, "whoami")
    assert not err and me["principal"] == "user:bob" and me["groups"] == ["team-a"]


def test_a_submission_is_the_user_s_with_channel_mcp_everywhere(
    server: Server, tokens: Tokens
) -> None:
    t = _submit(server, tokens.bob, labels={"run": "r1"})
    assert (t["user"], t["actor"], t["channel"]) == ("bob", "user:bob", "mcp")
    # the API, the event log (the audit trail) and the ledger say the same
    assert server.ok("GET", f"/v1/tasks/{t['id']}", token=tokens.bob)["channel"] == "mcp"
    ev = server.ok("GET", f"/v1/events?task={t['id']}&kind=submitted")["events"][0]
    assert ev["actor"] == "user:bob" and ev["data"]["channel"] == "mcp"
    sql = f"SELECT \"user\", channel FROM usage WHERE task = '{t['id']}'"
    wait_for(lambda: server.ok("POST", "/v1/ledger/sql", {"sql": sql})["rows"], timeout=10)
    assert server.ok("POST", "/v1/ledger/sql", {"sql": sql})["rows"] == [["bob", "mcp"]]
    err, shown = call(_url(server), tokens.bob, "show_task", {"task_id": t["id"]})
    assert not err and shown["id"] == t["id"] and shown["explained"]["task"] == t["id"]
    err, done = call(
        _url(server),
        tokens.bob,
        "cancel_task",
        {"task_id": t["id"], "reason": "agent was asked to"},
    )
    assert not err and done["state"] == "ended"
    ev = server.ok("GET", f"/v1/events?task={t['id']}&kind=cancelled")["events"][0]
    assert ev["actor"] == "user:bob" and ev["data"]["channel"] == "mcp"
    assert ev["data"]["text"] == "cancelled by user:bob: agent was asked to"


def test_an_agent_cannot_do_what_its_user_cannot(server: Server, tokens: Tokens) -> None:
    bobs = _submit(server, tokens.bob)
    before = len(server.ok("GET", "/v1/tasks?limit=1000")["tasks"])
    # erin (team-b) acting through her agent: bob's task does not exist for her
    for tool, args in (
        ("show_task", {"task_id": bobs["id"]}),
        ("explain_task", {"task_id": bobs["id"]}),
        ("cancel_task", {"task_id": bobs["id"]}),
        ("read_log", {"task_id": bobs["id"]}),
    ):
        err, text = call(_url(server), tokens.erin, tool, args)
        assert err and f"no task {bobs['id']} (404 not-found)" in text, (tool, text)
    # ... exactly as a task that does not exist at all
    err, text = call(_url(server), tokens.erin, "show_task", {"task_id": "t-00000000000000"})
    assert err and "no task t-00000000000000 (404 not-found)" in text
    # nor may she send work to team-a's resources: the refusal names what she may use
    err, text = call(
        _url(server), tokens.erin, "submit_task", {"resource": "team-a/one", "command": ["true"]}
    )
    assert err and "422 submission-refused" in text and "erin may submit to team-b/" in text
    assert len(server.ok("GET", "/v1/tasks?limit=1000")["tasks"]) == before
    assert server.ok("GET", f"/v1/tasks/{bobs['id']}")["state"] != "ended"
    # what each may see is their own groups'
    err, res = call(_url(server), tokens.erin, "list_resources")
    mine = {r["name"] for r in res["resources"] if r["may_submit"]}
    assert mine == {"team-b/one", "team-b/sized"}
    err, budget = call(_url(server), tokens.erin, "budget")
    assert [p["name"] for p in budget["policies"]] == ["team-b"]
    err, text = call(_url(server), tokens.erin, "budget", {"policy": "team-a"})
    assert err and "no policy team-a among those user:erin may see" in text
    err, budget = call(_url(server), tokens.bob, "budget", {"policy": "team-a"})
    b = budget["policies"][0]["budget"]
    assert {"used_hours", "left_hours", "burn_rate", "runout_at", "resets_at"} <= set(b)
    # bob's task is bob's alone; alice, team-a's admin, may see and cancel it (as the API)
    err, shown = call(_url(server), tokens.alice, "show_task", {"task_id": bobs["id"]})
    assert not err and shown["user"] == "bob"
    err, done = call(_url(server), tokens.alice, "cancel_task", {"task_id": bobs["id"]})
    assert not err and done["end"]["by"] == "user:alice"


def _raw(
    server: Server,
    token: str | None,
    body: bytes = b"{}",
    headers: dict[str, str] | None = None,
    method: str = "POST",
    path: str = "/mcp",
) -> tuple[int, dict, bytes]:
    h = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        **(headers or {}),
    }
    if token is not None:
        h["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(
        server.url + path, data=body if method == "POST" else None, method=method, headers=h
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


@pytest.mark.parametrize(
    "token, says",
    [(None, "no token"), ("kq_forged-0000000000000000000000000000000000000", "unknown token")],
)
def test_no_token_or_a_forged_one_is_a_401_in_the_mcp_authorization_shape(
    server: Server, token: str | None, says: str
) -> None:
    init = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).encode()
    status, headers, body = _raw(server, token, init)
    assert status == 401
    www = headers["WWW-Authenticate"]
    assert www.startswith('Bearer realm="klique"') and says in www
    assert ('error="invalid_token"' in www) == (token is not None)
    meta = f'resource_metadata="{server.url}/.well-known/oauth-protected-resource/mcp"'
    assert meta in www
    assert json.loads(body)["error"]["code"] == "unauthenticated"
    doc = server.ok("GET", "/.well-known/oauth-protected-resource/mcp", token=None)
    assert doc["resource"] == f"{server.url}/mcp" and doc["bearer_methods_supported"] == ["header"]
    # the SDK's client fails to connect, and nothing was submitted by anyone
    before = len(server.ok("GET", "/v1/tasks?limit=1000")["tasks"])

    async def go() -> None:
        async with mcp_client(_url(server), token) as c:
            await c.call_tool("submit_task", {"resource": "team-a/one", "command": ["x"]})

    with pytest.raises(Exception):
        asyncio.run(go())
    assert len(server.ok("GET", "/v1/tasks?limit=1000")["tasks"]) == before


def test_a_revoked_token_and_a_worker_token_are_refused(server: Server, tokens: Tokens) -> None:
    made = server.ok("POST", "/v1/tokens", {"user": "bob", "name": "agent"}, expect=201)
    err, me = call(_url(server), made["token"], "whoami")
    assert not err and me["principal"] == "user:bob"
    server.ok("DELETE", f"/v1/tokens/{made['id']}", expect=204)
    status, headers, body = _raw(server, made["token"])
    assert status == 401 and "revoked" in headers["WWW-Authenticate"]
    status, _, body = _raw(server, tokens.worker)
    assert status == 403 and b"use a user's token" in body


def test_bad_input_is_a_clear_tool_error(server: Server, tokens: Tokens) -> None:
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("submit_task", {"resource": "team-a/nope", "command": ["true"]}, "422 submission-refused"),
        ("submit_task", {"resource": "team-a/one", "command": []}, "needs `command`"),
        ("submit_task", {"resource": "team-a/one", "command": ["a\x00b"]}, "/command/0"),
        ("submit_task", {"resource": "team-a/sized", "command": ["x"], "gpus": 0.0001}, "400"),
        ("submit_task", {"resource": "team-a/one"}, "command"),
        ("cancel_task", {"task_id": "t-nope", "reason": "x" * 2000}, "at most 1024"),
        ("read_log", {"task_id": "t-nope", "max_bytes": 0}, "max_bytes 1 to"),
        ("explain_task", {}, "either task_id or kind"),
        ("explain_task", {"kind": "luck"}, "no reason kind 'luck'"),
        ("budget", {"policy": 3}, "policy"),
    ]
    for tool, args, says in cases:
        err, text = call(_url(server), tokens.bob, tool, args)
        assert err and says in text, (tool, args, text)
        assert "Traceback" not in text


def test_malformed_protocol_messages_are_refused_not_crashed(
    server: Server, tokens: Tokens
) -> None:
    for body, headers in (
        (b"{}", None),
        (b"not json", None),
        (b"[]", None),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "nope"}}', None),
        (b"{}", {"Accept": "text/html"}),
    ):
        status, _, answer = _raw(server, tokens.bob, body, headers)
        assert 200 <= status < 500, (body, status, answer)
    for method in ("GET", "DELETE"):  # stateless: no stream to hold open, no session
        status, headers, answer = _raw(server, tokens.bob, method=method)
        assert status == 405, method
        # the OpenAPI entry's answer: the contract's error, with the Allow header RFC 9110 wants
        assert headers.get("Allow") == "POST", (method, headers)
        assert json.loads(answer)["error"]["code"] == "method-not-allowed", answer
    # a body that is not JSON: the contract's 415, not the SDK's own answer
    for ctype in ("text/plain", "application/octet-stream"):
        status, _, answer = _raw(server, tokens.bob, b"{}", {"Content-Type": ctype})
        assert status == 415, (ctype, answer)
        err = json.loads(answer)["error"]
        assert err["code"] == "unsupported-media-type" and ctype in err["message"]
    status, _, _ = _raw(server, tokens.bob, b"x" * (2 * 1024 * 1024))
    assert status == 413


def test_explain_a_waiting_task_and_read_its_log(server: Server, tokens: Tokens) -> None:
    # fill team-a's pool-1 (4 GPUs, team-a's limit is 10): the fifth one waits for capacity
    ids = [_submit(server, tokens.alice)["id"] for _ in range(5)]
    wait_for(
        lambda: server.ok("GET", f"/v1/tasks/{ids[-1]}")["waiting_reason"]["kind"] != "pending",
        timeout=10,
    )
    err, why = call(_url(server), tokens.alice, "explain_task", {"task_id": ids[-1]})
    assert not err and why["kind"] == "capacity" and "no room in pools pool-1" in why["reason"]
    assert "free" in why["what_you_can_do"]
    err, kind = call(_url(server), tokens.alice, "explain_task", {"kind": "budget"})
    assert not err and "budget" in kind["meaning"]
    # a worker runs the first one and sends its output; the agent reads it
    w = HttpWorker(server, tokens.worker, "w-mcp-1", pool="pool-1", gpus=4)
    w.register()
    leases = w.lease()
    lease = next(x for x in leases if x["task"] in ids)
    st, _ = w.call(
        "POST",
        f"/v1/tasks/{lease['task']}/log?offset=0&epoch={lease['epoch']}",
        raw="epoch 1 loss 0.25\n".encode(),
    )
    assert st == 200
    err, log = call(_url(server), tokens.alice, "read_log", {"task_id": lease["task"]})
    assert not err and log["text"] == "epoch 1 loss 0.25\n" and log["attempts"] == [1]
    assert log["next_offset"] == len("epoch 1 loss 0.25\n") and log["complete"] is False
    err, log = call(
        _url(server),
        tokens.alice,
        "read_log",
        {"task_id": lease["task"], "offset": 6, "max_bytes": 6},
    )
    assert log["text"] == "1 loss" and log["next_offset"] == 12
    err, pools = call(_url(server), tokens.alice, "list_pools")
    assert {p["name"] for p in pools["pools"]} == {"pool-1", "pool-2"}
    for t in ids:
        server.ok("POST", f"/v1/tasks/{t}/cancel")
