"""The two set-up commands (issue 10): `make test` installs the system packages its tests use
on the way to pytest, so CI only calls it; `make run` installs the product alone."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.skipif(not shutil.which("make"), reason="make is not installed")


def make_n(*args: str) -> list[str]:
    """What make would run (-n), as if pyproject.toml had changed (-W): the install steps."""
    p = subprocess.run(
        ["make", "-n", "-W", "pyproject.toml", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    return p.stdout.splitlines()


def pytest_line(lines: list[str]) -> int:
    """The index of the line that runs the suite (its variables and flags around it)."""
    found = [i for i, x in enumerate(lines) if ".venv/bin/python -m pytest" in x]
    assert len(found) == 1, lines
    return found[0]


def test_make_run_installs_only_the_product() -> None:
    lines = make_n("run")
    installs = [x for x in lines if "pip install" in x and "--upgrade pip" not in x]
    assert installs == [".venv/bin/pip install --quiet -e ."], lines
    assert "touch .venv/.installed-run" in lines and "touch .venv/.installed" not in lines


def test_make_test_installs_system_packages_then_runs_pytest() -> None:
    lines = make_n("test")
    assert any("-e '.[test,ops]'" in x for x in lines)
    assert lines.index("tests/setup/system-packages.sh") < pytest_line(lines)
    ci = (REPO / ".ci" / "run").read_text()
    assert "apt-get" not in ci and ci.rstrip().endswith("make test")


def test_make_test_type_checks_before_pytest() -> None:
    """mypy, configured in pyproject.toml ([tool.mypy]), fails the build before the tests."""
    lines = make_n("test")
    assert lines.index(".venv/bin/mypy") < pytest_line(lines)


def test_make_test_checks_the_import_contracts_before_pytest() -> None:
    """lint-imports ([tool.importlinter] in pyproject.toml: docs/architecture.md, "Layers")
    fails the build before the tests."""
    lines = make_n("test")
    assert lines.index(".venv/bin/lint-imports") < pytest_line(lines)


def test_system_packages_say_what_will_skip() -> None:
    """Nothing to be found on PATH: it names each missing package and what skips, installs
    nothing (--check), and does not fail the build."""
    p = subprocess.run(
        ["/bin/bash", "tests/setup/system-packages.sh", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/nonexistent"},
    )
    assert p.returncode == 0 and p.stdout == ""
    if "podman" not in p.stderr:
        pytest.skip("podman is found outside PATH here")
    assert "podman: the container executor's real tests" in p.stderr
    assert p.stderr.startswith("system packages: missing")


def test_system_packages_installs_only_what_is_missing(tmp_path) -> None:
    """As root with apt-get: one `apt-get install` of the missing packages, quiet. apt-get is
    a stand-in here that records its arguments (the real one would install Chromium on a
    shared machine); everything else is the script as `make test` runs it."""
    calls = tmp_path / "calls"
    for name, body in (("apt-get", f'echo "$*" >> {calls}'), ("id", "echo 0")):
        (tmp_path / name).write_text(f"#!/bin/sh\n{body}\n")
        (tmp_path / name).chmod(0o755)
    p = subprocess.run(
        ["/bin/bash", "tests/setup/system-packages.sh"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": f"{tmp_path}:/nonexistent"},
    )
    assert p.returncode == 0 and p.stdout == ""
    made = calls.read_text().splitlines()
    assert made[0] == "update -qq"
    args = made[1].split()
    assert args[:4] == ["install", "-y", "-qq", "--no-install-recommends"]
    assert "podman" in args[4:] and "chromium" in args[4:]  # not found on this PATH
    assert p.stderr.startswith("installing from Debian's packages: ")
