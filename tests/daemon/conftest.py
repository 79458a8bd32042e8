"""Fixtures: one shared daemon on the small test estate, with a token per kind of principal.

The shared daemon runs in the test process (tests/harness/inproc.py): the tests using it put
the API under test, no process boundary. Tests that stop, kill or restart a daemon start
their own subprocess (see test_durability.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.harness.daemon import Server
from tests.harness.inproc import InProcServer


@dataclass
class Principals:
    admin: str
    finance: str
    alice: str  # team-a user and team-a admin
    bob: str  # team-a user
    erin: str  # team-b user: another group
    walter: str  # admin of the department `lab` (above team-a and team-b), no group member
    worker: str  # worker:pool-1
    revoked: str  # was bob's


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> Iterator[InProcServer]:
    s = InProcServer(tmp_path_factory.mktemp("daemon")).start()
    yield s
    code = s.stop()
    assert code == 0, s.log()


@pytest.fixture(scope="session")
def who(server: Server) -> Principals:
    revoked = server.ok("POST", "/v1/tokens", {"user": "bob", "name": "to revoke"}, expect=201)
    server.ok("DELETE", f"/v1/tokens/{revoked['id']}", expect=204)
    return Principals(
        admin=server.admin or "",
        finance=server.token({"role": "finance"}),
        alice=server.token({"user": "alice"}),
        bob=server.token({"user": "bob"}),
        erin=server.token({"user": "erin"}),
        walter=server.token({"user": "walter"}),
        worker=server.token({"worker": True, "pool": "pool-1"}),
        revoked=revoked["token"],
    )


@pytest.fixture(params=["duckdb", "postgresql"])
def db(request) -> str | None:
    """``--db`` for the tests run on both backends: None (the DuckDB file in the test's
    directory, the default) or a fresh PostgreSQL database (skipped where none can run)."""
    if request.param == "duckdb":
        return None
    return request.getfixturevalue("pg_url")
