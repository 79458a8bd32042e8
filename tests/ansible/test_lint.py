"""``ansible-lint --profile production`` on the worker role and playbook: what an operator's
CI runs on roles they adopt (issue 32: it found 66 problems). Its rules: variables of a role
carry the role's prefix (``klique_worker_``), task names start with a capital, a command
says when it changes something, lines stay under 160 columns."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.daemon import ROOT

LINT = shutil.which("ansible-lint") or str(Path(sys.executable).parent / "ansible-lint")


@pytest.mark.skipif(not Path(LINT).exists(), reason="ansible-lint is not installed (.[test])")
def test_the_role_passes_ansible_lint_production(tmp_path: Path) -> None:
    r = subprocess.run(
        [LINT, "--profile", "production", "--offline", "--nocolor", "workers/ansible"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={
            "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
            "HOME": str(tmp_path),  # its caches, not the developer's
            "ANSIBLE_HOME": str(tmp_path / "ansible"),
        },
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "Profile 'production' was required, and it passed" in out, out
