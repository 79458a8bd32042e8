"""``kliqued ci init github|gitlab``: a CI definition ready to commit. The GitHub workflow
passes actionlint (the ``actionlint`` command of the test extra); both parse as YAML and run
the commands of this CLI with flags it accepts."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from kliqued.ci.workflows import GITHUB_PATH, GITLAB_PATH
from kliqued.cli import build_parser, main


def actionlint() -> str:
    found = shutil.which("actionlint", path=str(Path(sys.executable).parent)) \
        or shutil.which("actionlint")
    if found is None:  # pragma: no cover - the test extra installs it
        pytest.fail("actionlint is not installed: pip install -e '.[test]'")
    return found


def kliqued_lines(script: str) -> list[list[str]]:
    """The ``kliqued`` command lines of a shell script (continuations joined)."""
    joined = script.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line.startswith("kliqued "):
            line = line.split("||")[0].split("#")[0]
            out.append(shlex.split(line.replace('"${live[@]}"', "").replace("$live", "")))
    return out


def test_github_workflow_passes_actionlint(tmp_path, capsys) -> None:
    assert main(["ci", "init", "github", "--repo", str(tmp_path)]) == 0
    path = tmp_path / GITHUB_PATH
    done = subprocess.run([actionlint(), "-no-color", str(path)], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    # Written once; a second init keeps the file unless --force.
    assert main(["ci", "init", "github", "--repo", str(tmp_path)]) == 1
    assert "exists; --force replaces it" in capsys.readouterr().err
    assert main(["ci", "init", "github", "--repo", str(tmp_path), "--force",
                 "--estate-path", "clusters/estate", "--since", "28d"]) == 0
    text = path.read_text()
    assert '"clusters/estate/**"' in text and '--since "28d"' in text
    assert subprocess.run([actionlint(), str(path)], capture_output=True).returncode == 0


def test_the_workflow_validates_plans_with_the_what_if_comments_and_fails_on_1(tmp_path) -> None:
    main(["ci", "init", "github", "--repo", str(tmp_path)])
    wf = YAML(typ="safe").load((tmp_path / GITHUB_PATH).read_text())
    job = wf["jobs"]["plan"]
    assert job["env"]["KLIQUE_TOKEN"] == "${{ secrets.KLIQUE_PLANNER_TOKEN }}"
    script = "\n".join(s.get("run", "") for s in job["steps"])
    commands = kliqued_lines(script)
    assert [c[1] for c in commands] == ["validate", "plan", "ci"]
    assert "--what-if-from" in script and "--against" in script
    parser = build_parser()
    for argv in commands:  # every flag the workflow uses exists
        parser.parse_args(argv[1:])
    last = job["steps"][-1]
    assert "steps.plan.outputs.exit_code == '1'" in last["if"]
    assert "${{" not in last["run"]  # expressions reach scripts through env only
    assert "steps.validate.outcome == 'failure'" in last["if"]


def test_gitlab_job(tmp_path) -> None:
    assert main(["ci", "init", "gitlab", "--repo", str(tmp_path)]) == 0
    ci = YAML(typ="safe").load((tmp_path / GITLAB_PATH).read_text())
    job = ci["klique-plan"]
    script = "\n".join(job["script"])
    commands = kliqued_lines(script)
    assert [c[1] for c in commands] == ["validate", "plan", "ci"]
    parser = build_parser()
    for argv in commands:
        parser.parse_args(argv[1:])
    assert job["rules"][0]["if"] == '$CI_PIPELINE_SOURCE == "merge_request_event"'
