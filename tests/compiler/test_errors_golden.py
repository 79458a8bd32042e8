"""Every error and warning the compiler can give, against golden renderings.

Set UPDATE_GOLDEN=1 to rewrite the golden files after an intended change of wording; the
diff of the golden files is then the review of that change.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from compiler.api import compile_dir
from compiler.diagnostics import render_all

HERE = Path(__file__).parent
CASES = sorted((HERE / "cases").glob("*.yaml"))


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_error_rendering_matches_golden(case: Path, monkeypatch) -> None:
    monkeypatch.chdir(HERE)
    result = compile_dir(f"cases/{case.name}")
    text = render_all(result.diagnostics) + "\n"
    golden = HERE / "golden" / "errors" / f"{case.stem}.txt"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(text, encoding="utf-8")
    assert golden.exists(), f"no golden file {golden}: run with UPDATE_GOLDEN=1"
    assert text == golden.read_text(encoding="utf-8")


def test_every_error_case_reports_a_position() -> None:
    for case in CASES:
        result = compile_dir(case)
        assert result.diagnostics, case
        for d in result.diagnostics:
            assert d.pos is not None and d.pos.line > 0, (case, d.render())


def test_golden_cases_cover_every_code() -> None:
    seen = {d.code for case in CASES for d in compile_dir(case).diagnostics}
    expected = {
        "yaml-syntax",
        "yaml-duplicate-key",
        "yaml-tab",
        "yaml-encoding",
        "unknown-field",
        "invalid-value",
        "missing-field",
        "invalid-name",
        "duplicate-name",
        "unknown-reference",
        "group-cycle",
        "reservation-above-limit",
        "group-multiple-policies",
        "profile-too-large",
        "from-task-max-above-limit",
        "profile-pools",
        "profile-no-pool",
        "reservations-do-not-fit",
        "pool-not-allowed",
        "duplicate-price",
        "missing-price",
        "execution-order-unlisted",
        "execution-order-unused",
        "unused-pool",
        "unused-policy",
        "unused-profile",
        "cloud-capacity",
        # Departments (organisation.md)
        "envelope-reservation-exceeded",
        "limit-above-envelope",
        "user-limit-on-envelope",
        "user-limit-above-limit",
        "profile-above-user-limit",
        "profile-lists-envelope",
        "project-priority-without-projects",
        "admin-without-handle",
    }
    assert expected - seen == set()
