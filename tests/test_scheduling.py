"""The suite's hand-out to xdist's workers (tests/harness/scheduling.py)."""

from __future__ import annotations

from tests.harness.scheduling import check_shared, scope_of


def test_a_file_is_a_scope_and_the_slurm_folder_is_one() -> None:
    assert scope_of("tests/daemon/test_billing.py::test_focus_over_http") == (
        "tests/daemon/test_billing.py"
    )
    assert scope_of("tests/daemon/test_billing.py::test_x[a::b]") == "tests/daemon/test_billing.py"
    assert scope_of("tests/slurm/test_gang_slurm.py::test_gang") == "slurm"
    assert scope_of("tests/slurm/test_local_slurm.py::test_a") == "slurm"
    assert scope_of("tests/workers/test_slurmish.py::test_a") == "tests/workers/test_slurmish.py"


def test_a_service_whose_tests_spread_over_files_is_refused() -> None:
    ok = {
        "slurm": ["tests/slurm/a.py::t", "tests/slurm/b.py::t"],
        "podman": ["tests/workers/test_container.py::a", "tests/workers/test_container.py::b"],
    }
    assert check_shared(ok) == []
    spread = {"podman": ["tests/workers/test_container.py::a", "tests/web/test_x.py::b"]}
    [problem] = check_shared(spread)
    assert "'podman'" in problem and "tests/web/test_x.py" in problem
