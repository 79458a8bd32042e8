"""The four renderings of the test plan, byte for byte.

A rendering is an interface (people read the text, a bot updates the markdown comment, CI
parses the JSON and the annotations), so any change to it must show up in review as a
golden-file diff. ``UPDATE_GOLDEN=1 pytest tests/plan`` rewrites them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .helpers import ESTATES, run_plan, two_commit_repo

GOLDEN = Path(__file__).resolve().parent / "golden"
FORMATS = {"text": "txt", "markdown": "md", "json": "json", "github": "github"}


def normalise(text: str, shas: dict[str, str]) -> str:
    """Commit ids are stable only as long as git's object format is: the goldens name the
    two revisions by role instead."""
    for role, sha in shas.items():
        text = text.replace(sha, f"<{role}-commit>").replace(sha[:7], f"<{role}>")
    return text


PAIRS = {"plan": ("v1", "v2"), "org": ("org1", "org2")}
"""Golden sets: ``plan`` is the flat estate's change; ``org`` gives a team of a department
(an envelope) more GPUs and IT's pool more capacity: the approvals and the envelope table."""


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("pair", list(PAIRS))
def test_golden(tmp_path: Path, capsys, fmt: str, pair: str) -> None:
    v1, v2 = PAIRS[pair]
    repo, base, head = two_commit_repo(tmp_path / "repo", ESTATES / v1, ESTATES / v2)
    code, out, err = run_plan(
        capsys, "--repo", str(repo), "--base", "main", "--head", "change", "--format", fmt
    )
    assert code == 2, err
    assert str(tmp_path) not in out
    got = normalise(out, {"base": base, "head": head})
    path = GOLDEN / f"{pair}.{FORMATS[fmt]}"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(got, encoding="utf-8")
    assert path.exists(), f"{path} is missing: run UPDATE_GOLDEN=1 pytest tests/plan"
    assert got == path.read_text(encoding="utf-8"), (
        f"the {fmt} rendering differs from {path}; if the change is intended, "
        "run UPDATE_GOLDEN=1 pytest tests/plan and review the diff"
    )
