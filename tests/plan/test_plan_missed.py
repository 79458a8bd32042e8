"""The two changes ``kliqued plan`` called "No changes" (issue 25, item 7), end to end on a
real git repository: alert channels added to settings, and the machines behind a pool. Both
give a new revision, so both must be in the plan, exit 2, and the alerts need IT."""

from __future__ import annotations

import json
from pathlib import Path

from kliqued.cli import main

from .helpers import V1, commit_all, git, init_repo, put_estate, run_plan

WEBHOOK = "https://hooks.outside.example.com/klique-alerts"

ALERTS = f"""\
  approvers: [ian]
  alerts:
    it: [gpu-ops@example.org]
    channels:
      - name: ops
        kind: webhook
        url: {WEBHOOK}
"""


def _repo(tmp_path: Path, edit: dict[str, tuple[str, str]]) -> Path:
    """main: the v1 estate (with ``settings.approvers`` when ``edit`` adds them); branch
    ``change``: the same with each file's text replaced."""
    repo = init_repo(tmp_path / "repo")
    put_estate(repo, V1)
    settings = repo / "estate" / "settings.yaml"
    settings.write_text(settings.read_text() + "  approvers: [ian]\n")
    commit_all(repo, "estate v1")
    git(repo, "checkout", "-q", "-b", "change")
    for name, (old, new) in edit.items():
        path = repo / "estate" / name
        text = path.read_text()
        assert old in text, (name, old)
        path.write_text(text.replace(old, new, 1))
    commit_all(repo, "the change")
    return repo


def _revisions(repo: Path, capsys) -> tuple[str, str]:
    revs = []
    for ref in ("main", "change"):
        git(repo, "checkout", "-q", ref)
        assert main(["compile", str(repo / "estate")]) == 0
        revs.append(json.loads(capsys.readouterr().out)["revision"])
    git(repo, "checkout", "-q", "change")
    return revs[0], revs[1]


def test_an_alert_webhook_to_an_outside_url_is_a_change_that_it_approves(
    tmp_path: Path, capsys
) -> None:
    repo = _repo(tmp_path, {"settings.yaml": ("  approvers: [ian]\n", ALERTS)})
    base, head = _revisions(repo, capsys)
    assert base != head
    code, out, _ = run_plan(capsys, "--repo", str(repo), "--base", "main", "--head", "change")
    assert code == 2, out
    assert "No changes" not in out
    assert "~ settings" in out
    assert f'+ alerts.channels.ops.url = "{WEBHOOK}"' in out
    assert '+ alerts.it = ["gpu-ops@example.org"]' in out
    # the outside place is named as an impact, and IT approves the change
    assert f"warn   alerts now go to 2 new places outside Klique: {WEBHOOK}" in out
    assert "  settings  ian (IT)" in out
    code, out, _ = run_plan(
        capsys, "--repo", str(repo), "--base", "main", "--head", "change", "--format", "json"
    )
    plan = json.loads(out)
    [approval] = plan["approvals"]
    assert approval["address"] == "settings"
    assert [(a["user"], a["role"]) for a in approval["approvers"]] == [("ian", "it")]


def test_the_machines_behind_a_pool_are_a_change(tmp_path: Path, capsys) -> None:
    repo = _repo(
        tmp_path,
        {
            "pools/onprem.yaml": (
                "    capacity: 64\n",
                "    capacity: 64\n    nodes: {count: 8, gpus: 8}\n",
            )
        },
    )
    base, head = _revisions(repo, capsys)
    assert base != head
    code, out, _ = run_plan(capsys, "--repo", str(repo), "--base", "main", "--head", "change")
    assert code == 2, out
    assert '~ pool "onprem-k8s"' in out
    assert "+ nodes = [{count: 8, gpus: 8}]" in out
    assert "Plan: 0 to add, 1 to change, 0 to remove." in out
