"""The authorization matrix: every kind of principal against every route, exact statuses.

Which roles a route admits comes from its declaration (``kliqued.daemon.api.app.ROUTES``, the
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

from dataclasses import dataclass
from typing import Any, Callable

import pytest

from kliqued.daemon.api.app import ROUTES
from kliqued.daemon.api.routes import Route

from tests.harness.daemon import SMALL_ESTATE, Server

WHO = ["admin", "finance", "planner", "alice", "bob", "erin", "walter", "worker", "none", "revoked"]
ROLE = {
    "admin": "admin",
    "finance": "finance",
    "planner": "planner",
    "alice": "user",
    "bob": "user",
    "erin": "user",
    "walter": "user",
    "worker": "worker",
}

CMD = {"command": ["true"]}  # a task needs a command or a payload
DAY = "from=2026-01-01T00:00:00Z&to=2026-01-02T00:00:00Z"
TASK_SEEN = {"erin": 404}  # bob's task: bob, alice (team-a admin), walter (lab admin), admins
NO_GROUP_ADMIN = {"bob": 403, "erin": 403}  # users who administer no group


# case -> (operation id, concrete path, body, status of an admitted principal,
#          object-level exceptions). {task} is a fresh task of bob's, {token} a fresh token id.
MATRIX: dict[str, tuple[str, str, Any, int, dict[str, int]]] = {
    "health": ("health", "/v1/health", None, 200, {}),
    "leader": ("leader", "/v1/leader", None, 200, {}),
    "openapi": ("openapi", "/v1/openapi.json", None, 200, {}),
    "whoami": ("whoami", "/v1/whoami", None, 200, {}),
    "identity-providers": ("listIdentityProviders", "/v1/signin", None, 200, {}),
    # public: an ID token is the credential (none here: the estate trusts no provider)
    "sign-in": ("signIn", "/v1/signin", {"id_token": "a.b.c"}, 401, {}),
    "submit": (
        "submitTask",
        "/v1/tasks",
        {"resource": "team-a/sized", "gpus": 0.001, **CMD},
        201,
        {"admin": 422, "erin": 422, "walter": 422},
    ),
    "submit-for-bob": (
        "submitTask",
        "/v1/tasks",
        {"resource": "team-a/sized", "gpus": 0.001, "user": "bob", **CMD},
        201,
        {"alice": 403, "erin": 403, "walter": 403},
    ),
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
    # the autoscaler's calls (admins): pool-1 is not an autoscaled cloud pool
    "record-node": (
        "recordCloudNode",
        "/v1/pools/pool-1/nodes",
        {
            "node": "i-1",
            "provider": "ec2",
            "instance_type": "g6e.xlarge",
            "lifecycle": "spot",
            "gpus": 1,
        },
        422,
        {},
    ),
    "end-node": ("endCloudNode", "/v1/pools/pool-1/nodes/i-none", None, 404, {}),
    "scaling": ("reportScaling", "/v1/pools/pool-1/scaling", {"cause": None}, 422, {}),
    "autoscaler": (
        "autoscalerHeartbeat",
        "/v1/pools/pool-1/autoscaler",
        {"interval_s": 10},
        422,
        {},
    ),
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
    # schedules and pipelines (issue 14): a body the schema refuses, an id of none
    "create-schedule": ("createSchedule", "/v1/schedules", {}, 400, {}),
    "schedules": ("listSchedules", "/v1/schedules", None, 200, {}),
    "schedule": ("getSchedule", "/v1/schedules/s-none", None, 404, {}),
    "pause-schedule": ("pauseSchedule", "/v1/schedules/s-none/pause", None, 404, {}),
    "resume-schedule": ("resumeSchedule", "/v1/schedules/s-none/resume", None, 404, {}),
    "delete-schedule": ("deleteSchedule", "/v1/schedules/s-none", None, 404, {}),
    "run-pipeline": ("runPipeline", "/v1/pipelines", {}, 400, {}),
    "pipelines": ("listPipelines", "/v1/pipelines", None, 200, {}),
    "pipeline": ("getPipeline", "/v1/pipelines/p-none", None, 404, {}),
    "cancel-pipeline": ("cancelPipeline", "/v1/pipelines/p-none/cancel", None, 404, {}),
    "resume-pipeline": ("resumePipeline", "/v1/pipelines/p-none/resume", None, 404, {}),
    # group admins (alice: team-a, walter: the department) read their subtree's rows
    "ledger-sql": ("ledgerSql", "/v1/ledger/sql", {"sql": "SELECT 1 AS one"}, 200, NO_GROUP_ADMIN),
    "ledger-export": ("ledgerExport", f"/v1/ledger/export?{DAY}", None, 200, NO_GROUP_ADMIN),
    # sessions (a session is a task labelled as one: bob's plain task is no session, 404)
    "start-session": (
        "startSession",
        "/v1/sessions",
        {"resource": "team-a/sized", "gpus": 0.001, "app": "shell"},
        201,
        {"erin": 422, "walter": 422},
    ),
    "list-sessions": ("listSessions", "/v1/sessions", None, 200, {}),
    "get-session": ("getSession", "/v1/sessions/{task}", None, 404, {}),
    "stop-session": ("stopSession", "/v1/sessions/{task}/stop", None, 404, {}),
    "link-session": ("linkSession", "/v1/sessions/{task}/link", None, 404, {}),
    "session-tunnel": ("sessionTunnel", "/v1/sessions/{task}/tunnel", None, 400, {}),
    "ledger-focus": ("ledgerFocus", "/v1/ledger/focus?period=2026-01", None, 200, NO_GROUP_ADMIN),
    "ledger-feed": ("ledgerFeed", "/v1/ledger/feed", None, 200, NO_GROUP_ADMIN),
    "ledger-cio": ("ledgerCio", "/v1/ledger/cio?period=2026-01", None, 200, NO_GROUP_ADMIN),
    # team-a's statement: its admin and the department's; erin administers nothing
    "ledger-statement": (
        "ledgerStatement",
        "/v1/ledger/statement?group=team-a&period=2026-01",
        None,
        200,
        NO_GROUP_ADMIN,
    ),
    # agents over MCP: the door admits people; each tool then has its operation's rights
    # (tests/mcp). Past the door, the answers are the MCP SDK's (stateless: no GET stream,
    # no session to end).
    "mcp": ("mcp", "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "ping"}, 200, {}),
    "mcp-stream": ("mcpStream", "/mcp", None, 405, {}),
    "mcp-end": ("mcpEnd", "/mcp", None, 405, {}),
    "mcp-metadata": (
        "mcpResourceMetadata",
        "/.well-known/oauth-protected-resource/mcp",
        None,
        200,
        {},
    ),
}
MCP_OPS = {"mcp", "mcpStream", "mcpEnd"}
"""Operations whose admitted answers are MCP's JSON-RPC, not the API's error shape."""
MCP_ACCEPT = {"Accept": "application/json, text/event-stream"}

DECLARED: dict[str, Route] = {r.operation_id: r for r in ROUTES}


def expected(case: str, principal: str) -> int:
    """What ``principal`` gets: from the route's declaration, then the object-level case."""
    op, _, _, admitted, exceptions = MATRIX[case]
    route = DECLARED[op]
    if route.public:
        return admitted  # the same for everyone, token or not
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
    token = (
        {"none": None, "planner": planner}[principal]
        if principal in ("none", "planner")
        else getattr(who, principal)
    )
    if "{task}" in path:
        t = server.ok(
            "POST", "/v1/tasks", {"resource": "team-a/one", "user": "bob", **CMD}, expect=201
        )
        path = path.replace("{task}", t["id"])
    if "{token}" in path:
        tk = server.ok("POST", "/v1/tokens", {"user": "erin"}, expect=201)
        path = path.replace("{token}", tk["id"])
    status, data = server.call(
        method, path, body, token, headers=MCP_ACCEPT if op in MCP_OPS else None
    )
    assert status == want, f"{principal} {method} {path}: {status} {data}"
    if status >= 400 and (op not in MCP_OPS or status in (401, 403)):
        assert set(data) == {"error"} and data["error"]["code"] and data["error"]["message"]
    if status == 403 and ROLE.get(principal) not in DECLARED[op].allowed:
        # refused by the declaration: the answer says who may call it
        assert data["error"]["details"]["allowed"] == list(DECLARED[op].allowed)
        assert op in data["error"]["message"]
    if "{task}" in MATRIX[case][1]:
        server.ok("POST", f"/v1/tasks/{t['id']}/cancel")
    if op in ("submitTask", "startSession") and status == 201:
        server.ok("POST", f"/v1/tasks/{data['id']}/cancel")


def test_bad_tokens(server: Server) -> None:
    for header in ("Bearer", "Basic abc", "Bearer kq_unknown", "bearer  "):
        status, data = server.call(
            "GET", "/v1/whoami", token=None, headers={"Authorization": header}
        )
        assert status == 401 and data["error"]["code"] == "unauthenticated", header


def test_visibility_of_lists(server: Server, who) -> None:
    """What each sees, not only whether it may ask."""
    mine = server.ok(
        "POST",
        "/v1/tasks",
        {"resource": "team-a/sized", "gpus": 0.001, **CMD},
        token=who.alice,
        expect=201,
    )
    bobs = server.ok(
        "POST",
        "/v1/tasks",
        {"resource": "team-a/sized", "gpus": 0.001, **CMD},
        token=who.bob,
        expect=201,
    )
    try:
        ids: Callable[[str], set[str]] = lambda tok: {  # noqa: E731
            t["id"] for t in server.ok("GET", "/v1/tasks?limit=1000", token=tok)["tasks"]
        }
        assert {mine["id"], bobs["id"]} <= ids(who.alice)  # group admin: both
        assert bobs["id"] in ids(who.bob) and mine["id"] not in ids(who.bob)
        assert not {mine["id"], bobs["id"]} & ids(who.erin)
        assert {mine["id"], bobs["id"]} <= ids(who.walter)  # department admin
        res = {r["name"] for r in server.ok("GET", "/v1/resources", token=who.erin)["resources"]}
        assert res == {"team-b/one", "team-b/sized"}
        pol = [p["name"] for p in server.ok("GET", "/v1/policies", token=who.walter)["policies"]]
        assert pol == ["team-a", "team-b"]
    finally:
        for t in (mine, bobs):
            server.ok("POST", f"/v1/tasks/{t['id']}/cancel")


# ---------------------------------------------------------------- departments (issue 12)
# The organisation estate (estate_org/): north/ml/team-a (alice: user and admin), north/ml/
# team-b (bob), south/ops/team-c (carl: user and admin). dana heads ml (an envelope), nina
# the business unit north, olga the department ops. An admin of a group manages every group
# below it; nobody sees across into another department, nor a team into its siblings.

ORG_ESTATE = SMALL_ESTATE.parent / "estate_org"


@dataclass
class Org:
    server: Server
    tokens: dict[str, str]
    bob_task: str
    """bob's (team-b), waiting: the engine is off while the module runs."""
    carl_task: str
    """carl's (team-c, the other department), waiting."""

    def call(self, who: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return self.server.call(method, path, body, self.tokens[who])


@pytest.fixture(scope="module")
def org(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("org-access"), estate=ORG_ESTATE).start()
    s.ok("POST", "/v1/engine", {"enabled": False})  # tasks stay queued, with their reasons
    tokens = {n: s.token({"user": n}) for n in ("alice", "bob", "carl", "dana", "nina", "olga")}
    bob = s.ok(
        "POST", "/v1/tasks", {"resource": "team-b/one", **CMD}, token=tokens["bob"], expect=201
    )
    carl = s.ok(
        "POST", "/v1/tasks", {"resource": "team-c/one", **CMD}, token=tokens["carl"], expect=201
    )
    yield Org(s, tokens, bob["id"], carl["id"])
    assert s.stop() == 0, s.log()


def _ids(org: Org, who: str, query: str = "") -> set[str]:
    status, data = org.call(who, "GET", f"/v1/tasks?limit=1000{query}")
    assert status == 200, data
    return {t["id"] for t in data["tasks"]}


def _event_tasks(org: Org, who: str) -> set[str]:
    status, data = org.call(who, "GET", "/v1/events?limit=1000")
    assert status == 200, data
    return {e["task"] for e in data["events"] if e["task"]}


@pytest.mark.parametrize("head", ["dana", "nina"])
def test_a_department_head_sees_a_team_below(org: Org, head: str) -> None:
    """The department's (and the business unit's) head lists, reads, sees the reason of, and
    reads the queue, events and policies of a task of a team below; filtering by the
    department lists its teams' tasks."""
    assert org.bob_task in _ids(org, head)
    assert org.bob_task in _ids(org, head, "&group=team-b")
    assert org.bob_task in _ids(org, head, "&group=ml")  # the department: its teams' tasks
    assert org.bob_task in _ids(org, head, "&user=bob")
    status, task = org.call(head, "GET", f"/v1/tasks/{org.bob_task}")
    assert status == 200 and task["command"] == ["true"], task
    assert task["waiting_reason"]["kind"] == "pending", task
    status, queue = org.call(head, "GET", "/v1/resources/team-b/one/queue")
    assert status == 200 and [e["id"] for e in queue["queue"]] == [org.bob_task], queue
    assert queue["queue"][0]["waiting_reason"]["text"], queue
    status, _ = org.call(head, "GET", f"/v1/events?task={org.bob_task}")
    assert status == 200
    assert org.bob_task in _event_tasks(org, head)
    status, pols = org.call(head, "GET", "/v1/policies")
    assert [p["name"] for p in pols["policies"]] == ["ml", "team-a", "team-b"], pols
    assert org.call(head, "GET", "/v1/policies/ml")[0] == 200


@pytest.mark.parametrize("head", ["dana", "nina"])
def test_a_department_head_sees_nothing_of_another_department(org: Org, head: str) -> None:
    assert org.carl_task not in _ids(org, head)
    assert org.carl_task not in _event_tasks(org, head)
    for method, path in (
        ("GET", f"/v1/tasks/{org.carl_task}"),
        ("POST", f"/v1/tasks/{org.carl_task}/cancel"),
        ("GET", f"/v1/tasks/{org.carl_task}/log"),
        ("GET", f"/v1/events?task={org.carl_task}"),
    ):
        status, data = org.call(head, method, path)
        assert status == 404, (method, path, data)
    for path in (
        "/v1/resources/team-c/one/queue",
        "/v1/policies/team-c",
        "/v1/tasks?group=team-c",
        "/v1/tasks?group=ops",
        "/v1/tasks?group=south",
        "/v1/tasks?user=carl",
    ):
        status, data = org.call(head, "GET", path)
        assert status == 403, (path, data)
    status, res = org.call(head, "GET", "/v1/resources")
    assert {r["group"] for r in res["resources"]} == {"team-a", "team-b"}, res


def test_a_team_admin_sees_only_their_team(org: Org) -> None:
    """alice administers team-a: not its sibling team-b, nor the department above."""
    assert org.bob_task not in _ids(org, "alice")
    assert org.bob_task not in _event_tasks(org, "alice")
    for method, path in (
        ("GET", f"/v1/tasks/{org.bob_task}"),
        ("POST", f"/v1/tasks/{org.bob_task}/cancel"),
    ):
        assert org.call("alice", method, path)[0] == 404, path
    for path in (
        "/v1/resources/team-b/one/queue",
        "/v1/policies/team-b",
        "/v1/policies/ml",
        "/v1/tasks?group=team-b",
        "/v1/tasks?group=ml",
        "/v1/tasks?user=bob",
    ):
        status, data = org.call("alice", "GET", path)
        assert status == 403, (path, data)
    status, pols = org.call("alice", "GET", "/v1/policies")
    assert [p["name"] for p in pols["policies"]] == ["team-a"], pols


def test_another_departments_head_cannot_cancel_and_the_department_head_can(org: Org) -> None:
    """Runs last: it ends bob's task. olga (ops) is refused as if the task did not exist;
    dana (ml) cancels it, and its end says who did."""
    status, data = org.call("olga", "POST", f"/v1/tasks/{org.bob_task}/cancel")
    assert status == 404, data
    assert org.call("olga", "GET", f"/v1/tasks/{org.bob_task}")[0] == 404
    status, task = org.call(
        "dana",
        "POST",
        f"/v1/tasks/{org.bob_task}/cancel",
        {"reason": "the department needs the GPUs"},
    )
    assert status == 200 and task["state"] == "ended", task
    assert task["end"]["text"] == "cancelled by user:dana: the department needs the GPUs"
    status, task = org.call("bob", "GET", f"/v1/tasks/{org.bob_task}")
    assert status == 200 and task["end_reason"] == "cancelled", task
