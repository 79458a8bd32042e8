"""Every endpoint of the API against a real daemon (the small test estate: pool-1 holds 4
one-GPU tasks, pool-2 8 GPUs of task-sized work)."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from kliqued.daemon.api.openapi import validator

from tests.harness.daemon import Server
from tests.harness.wait import wait_for  # also the old import path of other tests


def valid(schema: str, data: Any) -> Any:
    errors = list(validator(schema).iter_errors(data))
    assert not errors, [e.message for e in errors[:3]]
    return data


def submit(
    s: Server, token: str, body: dict[str, Any], expect: int = 201, **kw: Any
) -> dict[str, Any]:
    body = {"command": ["true"], **body}  # a task needs a command or a payload
    return valid("Task", s.ok("POST", "/v1/tasks", body, token, expect=expect, **kw))


def task_state(s: Server, tid: str, token: str = "admin") -> dict[str, Any]:
    return s.ok("GET", f"/v1/tasks/{tid}", token=token)


def cancel_all(s: Server, ids: list[str]) -> None:
    for tid in ids:
        s.ok("POST", f"/v1/tasks/{tid}/cancel")


def test_public_endpoints(server: Server) -> None:
    status, health = server.call("GET", "/v1/health", token=None)
    assert status == 200 and valid("Health", health)["status"] == "ok"
    assert health["revision"].startswith("sha256:")
    status, doc = server.call("GET", "/v1/openapi.json", token=None)
    assert status == 200 and doc["openapi"] == "3.1.0"
    assert doc["servers"] == [{"url": server.url}]


def test_whoami(server: Server, who) -> None:
    a = valid("WhoAmI", server.ok("GET", "/v1/whoami", token=who.alice))
    assert (a["principal"], a["groups"], a["admin_of"]) == ("user:alice", ["team-a"], ["team-a"])
    w = server.ok("GET", "/v1/whoami", token=who.walter)
    assert w["groups"] == [] and w["admin_of"] == ["lab", "team-a", "team-b"]
    f = server.ok("GET", "/v1/whoami", token=who.finance)
    assert (f["kind"], f["roles"]) == ("role", ["finance"])
    k = server.ok("GET", "/v1/whoami", token=who.worker)
    assert (k["kind"], k["name"]) == ("worker", "pool-1")


def test_submit_place_cancel(server: Server, who) -> None:
    t = submit(
        server,
        who.bob,
        {
            "resource": "team-a/sized",
            "gpus": 1.5,
            "project": "p1",
            "command": ["python", "train.py"],
            "labels": {"run": "r1"},
        },
    )
    assert (t["user"], t["actor"], t["gpus"], t["state"]) == ("bob", "user:bob", 1.5, "queued")
    assert t["id"].startswith("t-") and t["labels"] == {"run": "r1"}
    placed = wait_for(lambda: (x := task_state(server, t["id"]))["state"] == "placed" and x)
    assert placed["pool"] == "pool-2" and placed["placed_at"] and placed["position"] is None
    ended = valid("Task", server.ok("POST", f"/v1/tasks/{t['id']}/cancel", token=who.bob))
    assert (ended["state"], ended["end_reason"]) == ("ended", "cancelled")
    again = server.ok("POST", f"/v1/tasks/{t['id']}/cancel", token=who.bob)
    assert again["ended_at"] == ended["ended_at"]
    ev = server.ok("GET", f"/v1/events?task={t['id']}", token=who.bob)["events"]
    assert [e["kind"] for e in ev] == ["submitted", "placed", "cancelled"]
    assert ev[0]["actor"] == "user:bob" and ev[2]["actor"] == "user:bob"
    assert ev[1]["data"]["pool"] == "pool-2" and ev[1]["data"]["interval"] == f"{t['id']}#1"


def test_idempotency_key(server: Server, who) -> None:
    body = {"resource": "team-a/sized", "gpus": 0.25}
    h = {"Idempotency-Key": "retry-1"}
    first = submit(server, who.bob, body, headers=h)
    second = submit(server, who.bob, body, expect=200, headers=h)
    assert second["id"] == first["id"]
    other = submit(server, who.alice, body, headers=h)  # keys are per principal
    assert other["id"] != first["id"]
    cancel_all(server, [first["id"], other["id"]])


@pytest.mark.parametrize(
    "body,status,code,field",
    [
        ({"resource": "team-b/one"}, 422, "submission-refused", "user"),  # not bob's group
        ({"resource": "team-a/one", "gpus": 1}, 422, "submission-refused", "gpus"),  # fixed size
        ({"resource": "team-a/sized", "gpus": 5}, 422, "submission-refused", "gpus"),  # above max
        ({"resource": "nope/none"}, 422, "submission-refused", "resource"),
        ({"resource": "team-a/sized", "gpus": 1.0005}, 400, "invalid-request", None),
        ({"resource": "team-a/sized", "gpus": -1}, 400, "invalid-request", None),
        ({"resource": "team-a/sized", "surprise": 1}, 400, "invalid-request", None),
        ({"command": ["x"]}, 400, "invalid-request", None),
        ({"resource": "team-a/sized", "labels": {"k": 1}}, 400, "invalid-request", None),
        ({"resource": "team-a/one", "user": "alice"}, 403, "forbidden", None),
    ],
)
def test_submission_refused(server: Server, who, body, status, code, field) -> None:
    got, err = server.call("POST", "/v1/tasks", {"command": ["true"], **body}, who.bob)
    assert got == status, err
    assert valid("Error", err)["error"]["code"] == code
    if field is not None:  # a refusal names the field at fault, no message parsing needed
        assert err["error"]["details"] == {"field": field}, err


def test_bad_bodies(server: Server, who) -> None:
    status, err = server.call("POST", "/v1/tasks", raw=b"{not json", token=who.bob)
    assert status == 400 and err["error"]["code"] == "invalid-json"
    big = b'{"resource": "team-a/one", "payload": "' + b"x" * (1024 * 1024 + 10) + b'"}'
    status, err = server.call("POST", "/v1/tasks", raw=big, token=who.bob)
    assert status == 413 and err["error"]["code"] == "request-too-large"
    status, err = server.call("GET", "/v1/nope", token=who.bob)
    assert status == 404 and err["error"]["code"] == "not-found"
    status, err = server.call("PUT", "/v1/tasks", {}, token=who.bob)
    assert status == 405 and err["error"]["code"] == "method-not-allowed"
    assert "it serves" in err["error"]["message"]
    # RFC 9110: a 405 carries Allow (schemathesis found 51 operations without it)
    req = urllib.request.Request(
        server.url + "/v1/tasks", method="PUT", headers={"Authorization": f"Bearer {who.bob}"}
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=10)
    assert refused.value.code == 405
    assert {"GET", "POST"} <= {m.strip() for m in refused.value.headers["Allow"].split(",")}
    status, err = server.call("GET", "/v1/tasks?limit=0", token=who.bob)
    assert status == 400 and "limit" in err["error"]["message"]


def test_admin_on_behalf_of_a_user(server: Server, who) -> None:
    t = submit(server, who.admin, {"resource": "team-a/sized", "user": "bob", "gpus": 0.5})
    assert (t["user"], t["actor"]) == ("bob", "role:admin")
    assert server.ok("GET", f"/v1/tasks/{t['id']}", token=who.bob)["id"] == t["id"]
    status, err = server.call(
        "POST", "/v1/tasks", {"resource": "team-a/sized", "command": ["true"]}, who.admin
    )
    assert status == 422 and err["error"]["details"]["field"] == "user", err
    cancel_all(server, [t["id"]])


def test_queue_positions_and_reasons(server: Server, who) -> None:
    ids = [
        submit(server, who.erin, {"resource": "team-b/one", "payload": {"i": i}})["id"]
        for i in range(10)
    ]
    try:
        wait_for(lambda: sum(task_state(server, i)["state"] == "placed" for i in ids) >= 1)
        time.sleep(0.2)
        q = valid("Queue", server.ok("GET", "/v1/resources/team-b/one/queue", token=who.erin))
        mine = [e for e in q["queue"] if e["id"] in ids]
        assert len(mine) >= 4  # pool-1 holds 4 at most
        assert [e["position"] for e in q["queue"]] == list(range(1, len(q["queue"]) + 1))
        order = [e["id"] for e in mine]
        assert order == sorted(order)  # submission order
        for e in mine:
            t = task_state(server, e["id"], who.erin)
            assert t["position"] == e["position"]
            assert t["waiting_reason"] == e["waiting_reason"]
            assert e["waiting_reason"]["kind"] in ("capacity", "order", "limit")
        head = q["queue"][0]["waiting_reason"]
        assert head["kind"] in ("capacity", "limit")
        if len(mine) > 1:
            assert mine[1]["waiting_reason"]["text"].startswith("behind ")
        assert q["queued"] >= len(mine)
    finally:
        cancel_all(server, ids)


def test_list_filters_and_paging(server: Server, who) -> None:
    ids = [
        submit(
            server, who.bob, {"resource": "team-a/sized", "gpus": 4, "labels": {"batch": "paging"}}
        )["id"]
        for _ in range(5)
    ]
    try:
        seen: list[str] = []
        after = ""
        while True:
            page = valid(
                "TaskList",
                server.ok(
                    "GET",
                    f"/v1/tasks?user=bob&limit=2{'&after=' + after if after else ''}",
                    token=who.bob,
                ),
            )
            seen += [t["id"] for t in page["tasks"]]
            if not page["next"]:
                break
            after = page["next"]
        assert seen == sorted(seen) and set(ids) <= set(seen)
        erin = server.ok("GET", "/v1/tasks?limit=1000", token=who.erin)["tasks"]
        assert not {t["id"] for t in erin} & set(ids)
        alice = server.ok("GET", "/v1/tasks?group=team-a&limit=1000", token=who.alice)
        assert set(ids) <= {t["id"] for t in alice["tasks"]}
        queued = server.ok(
            "GET", "/v1/tasks?state=queued&resource=team-a/sized&limit=1000", token=who.bob
        )["tasks"]
        assert all(t["state"] == "queued" for t in queued)
        status, _ = server.call("GET", "/v1/tasks?state=running", token=who.bob)
        assert status == 400
    finally:
        cancel_all(server, ids)


def test_resources(server: Server, who) -> None:
    mine = valid("ResourceList", server.ok("GET", "/v1/resources", token=who.bob))
    assert [r["name"] for r in mine["resources"]] == ["team-a/one", "team-a/sized"]
    sized = mine["resources"][1]
    assert sized["gpus"] is None and sized["from_task"] == {"default": 1, "max": 4}
    assert sized["time_weight"] == 2 and sized["pools"] == ["pool-2"]
    every = server.ok("GET", "/v1/resources", token=who.finance)["resources"]
    assert len(every) == 4


def test_policies_and_pools(server: Server, who) -> None:
    pols = valid("PolicyList", server.ok("GET", "/v1/policies", token=who.bob))["policies"]
    assert [p["name"] for p in pols] == ["team-a"]
    a = pols[0]
    assert (a["reservation"], a["limit"]) == (2, 10)
    assert a["budget"]["hours"] == 1000 and a["budget"]["period"] == "month"
    b = valid("Policy", server.ok("GET", "/v1/policies/team-b", token=who.finance))
    assert b["budget"] is None
    pools = valid("PoolList", server.ok("GET", "/v1/pools", token=who.bob))["pools"]
    assert {p["name"]: p["capacity"] for p in pools} == {"pool-1": 4, "pool-2": 8}
    for p in pools:
        assert p["free"] == p["capacity"] - p["used"] and 0 <= p["borrowed"] <= p["used"]
    mine = server.ok("GET", "/v1/pools", token=who.worker)["pools"]
    assert [p["name"] for p in mine] == ["pool-1"]


def test_events(server: Server, who) -> None:
    t = submit(server, who.alice, {"resource": "team-a/sized", "gpus": 0.5})
    cancel_all(server, [t["id"]])
    page = valid("EventList", server.ok("GET", "/v1/events?limit=3"))
    assert len(page["events"]) == 3 and page["next"] == page["events"][-1]["seq"]
    nxt = server.ok("GET", f"/v1/events?since={page['next']}&limit=3")
    assert nxt["events"][0]["seq"] > page["next"]
    kinds = server.ok("GET", "/v1/events?kind=estate_applied")["events"]
    assert kinds and kinds[0]["data"] == {"source": kinds[0]["data"]["source"]}
    erin = server.ok("GET", "/v1/events?limit=1000", token=who.erin)["events"]
    assert all(e["task"] != t["id"] for e in erin)
    assert not any(e["kind"] == "token_created" for e in erin)
    walter = server.ok("GET", f"/v1/events?task={t['id']}", token=who.walter)["events"]
    assert [e["kind"] for e in walter] == ["submitted", "cancelled"] or [
        e["kind"] for e in walter
    ] == ["submitted", "placed", "cancelled"]


def test_engine_switch(server: Server, who) -> None:
    try:
        e = valid("Engine", server.ok("POST", "/v1/engine", {"enabled": False}))
        assert e["enabled"] is False and e["pass_interval_s"] == 1
        assert server.ok("GET", "/v1/health", token=None)["engine"] == "disabled"
        t = submit(server, who.bob, {"resource": "team-a/sized", "gpus": 0.5})
        time.sleep(0.3)
        st = task_state(server, t["id"])
        assert st["state"] == "queued"
        assert st["waiting_reason"]["text"].startswith("the engine is disabled")
    finally:
        server.ok("POST", "/v1/engine", {"enabled": True})
    wait_for(lambda: task_state(server, t["id"])["state"] == "placed")
    kinds = [e["kind"] for e in server.ok("GET", "/v1/events?kind=engine_disabled")["events"]]
    assert kinds
    cancel_all(server, [t["id"]])


def test_estate(server: Server, who) -> None:
    e = valid("Estate", server.ok("GET", "/v1/estate", token=who.worker))
    assert e["revision"] == server.ok("GET", "/v1/health", token=None)["revision"]
    assert (e["pools"], e["profiles"], e["policies"], e["compute_resources"]) == (2, 2, 2, 4)
    assert e["refused"] is None and e["applied_at"]


def test_tokens(server: Server, who) -> None:
    made = valid(
        "TokenCreated",
        server.ok("POST", "/v1/tokens", {"user": "dave", "name": "laptop"}, expect=201),
    )
    assert made["principal"] == "user:dave" and made["token"].startswith("kq_")
    assert len(made["token"]) == 46
    listed = valid("TokenList", server.ok("GET", "/v1/tokens"))["tokens"]
    row = next(t for t in listed if t["id"] == made["id"])
    assert row["created_by"] == "role:admin" and row["revoked_at"] is None
    assert all("token" not in t and "hash" not in t for t in listed)
    assert server.ok("GET", "/v1/whoami", token=made["token"])["name"] == "dave"
    server.ok("DELETE", f"/v1/tokens/{made['id']}", expect=204)
    server.ok("DELETE", f"/v1/tokens/{made['id']}", expect=204)
    status, err = server.call("GET", "/v1/whoami", token=made["token"])
    assert status == 401 and "revoked" in err["error"]["message"]
    assert server.call("DELETE", "/v1/tokens/tk-nope")[0] == 404
    status, err = server.call("POST", "/v1/tokens", {"worker": True, "pool": "nowhere"})
    assert status == 422 and err["error"]["code"] == "unknown-pool"
    assert server.call("POST", "/v1/tokens", {"role": "root"})[0] == 400


def test_ledger_endpoints(server: Server, who) -> None:
    res = valid(
        "SqlResult",
        server.ok(
            "POST", "/v1/ledger/sql", {"sql": "SELECT count(*) AS n FROM ledger"}, token=who.finance
        ),
    )
    assert res["columns"] == ["n"]
    status, err = server.call(
        "POST", "/v1/ledger/sql", {"sql": "DELETE FROM ledger"}, token=who.finance
    )
    assert status == 400, err
    status, err = server.call(
        "POST",
        "/v1/ledger/sql",
        {"sql": "SELECT * FROM read_csv('/etc/passwd')"},
        token=who.finance,
    )
    assert status == 400, err


def test_ledger_export(server: Server, who) -> None:
    status, csv = server.call(
        "GET",
        "/v1/ledger/export?from=2026-01-01T00:00:00Z&to=2100-01-01T00:00:00Z",
        token=who.finance,
    )
    assert status == 200 and isinstance(csv, str) and "\n" in csv
