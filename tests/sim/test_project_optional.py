"""A task may name no project in the simulator, even when its group lists projects
(organisation.md orders "tasks of no listed project last"); a named project must be listed
(scenarios.md). The daemon's API requires one (tests/sdk/test_options.py)."""

from __future__ import annotations

import pytest

from kliqued.engine import EstateIndex, SubmissionError, check_submission

from tests.engine.helpers import build_estate


def index() -> EstateIndex:
    est = build_estate(
        [{"name": "p", "capacity": 4}],
        [{"name": "r", "pools": ["p"], "policies": ["a"], "gpus": 1}],
        [{"name": "a", "reservation": 1, "limit": 4}],
    )
    groups = [g.model_copy(update={"projects": ["x", "y"]}) for g in est.groups]
    return EstateIndex.build(est.model_copy(update={"groups": groups}).with_revision())


def test_no_project_is_accepted_by_the_engine_and_required_by_the_api() -> None:
    idx = index()
    assert check_submission(idx, "a/r", "u", None, None) == 1000
    assert check_submission(idx, "a/r", "u", "x", None) == 1000
    with pytest.raises(SubmissionError, match="project 'z' is not a project of group 'a'"):
        check_submission(idx, "a/r", "u", "z", None)
    with pytest.raises(SubmissionError, match="project required"):
        check_submission(idx, "a/r", "u", None, None, require_project=True)


@pytest.mark.parametrize(
    "args,field",
    [
        (("a/nope", "u", None, None), "resource"),
        (("a/r", "mallory", None, None), "user"),
        (("a/r", "u", "z", None), "project"),
        (("a/r", "u", None, 2000), "gpus"),  # a fixed-size profile
    ],
)
def test_a_refusal_names_its_field(args: tuple, field: str) -> None:
    """Callers point at the field (a scenario's line, the API's details) without parsing."""
    with pytest.raises(SubmissionError) as err:
        check_submission(index(), *args)
    assert err.value.field == field
