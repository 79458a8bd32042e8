"""Departments in the ledger over HTTP, against a real daemon (issue 12, item 4): intervals
carry their group path, finance rolls up by business unit, and a group admin's SQL and export
see their subtree only, whatever the query tries. The estate (estate_org/): north/ml/team-a
(alice, its admin), north/ml/team-b (bob), south/ops/team-c (carl, its admin); nina heads
north, dana ml, olga ops, sue south."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from tests.harness.daemon import Server
from tests.harness.inproc import InProcServer
from tests.harness.wait import wait_for

ESTATE = Path(__file__).resolve().parent / "estate_org"
CMD = {"command": ["true"]}
SOUTH = ("carl", "team-c", "south", "ops")
"""Text only the south business unit's rows hold."""
NORTH = ("alice", "bob", "team-a", "team-b", "north")


def _sql(server: Server, token: str, sql: str) -> tuple[int, dict]:
    return server.call("POST", "/v1/ledger/sql", {"sql": sql}, token)


def _wait_for_rows(server: Server, n: int) -> None:
    def reached() -> bool:
        status, res = _sql(server, "admin", "SELECT count(*) FROM ledger")
        return status == 200 and res["rows"][0][0] >= n

    try:
        wait_for(reached, 20, f"the ledger to reach {n} rows", every=0.1)
    except AssertionError as exc:
        raise AssertionError(f"{exc}:\n{server.log()}") from None


@pytest.fixture(scope="module")
def org(tmp_path_factory):
    s = InProcServer(tmp_path_factory.mktemp("org"), estate=ESTATE).start()
    tokens = {
        name: s.token({"user": name})
        for name in ("alice", "bob", "carl", "dana", "nina", "olga", "sue")
    }
    tokens["finance"] = s.token({"role": "finance"})
    for user, team in (("alice", "team-a"), ("bob", "team-b"), ("carl", "team-c")):
        s.ok(
            "POST", "/v1/tasks", {"resource": f"{team}/one", **CMD}, token=tokens[user], expect=201
        )
    _wait_for_rows(s, 3)
    yield s, tokens
    assert s.stop() == 0, s.log()


def test_each_interval_carries_its_group_path(org):
    server, t = org
    status, res = _sql(
        server,
        t["finance"],
        'SELECT "group", group_path, business_unit, department FROM usage ORDER BY 1',
    )
    assert status == 200, res
    assert res["rows"] == [
        ["team-a", "north/ml/team-a", "north", "ml"],
        ["team-b", "north/ml/team-b", "north", "ml"],
        ["team-c", "south/ops/team-c", "south", "ops"],
    ]
    status, res = _sql(
        server,
        t["finance"],
        "SELECT business_unit, sum(gpu_hours) > 0 "
        "FROM usage_by_business_unit GROUP BY 1 ORDER BY 1",
    )
    assert status == 200 and res["rows"] == [["north", True], ["south", True]], res


ATTACKS = [
    "SELECT * FROM ledger",
    "SELECT * FROM usage_priced WHERE \"user\" = 'carl' OR \"group\" = 'team-c'",
    "SELECT * FROM (SELECT * FROM usage) u WHERE u.business_unit = 'south'",
    "SELECT (SELECT string_agg(\"user\", ',') FROM ledger) AS users",
    "WITH ledger AS (SELECT * FROM ledger) SELECT * FROM ledger",
    "WITH x AS (SELECT * FROM usage_by_month) SELECT * FROM x",
    'SELECT a.task, b."user" FROM ledger a JOIN usage b ON true',
    'SELECT "user" FROM ledger UNION ALL SELECT "user" FROM usage_monthly '
    "UNION SELECT name FROM usage_by_level",
    'SELECT count(*), list("user"), histogram("group"), max(group_path) FROM ledger',
    "SELECT * FROM usage_by_business_unit",
    "SELECT * FROM usage_by_department",
    "SELECT count(*) AS n FROM ledger WHERE CASE WHEN \"user\" = 'carl' THEN error('x') "
    "ELSE true END",
]


@pytest.mark.parametrize("sql", ATTACKS)
def test_a_department_admin_reads_only_the_department(org, sql):
    server, t = org
    status, res = _sql(server, t["dana"], sql)
    assert status == 200, res
    text = str(res["rows"])
    assert not [w for w in SOUTH if w in text], text


@pytest.mark.parametrize(
    "who,users",
    [
        ("finance", ["alice", "bob", "carl"]),
        ("admin", ["alice", "bob", "carl"]),
        ("nina", ["alice", "bob"]),  # a business unit's head: its departments and teams
        ("dana", ["alice", "bob"]),  # a department's head: its teams
        ("alice", ["alice"]),  # a team's admin: the team
        ("olga", ["carl"]),
        ("sue", ["carl"]),
        ("carl", ["carl"]),
    ],
)
def test_who_sees_which_rows(org, who, users):
    server, t = org
    status, res = _sql(
        server,
        t.get(who, "admin"),
        'SELECT list(DISTINCT "user" ORDER BY "user") FROM usage_priced',
    )
    assert status == 200 and res["rows"] == [[users]], res


def test_a_member_who_administers_nothing_is_refused(org):
    server, t = org
    status, res = _sql(server, t["bob"], "SELECT count(*) FROM ledger")
    assert status == 403 and res["error"]["code"] == "forbidden", res
    status, _ = server.call(
        "GET", "/v1/ledger/export?from=2026-01-01T00:00:00Z&to=2100-01-01T00:00:00Z", token=t["bob"]
    )
    assert status == 403


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM main.ledger",
        "SELECT * FROM kliqued.usage",
        "SELECT * FROM ledger WHERE task IN (SELECT task FROM main.usage)",
        "SELECT * FROM ledger_monthly",
        "SELECT * FROM tokens",
    ],
)
def test_names_past_the_scope_are_a_clear_400(org, sql):
    server, t = org
    status, res = _sql(server, t["dana"], sql)
    assert status == 400 and res["error"]["code"] == "not-allowed", res
    assert not [w for w in SOUTH if w in res["error"]["message"]]


def test_a_department_admins_export_is_the_department(org):
    server, t = org
    path = "/v1/ledger/export?from=2026-01-01T00:00:00Z&to=2100-01-01T00:00:00Z"
    status, whole = server.call("GET", path, token=t["finance"])
    assert status == 200 and "carl" in whole and len(whole.splitlines()) == 4
    status, mine = server.call("GET", path, token=t["dana"])
    assert status == 200, mine
    lines = mine.splitlines()
    assert len(lines) == 3 and not [w for w in SOUTH if w in mine], mine
    assert all(",north/ml/team-" in line for line in lines[1:])
    status, theirs = server.call("GET", path, token=t["olga"])
    assert status == 200 and len(theirs.splitlines()) == 2
    assert not [w for w in NORTH if w in theirs]


def test_rows_from_before_paths_get_the_estates_at_start(tmp_path):
    """A database written before the ledger kept paths: the next start fills them in from
    the estate in force (tests/ledger/test_group_path.py covers the schema's migration)."""
    s = Server(tmp_path, estate=ESTATE).start()
    carl = s.token({"user": "carl"})
    s.ok("POST", "/v1/tasks", {"resource": "team-c/one", **CMD}, token=carl, expect=201)
    _wait_for_rows(s, 1)
    assert s.stop() == 0, s.log()
    conn = duckdb.connect(str(s.db))
    conn.execute("UPDATE ledger SET group_path = NULL")
    conn.close()
    s.start()
    try:
        status, res = _sql(s, "admin", "SELECT group_path FROM ledger")
        assert status == 200 and res["rows"] == [["south/ops/team-c"]], res
        assert "given the group paths" in s.log()
    finally:
        assert s.stop() == 0, s.log()
