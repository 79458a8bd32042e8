"""One daemon on the small test estate for the dashboard's HTML tests, with a token per kind
of person and work placed, preempted and ended (no worker: pools take work without one)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.harness.daemon import Server
from tests.harness.inproc import InProcServer
from tests.harness.wait import wait_for


@dataclass
class People:
    admin: str
    finance: str
    planner: str
    alice: str  # team-a user and team-a admin
    bob: str  # team-a user
    erin: str  # team-b user
    walter: str  # admin of the department lab (team-a and team-b below it)
    worker: str


@dataclass
class Work:
    bob_task: str  # ended (cancelled): a closed ledger interval
    erin_task: str  # ended (cancelled)
    alice_task: str  # placed


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    s = InProcServer(tmp_path_factory.mktemp("web")).start()
    yield s
    log = s.log()
    assert s.stop() == 0, log
    assert "Traceback" not in log, log


@pytest.fixture(scope="module")
def people(server: Server) -> People:
    return People(
        admin=server.admin or "",
        finance=server.token({"role": "finance"}),
        planner=server.token({"role": "planner"}),
        alice=server.token({"user": "alice"}),
        bob=server.token({"user": "bob"}),
        erin=server.token({"user": "erin"}),
        walter=server.token({"user": "walter"}),
        worker=server.token({"worker": True, "pool": "pool-1"}),
    )


@pytest.fixture(scope="module")
def work(server: Server, people: People) -> Work:
    def run(token: str, resource: str, cancel: bool) -> str:
        tid = server.ok(
            "POST", "/v1/tasks", {"resource": resource, "command": ["true"]}, token, expect=201
        )["id"]
        wait_for(
            lambda: server.ok("GET", f"/v1/tasks/{tid}")["state"] == "placed", 10, f"{tid} placed"
        )
        if cancel:
            server.ok("POST", f"/v1/tasks/{tid}/cancel", {"reason": "test"}, token)
        return tid

    return Work(
        bob_task=run(people.bob, "team-a/one", True),
        erin_task=run(people.erin, "team-b/one", True),
        alice_task=run(people.alice, "team-a/sized", False),
    )
