"""``kliqued plan`` end to end, on real git repositories: revisions, defaults, exit codes."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import cast

import pytest

from kliqued.cli import build_parser

from .helpers import V1, V2, commit_all, git, init_repo, put_estate, run_plan, two_commit_repo


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return two_commit_repo(tmp_path / "repo")[0]


def test_changes_with_places_and_exit_2(repo: Path, capsys) -> None:
    code, out, _ = run_plan(capsys, "--repo", str(repo), "--base", "main", "--head", "change")
    assert code == 2
    expected = [
        '~ pool "onprem-k8s"  (estate/pools/onprem.yaml:3)',
        "~ capacity = 64 -> 32",
        "(estate/pools/onprem.yaml:5)",
        '+ labels.site = "fra1"',
        '+ profile "notebook"  (estate/profiles.yaml:18)',
        # pools of a profile that uses pools_by: resolved, at the pools_by line
        "+ pools = [onprem-k8s]         (estate/profiles.yaml:22)",
        '- policy "team-c"  (estate/policies.yaml:18)',  # the base's place
        '~ group "ml-team" → "ml-platform"  (estate/groups.yaml:10)',
        "~ users = [dave] -> [dave, erin]  (estate/groups.yaml:13)",
        "~ budget.hours = 2000 -> 1500  (estate/policies.yaml:7)",
        "~ time_weight = 2 -> 4  (estate/profiles.yaml:9)",
        "Plan: 1 to add, 5 to change, 1 to remove.",
    ]
    for line in expected:
        assert line in out, line
    # the rename is one change, and the policy that refers to the group shows no noise
    assert 'group "ml-team"' not in out.replace('group "ml-team" →', "")
    assert 'policy "team-b"' not in out
    assert (
        "each task of team-a on large now burns 4 instead of 2 budget hours per hour (+100%)" in out
    )
    assert "compute resource team-c/standard is removed" in out
    assert "\033[" not in out  # not a TTY: no colour


def test_same_revision_twice_is_no_changes(repo: Path, capsys) -> None:
    code, out, _ = run_plan(capsys, "--repo", str(repo), "--base", "change", "--head", "HEAD")
    assert code == 0
    assert "No changes." in out


def test_unknown_revision_is_a_clear_error(repo: Path, capsys) -> None:
    code, out, err = run_plan(capsys, "--repo", str(repo), "--base", "nope")
    assert code == 1
    assert err.strip() == f"kliqued plan: unknown revision 'nope' in {repo}"
    assert "Traceback" not in err and out == ""


def test_not_a_git_repository(tmp_path: Path, capsys) -> None:
    code, _, err = run_plan(capsys, "--repo", str(tmp_path))
    assert code == 1
    assert "is not in a git repository" in err


def test_invalid_head_prints_diagnostics_with_positions(repo: Path, capsys) -> None:
    bad = repo / "estate" / "profiles.yaml"
    bad.write_text(bad.read_text().replace("time_weight: 4", "time_wieght: 4"))
    commit_all(repo, "typo")
    code, out, _ = run_plan(capsys, "--repo", str(repo), "--base", "main", "--head", "HEAD")
    assert code == 1
    assert "estate/profiles.yaml:9:5: error[unknown-field]" in out
    assert "did you mean 'time_weight'?" in out
    assert "Plan failed: the head estate is invalid." in out
    code, out, _ = run_plan(
        capsys, "--repo", str(repo), "--base", "main", "--head", "HEAD", "--format", "github"
    )
    assert code == 1
    assert "::error file=estate/profiles.yaml,line=9,col=5,title=unknown-field::" in out


def test_invalid_base_is_said_and_exits_1(repo: Path, capsys) -> None:
    git(repo, "checkout", "-q", "main")
    (repo / "estate" / "groups.yaml").write_text("groups:\n  - name: Team_A\n")
    commit_all(repo, "broken")
    code, out, _ = run_plan(capsys, "--repo", str(repo), "--base", "main", "--head", "change")
    assert code == 1
    assert "The base estate (main (" in out and "is invalid" in out
    assert "Plan failed: the base estate is invalid." in out


def test_default_base_is_the_merge_base_with_main(repo: Path, capsys, monkeypatch) -> None:
    # main moves on after the branch was made: its change must not show in the branch's plan
    git(repo, "checkout", "-q", "main")
    pricing = repo / "estate" / "pricing.yaml"
    pricing.write_text(pricing.read_text().replace("2.80", "3.10"))
    commit_all(repo, "price change on main")
    git(repo, "checkout", "-q", "change")
    monkeypatch.chdir(repo / "estate")  # --repo defaults to the repo around the cwd
    code, out, _ = run_plan(capsys, "--head", "HEAD")
    assert code == 2
    assert "at merge base with main (" in out
    assert "per_gpu_hour" not in out
    assert "Plan: 1 to add, 5 to change, 1 to remove." in out


def test_default_base_falls_back_and_explains(tmp_path: Path, capsys) -> None:
    repo = init_repo(tmp_path / "r", branch="trunk")
    put_estate(repo, V1)
    commit_all(repo, "v1")
    code, _, err = run_plan(capsys, "--repo", str(repo))
    assert code == 1
    assert "pass --base REV" in err
    git(repo, "branch", "master")
    code, out, _ = run_plan(capsys, "--repo", str(repo))
    assert code == 0 and "merge base with master" in out


def test_working_tree_is_the_default_head(repo: Path, capsys) -> None:
    onprem = repo / "estate" / "pools" / "onprem.yaml"
    onprem.write_text(onprem.read_text().replace("capacity: 32", "capacity: 40"))
    (repo / "estate" / ".hidden.yaml").write_text("not: [valid")  # hidden: skipped
    code, out, _ = run_plan(capsys, "--repo", str(repo), "--base", "change")
    assert code == 2
    assert "-> working tree" in out
    assert "~ capacity = 32 -> 40  (estate/pools/onprem.yaml:5)" in out
    assert "Plan: 0 to add, 1 to change, 0 to remove." in out


def test_absent_estate_at_base_adds_everything(tmp_path: Path, capsys) -> None:
    repo = init_repo(tmp_path / "r")
    (repo / "README.md").write_text("estate repo\n")
    commit_all(repo, "empty")
    put_estate(repo, V2, "clusters/estate")
    commit_all(repo, "first estate")
    code, out, _ = run_plan(
        capsys,
        "--repo",
        str(repo),
        "--base",
        "HEAD~1",
        "--head",
        "HEAD",
        "--estate-path",
        "clusters/estate/",
        "--format",
        "json",
    )
    assert code == 2
    plan = json.loads(out)
    assert plan["base"]["exists"] is False
    assert {c["action"] for c in plan["changes"]} == {"create"}
    assert plan["summary"]["remove"] == 0 and plan["summary"]["add"] == len(plan["changes"])
    assert any(c["source"]["file"] == "clusters/estate/pools/onprem.yaml" for c in plan["changes"])
    code, _, err = run_plan(
        capsys,
        "--repo",
        str(repo),
        "--base",
        "HEAD~1",
        "--head",
        "HEAD",
        "--estate-path",
        "nowhere",
    )
    assert code == 1 and "exists at neither revision" in err


def test_output_file_is_written_and_exit_code_kept(repo: Path, tmp_path: Path, capsys) -> None:
    target = tmp_path / "out" / "plan.md"
    code, out, err = run_plan(
        capsys,
        "--repo",
        str(repo),
        "--base",
        "main",
        "--head",
        "change",
        "--format",
        "markdown",
        "-o",
        str(target),
    )
    assert code == 2 and out == ""
    text = target.read_text()
    assert text.startswith("<!-- klique-plan -->\n")
    assert "Plan: 1 to add, 5 to change, 1 to remove." in err


def test_json_shape(repo: Path, capsys) -> None:
    code, out, _ = run_plan(
        capsys, "--repo", str(repo), "--base", "main", "--head", "change", "--format", "json"
    )
    plan = json.loads(out)
    assert plan["format_version"] == "1.0"
    assert {k: plan["summary"][k] for k in ("add", "change", "remove")} == {
        "add": 1,
        "change": 5,
        "remove": 1,
    }
    assert code == plan["exit_code"] == 2
    rename = next(c for c in plan["changes"] if c["action"] == "rename")
    assert rename["address"] == "group.ml-platform" and rename["previous_name"] == "ml-team"
    assert rename["before"]["name"] == "ml-team" and rename["after"]["name"] == "ml-platform"
    assert rename["source"] == {"file": "estate/groups.yaml", "line": 10}
    pool = next(c for c in plan["changes"] if c["address"] == "pool.onprem-k8s")
    assert pool["before"]["capacity_milli"] == 64000 and pool["after"]["capacity_milli"] == 32000
    assert {i["severity"] for i in plan["impacts"]} == {"warn", "info"}
    assert all(set(i) >= {"severity", "kind", "message", "details"} for i in plan["impacts"])


def test_help_has_examples() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    # a subparsers action: its choices are the subcommands' parsers by name
    choices = cast(dict[str, argparse.ArgumentParser], sub.choices)
    help_text = choices["plan"].format_help()
    assert "examples:" in help_text and "kliqued plan --base main --head HEAD" in help_text


def test_v1_and_v2_estates_are_valid() -> None:
    from compiler.api import compile_dir

    for d in (V1, V2):
        result = compile_dir(d)
        assert result.ok and not result.diagnostics, result.diagnostics
