"""``kliqued plan --against URL`` on a real daemon: the plan counts what each change does to
the work that runs now (issue 10, friction "Plan against the running system"), read with a
token of the read-only ``planner`` role from ``GET /v1/plan/state``."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.daemon.fleet import ESTATE, FleetServer, HttpWorker, write_estate

from .helpers import commit_all, init_repo, run_plan
from tests.harness.wait import wait_for


@pytest.fixture
def running(tmp_path: Path):
    """A daemon on the fleet estate (pool ``bare``: 2 GPUs) with team-b's two tasks placed
    and a third queued (limit 2), and a git repository whose main holds the same estate."""
    repo = init_repo(tmp_path / "repo")
    write_estate(repo / "estate")
    commit_all(repo, "the estate")
    s = FleetServer(
        tmp_path, estate=repo / "estate", extra=["--no-watch"], workers=False
    ).start()  # no worker: every pool takes work
    erin = s.token({"user": "erin"})
    placed = [s.submit(erin, "team-b/one", ["sleep", "100"]) for _ in range(2)]
    queued = s.submit(erin, "team-b/one", ["sleep", "100"])
    wait_for(lambda: all(s.task(t)["state"] == "placed" for t in placed), 10, "placed")
    assert s.task(queued)["state"] == "queued"
    planner = s.token({"role": "planner", "name": "ci"})
    yield s, repo, planner
    s.stop()


def _edit(repo: Path, name: str, old: str, new: str) -> None:
    path = repo / "estate" / name
    text = path.read_text()
    assert old in text, (name, old)
    path.write_text(text.replace(old, new, 1))


def test_the_plan_counts_what_each_change_does_to_running_work(running, capsys) -> None:
    s, repo, planner = running
    # team-b loses the profile of its tasks, its limit drops under what it uses, it gets a
    # budget that the two running tasks have already spent, and its price is backdated.
    _edit(repo, "profiles.yaml", "policies: [team-a, team-b]", "policies: [team-a]")
    _edit(
        repo,
        "policies.yaml",
        "reservation: 0\n    limit: 2",
        "reservation: 0\n    limit: 1\n    budget: {hours: 0.001, period: month}",
    )
    _edit(repo, "pricing.yaml", "per_gpu_hour: 1.0", "per_gpu_hour: 1.5")
    state = s.ok("GET", "/v1/plan/state", token=planner)
    wait_for(
        lambda: (
            s.ok("GET", "/v1/plan/state", token=planner)["policies"]["team-b"]["budget_used_hours"][
                "month"
            ]
            >= 0.001
        ),
        10,
        "the budget spent",
    )
    assert state["compute_resources"]["team-b/one"] == {
        "queued": 1,
        "placed": 2,
        "placed_gpus": 2,
        "weighted_placed": 2,
    }
    code, out, err = run_plan(
        capsys,
        "--repo",
        str(repo),
        "--base",
        "main",
        "--against",
        s.url,
        "--token",
        planner,
        "--format",
        "json",
    )
    assert code == 2, err
    plan = json.loads(out)
    assert plan["against"]["source"] == s.url
    assert plan["against"]["revision"] == plan["base"]["estate_revision"]
    by_kind = {i["kind"]: i for i in plan["impacts"]}
    removed = by_kind["compute-resource-removed"]
    assert (
        "it cancels 1 queued task now; 2 placed tasks (2 GPUs) run to their end"
        in removed["message"]
    ), removed
    assert removed["details"]["live"] == {"queued": 1, "placed": 2, "placed_gpus": 2}
    limit = by_kind["limit-lowered"]
    assert "the group uses 2 GPUs now, 1 GPU over the new limit" in limit["message"], limit
    budget = by_kind["budget-added"]
    assert "so it preempts 2 running budgeted tasks at once" in budget["message"], budget
    price = by_kind["price-backdated"]
    assert price["severity"] == "warn" and price["details"]["gpu_type"] == "l40s-48gb"
    assert "1 EUR -> 1.5 EUR per GPU-hour (+50%)" in price["message"], price
    assert price["details"]["recorded_gpu_hours"] > 0, price
    # The text rendering says where the counts come from.
    code, out, _ = run_plan(
        capsys, "--repo", str(repo), "--base", "main", "--against", s.url, "--token", planner
    )
    assert f"Counted against {s.url}: revision {plan['base']['estate_revision'][:19]}" in out


def test_the_planner_role_reads_the_plan_state_and_nothing_else(running, capsys) -> None:
    s, repo, planner = running
    assert s.call("GET", "/v1/tasks", token=planner)[0] == 403
    assert (
        s.call("POST", "/v1/tasks", {"resource": "team-b/one", "command": ["true"]}, token=planner)[
            0
        ]
        == 403
    )
    assert s.call("POST", "/v1/ledger/sql", {"sql": "SELECT 1"}, token=planner)[0] == 403
    erin = s.token({"user": "erin"})
    status, body = s.call("GET", "/v1/plan/state", token=erin)
    assert status == 403 and "role:planner" in body["error"]["message"]
    code, _, err = run_plan(
        capsys, "--repo", str(repo), "--base", "main", "--against", s.url, "--token", erin
    )
    assert code == 1 and "role:planner" in err and "Traceback" not in err


def test_a_daemon_that_cannot_be_reached_fails_the_plan_clearly(tmp_path: Path, capsys) -> None:
    repo = init_repo(tmp_path / "repo")
    write_estate(repo / "estate", ESTATE)
    commit_all(repo, "the estate")
    start = time.monotonic()
    code, _, err = run_plan(
        capsys,
        "--repo",
        str(repo),
        "--base",
        "main",
        "--against",
        "http://127.0.0.1:9",
        "--token",
        "kq_x",
    )
    assert code == 1 and err.startswith("kliqued plan: ") and "Traceback" not in err
    assert time.monotonic() - start < 60


def test_the_plan_notes_a_pool_whose_workers_disagree_with_its_declaration(
    tmp_path, capsys
) -> None:
    """Issue 15: a worker reporting more GPUs than its pool declares is a warning of
    ``plan --against`` (the plan's numbers are the declared capacity)."""
    repo = init_repo(tmp_path / "repo")
    write_estate(repo / "estate")
    commit_all(repo, "the estate")
    s = FleetServer(tmp_path, estate=repo / "estate", extra=["--no-watch"], ttl="60s").start()
    try:
        wt = s.token({"worker": True, "pool": "bare"})
        w = HttpWorker(s, wt, "big", gpus=4)
        w.register()
        planner = s.token({"role": "planner", "name": "ci"})
        code, out, err = run_plan(
            capsys,
            "--repo",
            str(repo),
            "--base",
            "main",
            "--against",
            s.url,
            "--token",
            planner,
            "--format",
            "json",
        )
        impacts = [i for i in json.loads(out)["impacts"] if i["kind"] == "capacity-mismatch"]
        assert [(i["severity"], i["details"]["pool"]) for i in impacts] == [("warn", "bare")]
        assert (
            "worker big reports 4 GPUs, more than pool bare's capacity (2)" in impacts[0]["message"]
        )
    finally:
        s.stop()
