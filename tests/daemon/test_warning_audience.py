"""Each warning goes to the people who can act on it (issue 32): a pool's capacity-truth
warnings (its workers disagree with what it declares: "fix the estate's pool or the
machines") to platform admins and IT (the admins of the top group), not to a researcher or a
team lead; a group's budget alerts to its admins, finance and platform admins, not to every
member. On a real daemon (in process), through the API, the CLI and the event log."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Iterator

import pytest

from tests.daemon.fleet import ESTATE, HttpWorker, write_estate
from tests.harness.daemon import ROOT
from tests.harness.inproc import InProcServer
from tests.harness.wait import wait_for

POLICIES = ESTATE["policies.yaml"].replace(
    "    reservation: 0\n    limit: 2\n",
    "    reservation: 0\n    limit: 2\n    budget: {hours: 0.001, period: day, alert_at: [0.5]}\n",
)  # team-b: 3.6 s of budget, an alert at half


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcServer]:
    tmp = tmp_path_factory.mktemp("audience")
    estate = write_estate(tmp / "estate", {**ESTATE, "policies.yaml": POLICIES})
    s = InProcServer(tmp, estate=estate, extra=["--worker-ttl", "600s"]).start()
    w = HttpWorker(s, s.token({"worker": True, "pool": "bare"}), "w-1", gpus=3)
    w.register()  # 3 GPUs in a pool declaring 2: a capacity-truth warning
    tid = s.ok(
        "POST",
        "/v1/tasks",
        {"resource": "team-b/one", "command": ["sleep", "60"]},
        s.token("erin"),
        expect=201,
    )["id"]
    wait_for(lambda: [x["task"] for x in w.lease()] == [tid], 10, "the task leased")
    assert w.report(tid, 1, "started")[0] == 200
    s.step(3)  # past half of team-b's 3.6 s
    wait_for(lambda: s.ok("GET", "/v1/events?kind=alert")["events"], 15, "team-b's budget alert")
    yield s
    assert s.stop() == 0, s.log()


def tok(s: InProcServer, who: str) -> str:
    """A token of ``who``; ``admin``: the platform admin's."""
    return "admin" if who == "admin" else s.token(who)


def truth_of(s: InProcServer, who: str) -> dict | None:
    pools = s.ok("GET", "/v1/pools", token=tok(s, who))["pools"]
    return next(p for p in pools if p["name"] == "bare").get("capacity_truth")


def test_pool_warnings_reach_it_and_admins_only(server: InProcServer) -> None:
    for who in ("admin", "walter"):  # a platform admin; IT: walter administers the top group
        t = truth_of(server, who)
        assert t is not None and t["mismatches"][-1] == (
            "workers of pool bare report 3 GPUs; it declares 2"
        ), (who, t)
    for who in ("bob", "erin", "role:finance"):  # a researcher, a team lead, finance
        assert truth_of(server, who) is None, who


def test_kliqued_pools_shows_a_researcher_no_warning_of_its_pool(server: InProcServer) -> None:
    def pools(who: str) -> str:
        env = {**os.environ, "KLIQUE_URL": server.url, "KLIQUE_TOKEN": server.token(who)}
        env.pop("KLIQUE_CONFIG", None)
        r = subprocess.run(
            [sys.executable, "-m", "kliqued.cli", "pools"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
        return r.stdout

    assert "fix the estate's pool or the machines" in pools("walter")
    out = pools("bob")
    assert "bare" in out and "warning" not in out and "fix the estate" not in out


def budget_of(s: InProcServer, who: str) -> dict:
    pols = s.ok("GET", "/v1/policies", token=tok(s, who))["policies"]
    return next(p for p in pols if p["name"] == "team-b")["budget"]


def test_budget_alerts_reach_the_groups_admins_finance_and_admins(
    server: InProcServer,
) -> None:
    for who in ("erin", "walter", "role:finance", "admin"):
        alerts = budget_of(server, who).get("alerts")
        assert alerts and "team-b" in alerts[0]["text"], (who, alerts)
        one = server.ok("GET", "/v1/policies/team-b", token=tok(server, who))["budget"]
        assert one.get("alerts"), who
    bob = budget_of(server, "bob")  # a member: the budget's numbers, not its alerts
    assert "alerts" not in bob and bob["left_hours"] < 0.001
    assert (
        "alerts" not in server.ok("GET", "/v1/policies/team-b", token=server.token("bob"))["budget"]
    )


def test_the_event_log_gives_budget_alerts_to_the_groups_admins(server: InProcServer) -> None:
    def alerts(who: str) -> list[dict]:
        return server.ok("GET", "/v1/events?kind=alert", token=server.token(who))["events"]

    assert [e["data"]["policy"] for e in alerts("erin")] == ["team-b"]
    assert alerts("bob") == []


def test_the_dashboards_policy_page_shows_alerts_to_those_who_get_them(
    server: InProcServer,
) -> None:
    from tests.web.browser import Browser

    def policy_page(who: str) -> str:
        b = Browser(server.url)
        b.sign_in(server.token(who))
        return b.page("/policy")

    erin = policy_page("erin")
    assert "Alerts this period" in erin and "team-b" in erin
    bob = policy_page("bob")
    assert "team-b" in bob and "Alerts this period" not in bob
