"""``kliqued plan --what-if`` with lending settings that change (issue 28, lending.md "What
the product shows"): per group, reclaims, rebalances, lost GPU-hours and waits, base against
head, in every format.

A small demand on the test estate (pool ``onprem``: 16 GPUs; team-a and team-b reserve 4
each, limit 12): team-a fills 12 GPUs for 4 hours, then team-b asks for 8. With the default
``order: ordered`` team-b gets the 4 free GPUs and its other 4 tasks wait for team-a's
to end; with ``order: fair`` the head rebalances at once, one GPU at a time, until both
borrow as much (team-a 4 above its reservation, team-b 4): 4 of team-a's tasks are
rebalanced, each losing the minute it ran, and team-b waits for nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from klique_util.demand import DemandRow, to_csv
from klique_util.units import HOUR_MS, MINUTE_S, SECOND_MS
from tests.plan.helpers import run_plan

from .test_whatif import repo_with
from .week import START_MS

MINUTE_MS = MINUTE_S * SECOND_MS
FAIR = ("settings.yaml", "  currency: EUR\n", "  currency: EUR\n  lending:\n    order: fair\n")


def small_demand() -> list[DemandRow]:
    rows = [
        DemandRow(
            "", START_MS, "team-a/one", "alice", None, None, 4 * HOUR_MS, "user:alice", "finished"
        )
        for _ in range(12)
    ]
    rows += [
        DemandRow(
            "",
            START_MS + MINUTE_MS,
            "team-b/one",
            "bob",
            None,
            None,
            4 * HOUR_MS,
            "user:bob",
            "finished",
        )
        for _ in range(8)
    ]
    return [
        DemandRow(
            f"t-{i:05d}",
            r.submit_ms,
            r.resource,
            r.user,
            r.project,
            r.gpus_milli,
            r.runtime_ms,
            r.channel,
            r.status,
        )
        for i, r in enumerate(rows, 1)
    ]


@pytest.fixture
def demand(tmp_path: Path) -> Path:
    path = tmp_path / "small.csv"
    path.write_text(to_csv(small_demand()))
    return path


def test_changing_order_to_fair_shows_rebalances_lost_work_and_waits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], demand: Path
) -> None:
    repo = repo_with(tmp_path, FAIR)
    args = ("--repo", str(repo), "--base", "main", "--what-if", str(demand))
    code, out, err = run_plan(capsys, *args, "--format", "json")
    assert code == 2, err
    w = json.loads(out)["whatif"]
    assert w["lending_changes"] == ["settings.lending.order"]
    a, b = w["groups"]["team-a"], w["groups"]["team-b"]
    assert a["base"]["preemptions"] == {"reclaimed": 0, "rebalanced": 0, "budget": 0}
    assert a["head"]["preemptions"] == {"reclaimed": 0, "rebalanced": 4, "budget": 0}
    assert (a["base"]["lost_gpu_hours"], a["head"]["lost_gpu_hours"]) == (0, 0.067)  # 4 x 1m
    assert b["head"]["lost_gpu_hours"] == 0 and b["head"]["preemptions"]["rebalanced"] == 0
    # team-b: half its work waited for team-a's 4 hours; fair takes it at once
    assert b["base"]["wait_s"]["p95"] == 4 * 3600 - 60 and b["head"]["wait_s"]["p95"] == 0
    assert b["base"]["wait_s"]["p50"] == 0 and b["head"]["wait_s"]["p50"] == 0
    # waits are to the first placement: team-a's rebalanced tasks lose work, not wait time
    assert a["head"]["wait_s"]["max"] == a["base"]["wait_s"]["max"] == 0
    assert w["groups"]["all"]["head"]["preemptions"]["rebalanced"] == 4
    assert w["pools"]["onprem"]["head"]["preemptions"]["rebalanced"] == 4

    code, text, _ = run_plan(capsys, *args)
    assert (
        "The head changes lending (settings.lending.order): each group's reclaims, "
        "rebalances and lost GPU-hours are in its row." in text
    )
    header = next(line for line in text.splitlines() if line.lstrip().startswith("group"))
    assert "preempted" in header and "lost GPU-hours" in header
    row_a = next(line for line in text.splitlines() if line.lstrip().startswith("team-a"))
    assert "0 -> 4 rebalanced" in row_a and "0 -> 0.067" in row_a, row_a
    row_b = next(line for line in text.splitlines() if line.lstrip().startswith("team-b"))
    assert "3h59m -> 0s" in row_b, row_b

    code, md, _ = run_plan(capsys, *args, "--format", "markdown")
    assert (
        "| group | tasks | wait p50 | wait p95 | wait max | over 1h | GPU-hours | "
        "preempted | lost GPU-hours | budget ran out | cost |" in md
    )
    assert "0 → 4 rebalanced | 0 → 0.067 |" in md
    assert "**The head changes lending (settings.lending.order)" in md

    code, gh, _ = run_plan(capsys, *args, "--format", "github")
    assert "lost GPU-hours" in gh and "4 rebalanced" in gh


def test_without_a_lending_change_the_tables_are_as_before(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], demand: Path
) -> None:
    repo = repo_with(
        tmp_path, ("policies.yaml", "limit: 12\n  - name: team-b", "limit: 11\n  - name: team-b")
    )
    code, out, _ = run_plan(capsys, "--repo", str(repo), "--base", "main", "--what-if", str(demand))
    assert code == 2 and "lost GPU-hours" not in out and "changes lending" not in out
    code, out, _ = run_plan(
        capsys, "--repo", str(repo), "--base", "main", "--what-if", str(demand), "--format", "json"
    )
    w = json.loads(out)["whatif"]
    assert w["lending_changes"] == []
    # lost work is counted whatever the settings: JSON carries it (no preemption here)
    assert w["groups"]["team-a"]["head"]["lost_gpu_hours"] == 0
