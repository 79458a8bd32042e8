"""``kliqued plan --what-if``: a week of demand replayed on the base and the head (issue 16).

The demand is a week of work in the daemon's export format (tests/whatif/week.py), replayed
in simulated time; the plans are made from real git repositories, as CI makes them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from klique_util.demand import to_csv
from tests.plan.helpers import commit_all, init_repo, run_plan

from .week import week

HERE = Path(__file__).resolve().parent
ESTATE = HERE / "estate"
GOLDEN = HERE / "golden"


@pytest.fixture(scope="module")
def demand(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("demand") / "week.csv"
    path.write_text(to_csv(week()))
    return path


def repo_with(tmp: Path, edit: tuple[str, str, str] | None) -> Path:
    """main: the test estate; the working tree: ``edit`` (file, old, new) applied."""
    repo = init_repo(tmp / "repo")
    shutil.copytree(ESTATE, repo / "estate", copy_function=shutil.copy)
    commit_all(repo, "the estate")
    if edit is not None:
        name, old, new = edit
        path = repo / "estate" / name
        text = path.read_text()
        assert old in text, (name, old)
        path.write_text(text.replace(old, new, 1))
    return repo


def plan_json(capsys, repo: Path, demand: Path, *extra: str) -> dict:
    code, out, err = run_plan(
        capsys,
        "--repo",
        str(repo),
        "--base",
        "main",
        "--what-if",
        str(demand),
        "--format",
        "json",
        *extra,
    )
    assert code in (0, 2), err
    return json.loads(out)


def side(plan: dict, group: str, which: str) -> dict:
    return plan["whatif"]["groups"][group][which]


LOWER_A = (
    "policies.yaml",
    "reservation: 4\n    limit: 12\n  - name: team-b",
    "reservation: 4\n    limit: 4\n  - name: team-b",
)
RAISE_C = ("policies.yaml", "hours: 45", "hours: 90")


def test_lowering_a_limit_shows_that_groups_longer_waits_and_the_others_gains(
    tmp_path, capsys, demand
) -> None:
    plan = plan_json(capsys, repo_with(tmp_path, LOWER_A), demand)
    w = plan["whatif"]
    assert w["tasks"] == len(week()) and w["refused"] == {"head": [], "base": []}
    a_base, a_head = side(plan, "team-a", "base"), side(plan, "team-a", "head")
    assert a_head["wait_s"]["p95"] > a_base["wait_s"]["p95"]
    assert a_head["over_threshold"] > a_base["over_threshold"]
    for g in ("team-b", "team-c"):
        b, h = side(plan, g, "base"), side(plan, g, "head")
        assert h["wait_s"]["p50"] <= b["wait_s"]["p50"], g
        assert h["over_threshold"] < b["over_threshold"], g
    # The same work is asked of both sides; cost and GPU-hours follow what was placed.
    assert side(plan, "all", "base")["tasks"] == side(plan, "all", "head")["tasks"]
    # Per pool (one pool here): the waits of the tasks first placed there, the preemptions.
    for which in ("base", "head"):
        pool, every = w["pools"]["onprem"][which], side(plan, "all", which)
        assert pool["capacity"] == 16 and pool["placed"] == every["placed"]
        assert pool["wait_s"] == every["wait_s"]
        assert pool["over_threshold"] == every["over_threshold"] - every["never_placed"]
        assert pool["preemptions"] == every["preemptions"]


def test_raising_a_budget_shows_fewer_exhaustions(tmp_path, capsys, demand) -> None:
    plan = plan_json(capsys, repo_with(tmp_path, RAISE_C), demand)
    base, head = side(plan, "team-c", "base"), side(plan, "team-c", "head")
    assert len(base["budget_exhaustions"]) >= 3, base
    assert len(head["budget_exhaustions"]) < len(base["budget_exhaustions"]), (base, head)
    # When: the start of each day whose budget ran out.
    assert all(t.endswith("T00:00:00Z") for t in base["budget_exhaustions"])
    assert base["preemptions"]["budget"] + len(base["budget_exhaustions"]) > head["preemptions"][
        "budget"
    ] + len(head["budget_exhaustions"])


def test_demand_the_head_cannot_take_is_named(tmp_path, capsys, demand) -> None:
    # team-c loses the big profile, and team-b's big tasks (4 GPUs) exceed its new limit.
    repo = repo_with(
        tmp_path,
        (
            "profiles.yaml",
            "max: 8}\n    pools: [onprem]\n    policies: [team-a, team-b, team-c]",
            "max: 8}\n    pools: [onprem]\n    policies: [team-a, team-b]",
        ),
    )
    path = repo / "estate" / "policies.yaml"
    path.write_text(
        path.read_text().replace(
            "reservation: 4\n    limit: 12\n  - name: team-c",
            "reservation: 2\n    limit: 3\n  - name: team-c",
        )
    )
    plan = plan_json(capsys, repo, demand)
    refused = plan["whatif"]["refused"]["head"]
    expected = [r for r in week() if r.resource in ("team-c/big", "team-b/big")]
    assert {r["task"] for r in refused} == {r.id for r in expected}
    by = {r["task"]: r for r in refused}
    c = next(r for r in expected if r.resource == "team-c/big")
    b = next(r for r in expected if r.resource == "team-b/big")
    assert by[c.id]["field"] == "resource" and "team-c/big" in by[c.id]["message"]
    assert by[b.id]["field"] == "gpus", by[b.id]
    # Left out of both sides: the replays compare the same work.
    assert side(plan, "all", "base")["tasks"] == len(week()) - len(expected)
    code, out, _ = run_plan(capsys, "--repo", str(repo), "--base", "main", "--what-if", str(demand))
    assert f"{len(expected)} tasks of the demand the head cannot take" in out
    cs = [r.id for r in expected if r.resource == "team-c/big"]
    assert (
        f"  {len(cs)} on team-c/big ({cs[0]}, {cs[1]}, {cs[2]} and {len(cs) - 3} more; "
        "carol): resource: "
    ) in out
    code, out, _ = run_plan(
        capsys,
        "--repo",
        str(repo),
        "--base",
        "main",
        "--what-if",
        str(demand),
        "--format",
        "github",
    )
    assert "::warning title=klique plan%3A demand the head cannot take::" in out


def test_the_same_inputs_give_the_same_report(tmp_path, capsys, demand) -> None:
    repo = repo_with(tmp_path, LOWER_A)
    runs = [
        run_plan(
            capsys,
            "--repo",
            str(repo),
            "--base",
            "main",
            "--what-if",
            str(demand),
            "--format",
            "markdown",
        )[1]
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
    assert "What if: " in runs[0]


def test_markdown_golden(tmp_path, capsys, demand) -> None:
    """The pull-request comment with the comparison table (docs/gitops.md shows it)."""
    repo = repo_with(tmp_path, LOWER_A)
    code, out, err = run_plan(
        capsys,
        "--repo",
        str(repo),
        "--base",
        "main",
        "--what-if",
        str(demand),
        "--format",
        "markdown",
    )
    assert code == 2, err
    text = _normalise(out, demand)
    golden = GOLDEN / "lower-limit.md"
    if not golden.exists():  # pragma: no cover - writes the golden on the first run
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text()


def test_every_format_carries_the_comparison(tmp_path, capsys, demand) -> None:
    repo = repo_with(tmp_path, LOWER_A)
    args = ("--repo", str(repo), "--base", "main", "--what-if", str(demand))
    _, text, _ = run_plan(capsys, *args)
    assert "What if: " in text and "wait p95" in text and "-> " in text
    _, gh, _ = run_plan(capsys, *args, "--format", "github")
    assert "title=klique plan%3A what if::" in gh and "team-a |" in gh


def test_a_bad_demand_file_is_a_clear_error(tmp_path, capsys) -> None:
    repo = repo_with(tmp_path, LOWER_A)
    bad = tmp_path / "bad.csv"
    bad.write_text(
        "id,submit,resource,user,project,gpus,runtime\n"
        "a,2026-01-05T00:00:00Z,team-a/one,alice,,,1h\n"
        "b,yesterday,team-a/one,alice,,,1h\n"
    )
    code, out, err = run_plan(capsys, "--repo", str(repo), "--base", "main", "--what-if", str(bad))
    assert code == 1 and out == ""
    assert f"{bad}:3: submit: unparsable time 'yesterday'" in err
    code, _, err = run_plan(capsys, "--repo", str(repo), "--what-if", str(bad), "--since", "1d")
    assert code == 1 and "--since needs --what-if-from" in err
    code, _, err = run_plan(capsys, "--repo", str(repo), "--since", "1d")
    assert code == 1 and "--since needs --what-if-from" in err
    code, _, err = run_plan(
        capsys, "--repo", str(repo), "--what-if", str(bad), "--wait-threshold", "soon"
    )
    assert code == 1 and "--wait-threshold: expected a duration" in err
    code, out, err = run_plan(capsys, "--repo", str(repo), "--what-if", str(tmp_path / "none"))
    assert code == 1 and "none: cannot read" in err
    # A daemon that cannot be reached fails the plan rather than planning without it.
    code, out, err = run_plan(
        capsys, "--repo", str(repo), "--what-if-from", "http://127.0.0.1:9", "--token", "kq_x"
    )
    assert code == 1 and out == "" and "127.0.0.1:9" in err, err


def _normalise(text: str, demand: Path) -> str:
    import re

    text = text.replace(str(demand), "week.csv")
    return re.sub(r"\(([0-9a-f]{7})\)", "(COMMIT)", text)


def test_the_docs_show_the_real_comment() -> None:
    """docs/gitops.md's example comment is the golden's what-if table, as kliqued writes it."""
    docs = (HERE.parents[1] / "docs" / "gitops.md").read_text()
    golden = (GOLDEN / "lower-limit.md").read_text()
    start = golden.index("#### What if")
    table = golden[start : golden.index("<details>", start)].strip()
    assert table in docs


def test_no_changes_replays_once_and_reads_the_same_on_both_sides(tmp_path, capsys, demand) -> None:
    code, out, err = run_plan(
        capsys,
        "--repo",
        str(repo_with(tmp_path, None)),
        "--base",
        "main",
        "--what-if",
        str(demand),
        "--format",
        "json",
    )
    assert code == 0, err
    w = json.loads(out)["whatif"]
    assert all(g["base"] == g["head"] for g in w["groups"].values())
    assert w["groups"]["all"]["base"]["tasks"] == len(week())
