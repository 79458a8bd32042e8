"""The suite's hand-out to xdist's workers (tests/harness/scheduling.py)."""

from __future__ import annotations

from tests.harness.scheduling import check_shared, indexes_of, scope_of


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


def test_items_that_share_a_node_id_are_each_sent() -> None:
    """schemathesis's operations of one test share its node id under pytest 9.2: each one
    must run (xdist's scope scheduler sent only the first)."""
    collection = ["a.py::t", "f.py::fuzz", "f.py::fuzz", "f.py::other", "f.py::fuzz"]
    assert indexes_of(collection, {"f.py::fuzz", "f.py::other"}) == [1, 2, 3, 4]
    assert indexes_of(collection, {"a.py::t"}) == [0]
