"""``explain_task``'s words: every reason kind the API can answer has a meaning and a way out,
so a kind added to the engine cannot reach an agent unexplained."""

from __future__ import annotations

import pytest

from kliqued.daemon.api.agents.explain import MEANING, explain, explain_kind
from kliqued.daemon.api.openapi import SCHEMAS


def test_every_reason_kind_of_the_api_is_explained() -> None:
    assert set(SCHEMAS["Reason"]["properties"]["kind"]["enum"]) == set(MEANING)
    for kind, (meaning, todo) in MEANING.items():
        assert meaning and todo and explain_kind(kind)["meaning"] == meaning


def test_a_task_s_state_decides_what_is_explained() -> None:
    base = {"id": "t-1", "resource": "a/b", "pool": None, "position": 3}
    waiting = explain(
        {
            **base,
            "state": "queued",
            "waiting_reason": {"kind": "order", "text": "behind 2 tasks in a/b"},
        }
    )
    assert (waiting["kind"], waiting["reason"], waiting["position"]) == (
        "order",
        "behind 2 tasks in a/b",
        3,
    )
    ended = explain(
        {**base, "state": "ended", "waiting_reason": None, "end": {"text": "failed: exit code 3"}}
    )
    assert (ended["kind"], ended["reason"]) == ("ended", "failed: exit code 3")
    running = explain({**base, "state": "running", "waiting_reason": None})
    assert running["kind"] == "running" and running["reason"] is None


def test_an_unknown_kind_names_the_kinds() -> None:
    with pytest.raises(ValueError, match="no reason kind 'luck'; the kinds are order, "):
        explain_kind("luck")
