"""The authorization matrix: every kind of principal against every endpoint, exact statuses.

Principals (conftest.py): admin, finance, alice (team-a user and team-a admin), bob (team-a
user), erin (team-b: a user of another group), walter (admin of the department above both
teams), a worker of pool-1, no token, a revoked token. The task under test is bob's, on
team-a/one. A task a caller may not see is a 404 (ids are not disclosed); an estate object
(queue, policy) outside the caller's groups is a 403 (names are in the estate, not secret).
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

from tests.harness.daemon import Server

WHO = ["admin", "finance", "alice", "bob", "erin", "walter", "worker", "none", "revoked"]

CMD = {"command": ["true"]}  # a task needs a command or a payload

# endpoint -> (method, path, body, statuses in WHO order)
# {task} is a fresh task of bob's, {token} a fresh token id.
MATRIX: dict[str, tuple[str, str, Any, list[int]]] = {
    "health": ("GET", "/v1/health", None, [200] * 9),
    "openapi": ("GET", "/v1/openapi.json", None, [200] * 9),
    "whoami": ("GET", "/v1/whoami", None, [200] * 7 + [401, 401]),
    "submit": ("POST", "/v1/tasks", {"resource": "team-a/sized", "gpus": 0.001, **CMD},
               [400, 403, 201, 201, 422, 422, 403, 401, 401]),
    "submit-for-bob": ("POST", "/v1/tasks",
                       {"resource": "team-a/sized", "gpus": 0.001, "user": "bob", **CMD},
                       [201, 403, 403, 201, 403, 403, 403, 401, 401]),
    "list-tasks": ("GET", "/v1/tasks", None, [200, 403, 200, 200, 200, 200, 403, 401, 401]),
    "get-task": ("GET", "/v1/tasks/{task}", None,
                 [200, 403, 200, 200, 404, 200, 403, 401, 401]),
    "cancel-task": ("POST", "/v1/tasks/{task}/cancel", None,
                    [200, 403, 200, 200, 404, 200, 403, 401, 401]),
    "resources": ("GET", "/v1/resources", None, [200] * 6 + [403, 401, 401]),
    "queue": ("GET", "/v1/resources/team-a/one/queue", None,
              [200, 403, 200, 200, 403, 200, 403, 401, 401]),
    "policies": ("GET", "/v1/policies", None, [200] * 6 + [403, 401, 401]),
    "policy": ("GET", "/v1/policies/team-a", None,
               [200, 200, 200, 200, 403, 200, 403, 401, 401]),
    "pools": ("GET", "/v1/pools", None, [200] * 7 + [401, 401]),
    "events": ("GET", "/v1/events", None, [200] * 6 + [403, 401, 401]),
    "get-engine": ("GET", "/v1/engine", None, [200] * 7 + [401, 401]),
    "set-engine": ("POST", "/v1/engine", {"enabled": True}, [200] + [403] * 6 + [401, 401]),
    "estate": ("GET", "/v1/estate", None, [200] * 7 + [401, 401]),
    "plan-state": ("GET", "/v1/plan/state", None, [200] + [403] * 6 + [401, 401]),
    "create-token": ("POST", "/v1/tokens", {"user": "erin"}, [201] + [403] * 6 + [401, 401]),
    "list-tokens": ("GET", "/v1/tokens", None, [200] + [403] * 6 + [401, 401]),
    "revoke-token": ("DELETE", "/v1/tokens/{token}", None, [204] + [403] * 6 + [401, 401]),
    # group admins (alice: team-a, walter: the department) read their subtree's rows
    "ledger-sql": ("POST", "/v1/ledger/sql", {"sql": "SELECT 1 AS one"},
                   [200, 200, 200, 403, 403, 200, 403, 401, 401]),
    "ledger-export": ("GET", "/v1/ledger/export?from=2026-01-01T00:00:00Z&to=2026-01-02T00:00:00Z",
                      None, [200, 200, 200, 403, 403, 200, 403, 401, 401]),
}

CASES = [(ep, i, w) for ep in MATRIX for i, w in enumerate(WHO)]


@pytest.mark.parametrize("endpoint,i,principal", CASES,
                         ids=[f"{ep}-{w}" for ep, _, w in CASES])
def test_matrix(server: Server, who, endpoint: str, i: int, principal: str) -> None:
    method, path, body, statuses = MATRIX[endpoint]
    want = statuses[i]
    token = None if principal == "none" else getattr(who, principal)
    if "{task}" in path:
        t = server.ok("POST", "/v1/tasks", {"resource": "team-a/one", "user": "bob", **CMD},
                      expect=201)
        path = path.replace("{task}", t["id"])
    if "{token}" in path:
        tk = server.ok("POST", "/v1/tokens", {"user": "erin"}, expect=201)
        path = path.replace("{token}", tk["id"])
    status, data = server.call(method, path, body, token)
    assert status == want, f"{principal} {method} {path}: {status} {data}"
    if status >= 400:
        assert set(data) == {"error"} and data["error"]["code"] and data["error"]["message"]
    if "{task}" in MATRIX[endpoint][1]:
        server.ok("POST", f"/v1/tasks/{t['id']}/cancel")
    if endpoint.startswith("submit") and status == 201:
        server.ok("POST", f"/v1/tasks/{data['id']}/cancel")


def test_bad_tokens(server: Server) -> None:
    for header in ("Bearer", "Basic abc", "Bearer kq_unknown", "bearer  "):
        status, data = server.call("GET", "/v1/whoami", token=None,
                                   headers={"Authorization": header})
        assert status == 401 and data["error"]["code"] == "unauthenticated", header


def test_visibility_of_lists(server: Server, who) -> None:
    """What each sees, not only whether it may ask."""
    mine = server.ok("POST", "/v1/tasks", {"resource": "team-a/sized", "gpus": 0.001, **CMD},
                     token=who.alice, expect=201)
    bobs = server.ok("POST", "/v1/tasks", {"resource": "team-a/sized", "gpus": 0.001, **CMD},
                     token=who.bob, expect=201)
    try:
        ids: Callable[[str], set[str]] = lambda tok: {  # noqa: E731
            t["id"] for t in server.ok("GET", "/v1/tasks?limit=1000", token=tok)["tasks"]}
        assert {mine["id"], bobs["id"]} <= ids(who.alice)       # group admin: both
        assert bobs["id"] in ids(who.bob) and mine["id"] not in ids(who.bob)
        assert not {mine["id"], bobs["id"]} & ids(who.erin)
        assert {mine["id"], bobs["id"]} <= ids(who.walter)      # department admin
        res = {r["name"] for r in server.ok("GET", "/v1/resources", token=who.erin)[
            "resources"]}
        assert res == {"team-b/one", "team-b/sized"}
        pol = [p["name"] for p in server.ok("GET", "/v1/policies", token=who.walter)[
            "policies"]]
        assert pol == ["team-a", "team-b"]
    finally:
        for t in (mine, bobs):
            server.ok("POST", f"/v1/tasks/{t['id']}/cancel")
