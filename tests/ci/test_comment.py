"""``kliqued ci comment``: one pull-request comment for the plan, updated in place on every
push and split into parts when too long (as Atlantis does), against a local HTTP server
playing the GitHub and GitLab APIs (tests/ci/forge.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kliqued.ci.comment import MARKER, split
from kliqued.cli import main

from .forge import GITHUB_LIMIT, Forge


@pytest.fixture
def github(monkeypatch: pytest.MonkeyPatch):
    with Forge() as f:
        monkeypatch.setenv("GITHUB_API_URL", f.url)
        monkeypatch.setenv("GITHUB_REPOSITORY", "acme/estate")
        monkeypatch.setenv("GITHUB_TOKEN", "ghs_test")
        monkeypatch.delenv("GITHUB_EVENT_PATH", raising=False)
        yield f


def post(tmp_path: Path, text: str, forge: str = "github", *extra: str) -> int:
    plan = tmp_path / "plan.md"
    plan.write_text(text)
    return main(["ci", "comment", forge, "--file", str(plan), "--pr", "7", *extra])


def plan_text(n_changes: int) -> str:
    """A plan comment as kliqued plan writes it: a marker, a summary, folded blocks with
    code (each change a few lines)."""
    body = []
    for i in range(n_changes):
        body += [
            f'!   policy "team-{i:05d}"  (estate/policies.yaml:{i})',
            f"!       limit = {i} -> {i + 1}  (estate/policies.yaml:{i + 3})",
            "",
        ]
    return "\n".join(
        [
            MARKER,
            "### Klique plan",
            "",
            f"**Plan: 0 to add, {n_changes} to change, 0 to remove.**",
            "",
            f"<details><summary>Changes ({n_changes})</summary>",
            "",
            "```diff",
            *body,
            "```",
            "",
            "</details>",
            "",
        ]
    )


def test_one_comment_is_posted_then_updated_in_place(tmp_path, github, capsys) -> None:
    other = github.add("LGTM")
    assert post(tmp_path, plan_text(3)) == 0
    mine = [i for i, b in github.comments.items() if i != other]
    assert len(mine) == 1 and github.comments[mine[0]].startswith(MARKER)
    assert github.auth[-1] == "Bearer ghs_test"
    assert post(tmp_path, plan_text(5)) == 0
    assert set(github.comments) == {other, mine[0]}  # edited, not a second comment
    assert "5 to change" in github.comments[mine[0]]
    assert github.comments[other] == "LGTM"
    assert ("PATCH", f"/repos/acme/estate/issues/comments/{mine[0]}") in github.requests
    assert "1 updated" in capsys.readouterr().err


def test_a_long_plan_is_split_and_shrinks_back(tmp_path, github) -> None:
    text = plan_text(3000)  # ~190,000 characters: over two GitHub comments' worth
    assert len(text) > 2 * GITHUB_LIMIT
    assert post(tmp_path, text) == 0
    parts = [b for _, b in sorted(github.comments.items())]
    assert len(parts) >= 3
    for i, body in enumerate(parts, 1):
        assert len(body) <= GITHUB_LIMIT
        assert body.startswith(MARKER if i == 1 else f"<!-- klique-plan part {i} -->")
        assert f"part {i} of {len(parts)}" in body
        lines = body.splitlines()
        # Every part renders on its own: its code block and its folded section are closed.
        assert sum(1 for x in lines if x.startswith("```")) % 2 == 0, i
        assert body.count("<details>") == body.count("</details>"), i
    joined = "\n".join(parts)
    for n in (0, 1500, 2999):
        assert f'policy "team-{n:05d}"' in joined
    # The next push plans less: part 1 is edited, the others are deleted.
    first = min(github.comments)
    assert post(tmp_path, plan_text(2)) == 0
    assert list(github.comments) == [first]
    assert "2 to change" in github.comments[first]


def test_the_plan_comment_is_found_past_the_first_page(tmp_path, github) -> None:
    for n in range(150):
        github.add(f"comment {n}")
    mine = github.add(plan_text(1))
    assert post(tmp_path, plan_text(4)) == 0
    assert "4 to change" in github.comments[mine]
    assert len(github.comments) == 151


def test_gitlab_notes(tmp_path, monkeypatch, capsys) -> None:
    with Forge() as f:
        monkeypatch.setenv("CI_API_V4_URL", f"{f.url}/api/v4")
        monkeypatch.setenv("CI_PROJECT_ID", "acme/estate")
        monkeypatch.setenv("KLIQUE_BOT_TOKEN", "glpat-test")
        assert post(tmp_path, plan_text(1), "gitlab") == 0
        assert post(tmp_path, plan_text(2), "gitlab") == 0
        assert len(f.comments) == 1 and "2 to change" in next(iter(f.comments.values()))
        assert f.auth[-1] == "glpat-test"


def test_errors_are_one_clear_line(tmp_path, github, monkeypatch, capsys) -> None:
    monkeypatch.delenv("GITHUB_TOKEN")
    assert post(tmp_path, plan_text(1)) == 1
    assert "GITHUB_TOKEN is not set" in capsys.readouterr().err
    monkeypatch.setenv("GITHUB_TOKEN", "x")
    monkeypatch.setenv("GITHUB_REPOSITORY", "acme/nothing")
    assert post(tmp_path, plan_text(1)) == 1
    err = capsys.readouterr().err
    assert "HTTP 404" in err and "/repos/acme/nothing/issues/7/comments" in err
    assert main(["ci", "comment", "github", "--file", str(tmp_path / "none.md")]) == 1
    assert "none.md" in capsys.readouterr().err


def test_split_keeps_every_line_once() -> None:
    text = plan_text(400)
    parts = split(text, 5000)
    assert len(parts) > 3 and all(len(p) <= 5000 for p in parts)
    kept = [line for p in parts for line in p.splitlines() if 'policy "team-' in line]
    assert kept == [line for line in text.splitlines() if 'policy "team-' in line]
