"""The kliqued commands as a user runs them: a real process, its output and exit code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BROKEN = REPO / "tests" / "compiler" / "cases"


def kliqued(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kliqued.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_validate_example_estate_is_clean() -> None:
    r = kliqued("validate", "--strict")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 errors, 0 warnings" in r.stdout and "valid" in r.stdout


def test_validate_broken_estate_prints_every_error_with_position() -> None:
    r = kliqued("validate", str(BROKEN / "references.yaml"))
    assert r.returncode == 1
    lines = [x for x in r.stdout.splitlines() if "error[" in x]
    assert len(lines) == 8
    assert all(x.split(": ", 1)[0].count(":") == 2 for x in lines)
    assert "Traceback" not in r.stdout + r.stderr


def test_validate_json_and_github_formats() -> None:
    r = kliqued("validate", str(BROKEN / "unknown-field.yaml"), "--format", "json")
    data = json.loads(r.stdout)
    assert r.returncode == 1 and data["errors"] == 1
    assert data["diagnostics"][0]["code"] == "unknown-field"
    assert data["diagnostics"][0]["line"] == 4
    r = kliqued("validate", str(BROKEN / "unknown-field.yaml"), "--format", "github")
    assert r.stdout.startswith("::error file=") and ",line=4," in r.stdout


def test_strict_fails_on_warnings() -> None:
    case = str(BROKEN / "warnings.yaml")
    assert kliqued("validate", case).returncode == 0
    assert kliqued("validate", "--strict", case).returncode == 1


def test_compile_writes_canonical_json_atomically(tmp_path: Path) -> None:
    out = tmp_path / "compiled.json"
    r = kliqued("compile", "estate", "-o", str(out))
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["revision"].startswith("sha256:") and data["compute_resources"]


def test_compile_writes_nothing_for_an_invalid_estate(tmp_path: Path) -> None:
    out = tmp_path / "compiled.json"
    out.write_text("previous")
    r = kliqued("compile", str(BROKEN / "references.yaml"), "-o", str(out))
    assert r.returncode == 1 and "nothing written" in r.stderr
    assert out.read_text() == "previous"
    assert [p.name for p in tmp_path.iterdir()] == ["compiled.json"]


def test_missing_estate_path_is_a_clear_error() -> None:
    r = kliqued("validate", "no/such/dir")
    assert r.returncode == 1 and "no such file or directory" in r.stdout
    assert "Traceback" not in r.stdout + r.stderr


def test_compile_summary() -> None:
    r = kliqued("compile", "--summary")
    assert r.returncode == 0 and "compute resources" in r.stdout and "unreserved" in r.stdout


@pytest.mark.parametrize(
    "command",
    [
        "validate",
        "compile",
        "schema",
        "plan",
        "simulate",
        "whoami",
        "resources",
        "events",
        "cancel",
        "status",
    ],
)
def test_every_command_has_help_with_an_example(command: str) -> None:
    r = kliqued(command, "--help")
    if r.returncode != 0 and "invalid choice" in r.stderr:
        pytest.fail(f"kliqued {command} does not exist")
    assert r.returncode == 0 and "examples:" in r.stdout and f"kliqued {command}" in r.stdout


def test_validate_a_file_cut_off_mid_write_reports_it_and_never_crashes(tmp_path: Path) -> None:
    """Issue 9, finding 8: ``KeyError: 'llm-research'`` from a policy file cut off inside
    its first policy."""
    import shutil

    estate = tmp_path / "estate"
    shutil.copytree(REPO / "estate", estate)
    policy = estate / "policies" / "ai-lab.yaml"
    data = policy.read_bytes()
    policy.write_bytes(data[: data.index(b"    description: Foundation") + 6])
    r = kliqued("validate", str(estate))
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and "KeyError" not in r.stderr
    assert f"{policy}:10:7: error[yaml-syntax]" in r.stdout, r.stdout
    assert r.stdout.rstrip().endswith("1 error, 0 warnings")


def test_compile_summary_counts_a_departments_reservation_once() -> None:
    """Issue 12: an envelope's reservation is made of its teams' reservations plus its
    shared part; adding it on top of theirs told IT that GPUs were reserved that are not.
    The example estate: teams 87 GPUs, digital shares 2, hpc-centre and commercial 0."""
    r = kliqued("compile", "--summary")
    assert r.returncode == 0, r.stderr
    assert "reserved 89 of 240 GPUs; 151 unreserved for lending" in r.stdout, r.stdout
    assert (
        "digital                  reservation    8  limit   20  3000 h/month  "
        "(envelope: 2 shared)" in r.stdout
    ), r.stdout
