"""The suite's hand-out to xdist's workers (tests/harness/scheduling.py)."""

from __future__ import annotations

from pathlib import Path

from tests.harness.scheduling import (
    UNKNOWN_TEST_S,
    check_shared,
    indexes_of,
    load_durations,
    longest_first,
    record,
    scope_of,
)


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


def test_the_longest_scopes_go_out_first_whatever_their_number_of_tests() -> None:
    """xdist's own order (most tests first) handed the Ansible rollout (8 tests, minutes)
    out last; by recorded seconds it goes first, and a scope never recorded counts
    UNKNOWN_TEST_S a test."""
    units = {"many.py": 300, "rollout.py": 8, "slurm": 14, "new.py": 40, "quick.py": 2}
    known = {"many.py": 20.0, "rollout.py": 250.0, "slurm": 37.0, "quick.py": 0.5}
    assert longest_first(units, known) == ["rollout.py", "new.py", "slurm", "many.py", "quick.py"]
    assert 40 * UNKNOWN_TEST_S > 37.0  # the premise of "new.py" before "slurm"
    # nothing recorded: the most tests first, ties in collection order
    assert longest_first({"a": 2, "b": 5, "c": 2}, {}) == ["b", "a", "c"]


def test_recorded_seconds_merge_into_the_file_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "durations.json"
    assert load_durations(path) == {}  # absent: the order falls back to counts
    record({"a.py": 1.04, "slurm": 30.0}, path)
    record({"a.py": 2.0, "b.py": 0.5}, path)  # a run of one folder updates its scopes
    assert load_durations(path) == {"slurm": 30.0, "a.py": 2.0, "b.py": 0.5}
    assert list(load_durations(path)) == ["slurm", "a.py", "b.py"]  # longest first
    path.write_text("not json")
    assert load_durations(path) == {}
