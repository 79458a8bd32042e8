"""The engine's exceptions: one base (EngineError), each still the built-in it was before."""

from __future__ import annotations

import pytest

from kliqued.engine import (
    DuplicateTask,
    EngineError,
    StaleResult,
    SubmissionError,
    TimeWentBackwards,
    UnknownTask,
)
from kliqued.engine.budget import Meter

from .helpers import START, Engine, build_estate


def _engine() -> Engine:
    return Engine(
        build_estate(
            [{"name": "p", "capacity": 8}],
            [{"name": "gpu1", "pools": ["p"], "policies": ["g"]}],
            [{"name": "g", "reservation": 0, "limit": 8}],
        )
    )


def test_a_refused_submission_is_an_engine_error_and_keeps_its_message() -> None:
    e = _engine()
    with pytest.raises(SubmissionError, match="unknown compute resource 'g/nope'") as info:
        e.submit("t", "g/nope")
    assert isinstance(info.value, EngineError) and isinstance(info.value, ValueError)


def test_a_task_id_used_twice_is_a_duplicate_task() -> None:
    e = _engine()
    e.submit("t", "g/gpu1")
    with pytest.raises(DuplicateTask, match="task id 't' is already used") as info:
        e.submit("t", "g/gpu1")
    assert isinstance(info.value, EngineError) and isinstance(info.value, ValueError)
    assert not isinstance(info.value, SubmissionError)  # not the user's fault: a bug


def test_ending_an_unknown_task_is_an_unknown_task() -> None:
    with pytest.raises(UnknownTask) as info:
        _engine().end("ghost")
    assert isinstance(info.value, EngineError) and isinstance(info.value, KeyError)


def test_time_going_backwards_is_refused_by_the_state_the_pass_and_a_meter() -> None:
    e = _engine()
    e.run(START + 1000)
    with pytest.raises(TimeWentBackwards, match="time went backwards"):
        e.run(START)
    with pytest.raises(TimeWentBackwards):
        e.state.submit("t", "g/gpu1", "u", at=START)
    meter = Meter(START + 1000)
    with pytest.raises(TimeWentBackwards):
        meter.settle(START, charging=False)
    assert issubclass(TimeWentBackwards, EngineError) and issubclass(TimeWentBackwards, ValueError)


def test_a_stale_result_is_an_engine_error() -> None:
    e = _engine()
    res = e.run()
    e.submit("t", "g/gpu1")
    with pytest.raises(StaleResult) as info:
        res.waiting_reasons()
    assert isinstance(info.value, EngineError) and isinstance(info.value, RuntimeError)


def _two_teams() -> Engine:
    return Engine(
        build_estate(
            [{"name": "p", "capacity": 8}],
            [{"name": "l40s-1x", "pools": ["p"], "policies": ["llm-research", "vision"]}],
            [
                {"name": "llm-research", "reservation": 0, "limit": 8, "users": ["ana"]},
                {"name": "vision", "reservation": 0, "limit": 8, "users": ["bo"]},
            ],
        )
    )


@pytest.mark.parametrize(
    "given,user,hint",
    [
        ("l40s-1x", "ana", "did you mean llm-research/l40s-1x?"),
        ("llm-reserch/l40s-1x", "ana", "did you mean llm-research/l40s-1x?"),
        ("l40s-1x", "bo", "did you mean vision/l40s-1x?"),
    ],
)
def test_a_resource_without_its_policy_is_refused_with_the_users_own(given, user, hint) -> None:
    """issue 32: ``--resource l40s-1x`` (no policy part) is refused with a suggestion among
    the resources the user may send to, and never names another group's."""
    with pytest.raises(SubmissionError) as info:
        _two_teams().submit("t", given, user=user)
    text = str(info.value)
    assert hint in text and "POLICY/PROFILE" in text
    other = "vision" if user == "ana" else "llm-research"
    assert other not in text
