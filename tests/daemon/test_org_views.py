"""A department as its head sees it over HTTP (issue 12, part 3): each policy's place in the
tree, who is waiting in a subtree and why, the envelope's budget with burn rate and run-out,
and each pool's GPUs by level; then the same through `kliqued budget` and `kliqued pools
--by-level`.

The estate (estate_org/): north/ml/team-a (alice), north/ml/team-b (bob), south/ops/team-c
(carl); ml is an envelope: reservation 3 (1 shared), limit 3, 100 budget hours a month. dana
heads ml, nina the business unit north. alice sends 2 one-GPU tasks, then bob 2: ml holds 3,
its limit, so bob's second waits on the department's limit, not on team-b's own (1/4)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kliqued.cli import main
from kliqued.daemon.api.openapi import validator

from tests.harness.daemon import Server
from tests.harness.inproc import InProcServer
from tests.harness.wait import wait_for

ESTATE = Path(__file__).resolve().parent / "estate_org"
CMD = {"command": ["sleep", "600"]}
AT_LIMIT = {"kind": "limit", "text": "ml at limit (3/3 GPUs)"}


def _placed(server: Server, n: int) -> None:
    def reached() -> bool:
        tasks = server.ok("GET", "/v1/tasks?state=placed")["tasks"]
        return len(tasks) >= n

    wait_for(reached, 20, f"{n} placed tasks")


@pytest.fixture(scope="module")
def org(tmp_path_factory):
    s = InProcServer(tmp_path_factory.mktemp("org-views"), estate=ESTATE).start()
    tokens = {n: s.token({"user": n}) for n in ("alice", "bob", "carl", "dana", "nina")}
    tokens["finance"] = s.token({"role": "finance"})
    tokens["worker"] = s.token({"worker": True, "pool": "pool-1"})
    for _ in range(2):
        s.ok(
            "POST",
            "/v1/tasks",
            {"resource": "team-a/one", **CMD},
            token=tokens["alice"],
            expect=201,
        )
    _placed(s, 2)
    for _ in range(2):
        s.ok(
            "POST", "/v1/tasks", {"resource": "team-b/one", **CMD}, token=tokens["bob"], expect=201
        )
    _placed(s, 3)

    def settled() -> bool:  # a pass has seen bob's second task: it has its reason
        q = s.ok("GET", "/v1/resources/team-b/one/queue")["queue"]
        return len(q) == 1 and q[0]["waiting_reason"]["kind"] != "pending"

    wait_for(settled, 20, "bob's second task to have its reason")
    yield s, tokens
    assert s.stop() == 0, s.log()


def test_an_envelope_shows_its_place_its_subtree_and_who_waits(org):
    server, t = org
    ml = server.ok("GET", "/v1/policies/ml", token=t["dana"])
    assert ml["used"] == 3 and ml["reservation"] == 3 and ml["limit"] == 3, ml
    assert ml["envelope"] is True and ml["parent"] is None and ml["levels"] == ["ml"]
    assert ml["depth"] == 0 and ml["path"] == "north/ml"
    assert ml["shared_reservation"] == 1 and ml["below"] == ["team-a", "team-b"]
    assert ml["waiting"] == {
        "tasks": 1,
        "gpus": 1,
        "groups": [
            {"group": "team-b", "policy": "team-b", "tasks": 1, "gpus": 1, "reason": AT_LIMIT}
        ],
    }
    b = ml["budget"]  # the department's meter counts all three placed tasks
    assert b["hours"] == 100 and b["burn_rate"] == 3 and b["runout_at"] is not None, b


def test_a_team_shows_the_envelope_above_it(org):
    server, t = org
    tb = server.ok("GET", "/v1/policies/team-b", token=t["bob"])
    assert tb["envelope"] is False and tb["parent"] == "ml"
    assert tb["levels"] == ["team-b", "ml"] and tb["depth"] == 1
    assert tb["path"] == "north/ml/team-b" and tb["shared_reservation"] is None
    assert tb["below"] == [] and tb["user_limit"] is None
    assert tb["used"] == 1 and tb["waiting"]["groups"][0]["reason"] == AT_LIMIT
    ta = server.ok("GET", "/v1/policies/team-a", token=t["alice"])
    assert ta["waiting"] == {"tasks": 0, "gpus": 0, "groups": []}


def test_a_policy_list_is_the_same_as_each_policy(org):
    """The list shares one reason per task across policies; each entry equals its GET but
    for the budget's clock-dependent figures."""
    server, t = org
    listed = {p["name"]: p for p in server.ok("GET", "/v1/policies", token=t["nina"])["policies"]}
    assert sorted(listed) == ["ml", "team-a", "team-b"]
    for name, p in listed.items():
        one = server.ok("GET", f"/v1/policies/{name}", token=t["nina"])
        strip = lambda x: {k: v for k, v in x.items() if k != "budget"}  # noqa: E731
        assert strip(one) == strip(p), name


@pytest.mark.parametrize(
    "who,want",
    [
        ("finance", [("north", 0, 3), ("ml", 1, 3), ("team-a", 2, 2), ("team-b", 2, 1)]),
        ("nina", [("north", 0, 3), ("ml", 1, 3), ("team-a", 2, 2), ("team-b", 2, 1)]),
        ("dana", [("ml", 1, 3), ("team-a", 2, 2), ("team-b", 2, 1)]),
        ("bob", [("team-b", 2, 1)]),  # a member: their own team, not the department
        ("carl", []),  # another department
        ("worker", []),
    ],
)
def test_pools_by_level_roll_up_what_the_caller_sees(org, who, want):
    server, t = org
    pools = server.ok("GET", "/v1/pools", token=t[who])["pools"]
    got = [(x["group"], x["depth"], x["used"]) for x in pools[0]["by_level"]]
    assert got == want, pools[0]


def test_the_answers_match_the_openapi_document(org):
    """The new fields with values an envelope gives them (the small estate of the schema
    tests has no envelope): the document's schemas, which forbid undeclared fields."""
    server, t = org
    for name in ("ml", "team-b"):
        validator("Policy").validate(server.ok("GET", f"/v1/policies/{name}"))
    validator("PolicyList").validate(server.ok("GET", "/v1/policies"))
    validator("PoolList").validate(server.ok("GET", "/v1/pools", token=t["finance"]))


def _cli(server: Server, token: str, *argv: str, capsys) -> str:
    capsys.readouterr()
    rc = main([*argv, "--url", server.url, "--token", token])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return out


def test_kliqued_budget_is_the_tree_with_who_waits(org, capsys, monkeypatch):
    server, t = org
    monkeypatch.setenv("KLIQUE_CONFIG", "/nonexistent/klique.yaml")
    out = _cli(server, t["dana"], "budget", capsys=capsys)
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["POLICY", "GPUS"] and "WAITING" in lines[0]
    assert [line.split()[0] for line in lines[1:4]] == ["ml", "team-a", "team-b"]
    assert lines[2].startswith("  team-a") and lines[3].startswith("  team-b")
    assert lines[1].split()[1:3] == ["3/3/3", "100"] and lines[1].endswith("1 (1 GPU)")
    assert "  team-b: 1 task (1 GPU), the first: ml at limit (3/3 GPUs)" in lines
    out = _cli(server, t["dana"], "budget", "ml", capsys=capsys)
    assert "envelope     over team-a, team-b; shared reservation 1" in out
    assert "burn rate    3 budget hours per hour" in out
    assert "  team-b: 1 task (1 GPU), the first: ml at limit (3/3 GPUs)" in out
    tail = out.split("\n\n")[-1].splitlines()  # the subtree, as a tree
    assert [line.split()[0] for line in tail] == ["POLICY", "ml", "team-a", "team-b"]
    out = _cli(server, t["bob"], "budget", "team-b", capsys=capsys)
    assert "counted at   team-b > ml" in out and "\n\n" not in out.strip()


def test_kliqued_pools_by_level(org, capsys, monkeypatch):
    server, t = org
    monkeypatch.setenv("KLIQUE_CONFIG", "/nonexistent/klique.yaml")
    out = _cli(server, t["dana"], "pools", "--by-level", capsys=capsys)
    rows = [line.split() for line in out.splitlines()]
    assert rows[0] == ["POOL", "CAPACITY", "USED", "LEVEL", "GPUS", "OF", "POOL"]
    assert rows[1] == ["pool-1", "8", "3", "ml", "3", "38%"]
    assert rows[2:] == [["team-a", "2", "25%"], ["team-b", "1", "12%"]]
    assert out.splitlines()[2].index("team-a") == out.splitlines()[1].index("ml") + 2
