"""The authorization matrix: every kind of principal against every route, exact statuses.

Which roles a route admits comes from its declaration (``kliqued.daemon.app.ROUTES``, the
handlers' route tables): a principal whose role it does not admit gets a 403 naming the
roles it does, no token or a revoked one a 401 (a public route: 200). What an admitted
principal gets is written here, with the object-level cases (a task or queue of another
group, a worker id of no worker) spelled out.

Principals (conftest.py): admin, finance, planner, alice (team-a user and team-a admin), bob
(team-a user), erin (team-b: a user of another group), walter (admin of the department above
both teams), a worker of pool-1, no token, a revoked token. The task under test is bob's, on
team-a/one. A task a caller may not see is a 404 (ids are not disclosed); an estate object
(queue, policy) outside the caller's groups is a 403 (names are in the estate, not secret).
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

from kliqued.daemon.app import ROUTES
from kliqued.daemon.routes import Route

from tests.harness.daemon import Server

WHO = ["admin", "finance", "planner", "alice", "bob", "erin", "walter", "worker", "none",
       "revoked"]
ROLE = {"admin": "admin", "finance": "finance", "planner": "planner", "alice": "user",
        "bob": "user", "erin": "user", "walter": "user", "worker": "worker"}

CMD = {"command": ["true"]}  # a task needs a command or a payload
DAY = "from=2026-01-01T00:00:00Z&to=2026-01-02T00:00:00Z"
TASK_SEEN = {"erin": 404}  # bob's task: bob, alice (team-a admin), walter (lab admin), admins
NO_GROUP_ADMIN = {"bob": 403, "erin": 403}  # users who administer no group


# case -> (operation id, concrete path, body, status of an admitted principal,
#          object-level exceptions). {task} is a fresh task of bob's, {token} a fresh token id.
MATRIX: dict[str, tuple[str, str, Any, int, dict[str, int]]] = {
    "health": ("health", "/v1/health", None, 200, {}),
    "openapi": ("openapi", "/v1/openapi.json", None, 200, {}),
    "whoami": ("whoami", "/v1/whoami", None, 200, {}),
    "submit": ("submitTask", "/v1/tasks", {"resource": "team-a/sized", "gpus": 0.001, **CMD},
               201, {"admin": 400, "erin": 422, "walter": 422}),
    "submit-for-bob": ("submitTask", "/v1/tasks",
                       {"resource": "team-a/sized", "gpus": 0.001, "user": "bob", **CMD},
                       201, {"alice": 403, "erin": 403, "walter": 403}),
    "list-tasks": ("listTasks", "/v1/tasks", None, 200, {}),
    "get-task": ("getTask", "/v1/tasks/{task}", None, 200, TASK_SEEN),
    "cancel-task": ("cancelTask", "/v1/tasks/{task}/cancel", None, 200, TASK_SEEN),
    "task-log": ("getTaskLog", "/v1/tasks/{task}/log", None, 200, TASK_SEEN),
    "report-task": ("reportTask", "/v1/tasks/{task}/report", {}, 400, {}),  # admitted: body
    "upload-log": ("uploadTaskLog", "/v1/tasks/{task}/log", None, 400, {}),  # no offset
    "register": ("registerWorker", "/v1/workers/register", {}, 400, {}),
    "workers": ("listWorkers", "/v1/workers", None, 200, {}),
    "lease": ("leaseTasks", "/v1/workers/w-none/lease?wait=0", {}, 404, {}),
    "heartbeat": ("workerHeartbeat", "/v1/workers/w-none/heartbeat", {}, 404, {}),
    "reports": ("reportTasks", "/v1/workers/w-none/reports", {"reports": []}, 404, {}),
    "deregister": ("deregisterWorker", "/v1/workers/w-none", None, 404, {}),
    "resources": ("listResources", "/v1/resources", None, 200, {}),
    "queue": ("getQueue", "/v1/resources/team-a/one/queue", None, 200, {"erin": 403}),
    "policies": ("listPolicies", "/v1/policies", None, 200, {}),
    "policy": ("getPolicy", "/v1/policies/team-a", None, 200, {"erin": 403}),
    "pools": ("listPools", "/v1/pools", None, 200, {}),
    "events": ("listEvents", "/v1/events", None, 200, {}),
    "get-engine": ("getEngine", "/v1/engine", None, 200, {}),
    "set-engine": ("setEngine", "/v1/engine", {"enabled": True}, 200, {}),
    "estate": ("getEstate", "/v1/estate", None, 200, {}),
    "plan-state": ("getPlanState", "/v1/plan/state", None, 200, {}),
    "demand": ("getDemand", "/v1/demand?since=1d", None, 200, {}),
    "metrics": ("metrics", "/metrics", None, 200, {}),
    "create-token": ("createToken", "/v1/tokens", {"user": "erin"}, 201, {}),
    "list-tokens": ("listTokens", "/v1/tokens", None, 200, {}),
    "rotate-token": ("rotateToken", "/v1/tokens/{token}/rotate", None, 201, {}),
    "revoke-token": ("revokeToken", "/v1/tokens/{token}", None, 204, {}),
    # group admins (alice: team-a, walter: the department) read their subtree's rows
    "ledger-sql": ("ledgerSql", "/v1/ledger/sql", {"sql": "SELECT 1 AS one"}, 200,
                   NO_GROUP_ADMIN),
    "ledger-export": ("ledgerExport", f"/v1/ledger/export?{DAY}", None, 200, NO_GROUP_ADMIN),
}

DECLARED: dict[str, Route] = {r.operation_id: r for r in ROUTES}


def expected(case: str, principal: str) -> int:
    """What ``principal`` gets: from the route's declaration, then the object-level case."""
    op, _, _, admitted, exceptions = MATRIX[case]
    route = DECLARED[op]
    if route.public:
        return 200
    if principal in ("none", "revoked"):
        return 401
    if ROLE[principal] not in route.allowed:
        return 403
    return exceptions.get(principal, admitted)


def test_matrix_covers_every_declared_route() -> None:
    """Every route served has a case here; every case's path is its route's path."""
    assert {op for op, *_ in MATRIX.values()} == set(DECLARED)
    for case, (op, path, *_) in MATRIX.items():
        route = DECLARED[op]
        pattern = path.split("?")[0].replace("{task}", "t").replace("{token}", "k")
        template = route.path.split("/")
        assert len(pattern.split("/")) == len(template), case
        for got, want in zip(pattern.split("/"), template):
            assert want.startswith("{") or got == want, (case, path, route.path)


def test_exceptions_are_for_admitted_principals() -> None:
    """An object-level exception for a principal the route refuses anyway would be dead."""
    for case, (op, *_, exceptions) in MATRIX.items():
        for principal in exceptions:
            assert ROLE[principal] in DECLARED[op].allowed, (case, principal)


CASES = [(case, w) for case in MATRIX for w in WHO]


@pytest.fixture(scope="module")
def planner(server: Server) -> str:
    return server.token({"role": "planner"})


@pytest.mark.parametrize("case,principal", CASES, ids=[f"{c}-{w}" for c, w in CASES])
def test_matrix(server: Server, who, planner: str, case: str, principal: str) -> None:
    op, path, body, _, _ = MATRIX[case]
    method = DECLARED[op].method
    want = expected(case, principal)
    token = {"none": None, "planner": planner}[principal] if principal in (
        "none", "planner") else getattr(who, principal)
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
    if status == 403 and ROLE.get(principal) not in DECLARED[op].allowed:
        # refused by the declaration: the answer says who may call it
        assert data["error"]["details"]["allowed"] == list(DECLARED[op].allowed)
        assert op in data["error"]["message"]
    if "{task}" in MATRIX[case][1]:
        server.ok("POST", f"/v1/tasks/{t['id']}/cancel")
    if op == "submitTask" and status == 201:
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
