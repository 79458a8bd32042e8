"""Engine unit tests on hand-built compiled estates (no compiler involved)."""

from __future__ import annotations

import pytest

from kliqued.engine import EstateIndex, StaleResult, State, run_pass
from klique_util.units import DAY_MS
from kliqued.engine.periods import format_minute, next_period_start, period_start
from tests.harness.typed import present

from .helpers import HOUR, MIN, START, Engine, build_estate


def test_periods_follow_the_utc_calendar() -> None:
    t = START + 3 * DAY_MS + 5 * HOUR  # Thursday 2026-01-08 05:00
    assert period_start("day", t) == START + 3 * DAY_MS
    assert period_start("week", t) == START  # Monday 2026-01-05
    assert format_minute(period_start("month", t)) == "2026-01-01T00:00Z"
    assert format_minute(next_period_start("month", t)) == "2026-02-01T00:00Z"
    assert format_minute(next_period_start("week", t)) == "2026-01-12T00:00Z"
    dec = 1_795_046_400_000  # 2026-11-18
    assert format_minute(next_period_start("month", dec)) == "2026-12-01T00:00Z"


def _one(budget=None, capacity=8, limit=8, reservation=0, weight=1):
    return build_estate(
        [{"name": "p", "capacity": capacity}],
        [{"name": "gpu1", "pools": ["p"], "policies": ["g"], "weight": weight}],
        [
            {
                "name": "g",
                "reservation": reservation,
                "limit": limit,
                **({"budget": budget} if budget else {}),
            }
        ],
    )


def test_budget_charge_is_exact_over_a_month() -> None:
    e = Engine(_one({"hours": 1000, "period": "month"}))
    e.submit("t", "g/gpu1")
    e.run()
    e.advance(START + 20 * DAY_MS + 7)
    status = present(present(e.last).budget("g"))
    assert status.used_units == 1000 * (20 * DAY_MS + 7)
    assert status.burn_rate_milli == 1000
    assert status.runout_at is None  # 1000 h lasts past the month's end


def test_runout_is_exact_and_next_pass_asks_for_it() -> None:
    e = Engine(_one({"hours": 1, "period": "day"}, weight=3))
    e.submit("t", "g/gpu1")
    res = e.run()
    assert res.next_pass_at == START + 20 * MIN
    assert res.budget("g").runout_at == START + 20 * MIN
    res = e.run(START + 20 * MIN)
    assert [(p.task, p.kind) for p in res.preemptions] == [("t", "budget")]
    r = res.waiting_reason("t")
    assert (r.kind, r.text) == ("budget", "budget used up: resets 2026-01-06T00:00Z")
    assert res.next_pass_at == START + DAY_MS


def test_start_check_reason_text() -> None:
    e2 = Engine(_one({"hours": 0.5, "period": "day"}, weight=1))
    e2.submit("a", "g/gpu1")
    e2.submit("b", "g/gpu1")
    e2.submit("c", "g/gpu1")
    res = e2.run()
    assert [p.task for p in res.placements] == ["a", "b"]
    r = res.waiting_reason("c")
    assert (r.kind, r.text) == ("budget", "budget start check: 0.5 h left at 3 h/h")


def test_limit_and_capacity_reason_texts() -> None:
    e = Engine(_one(limit=2, capacity=8))
    for i in range(4):
        e.submit(f"t{i}", "g/gpu1")
    res = e.run()
    assert res.waiting_reason("t2").text == "group at limit (2/2 GPUs)"
    assert res.waiting_reason("t3").text == "behind 1 task in g/gpu1"
    e = Engine(_one(limit=8, capacity=1))
    e.submit("a", "g/gpu1")
    e.submit("b", "g/gpu1")
    assert e.run().waiting_reason("b").text == "no room in pools p"


def test_nothing_new_is_a_no_op_and_results_go_stale() -> None:
    e = Engine(_one())
    e.submit("a", "g/gpu1")
    first = e.run()
    assert first.repeats >= 1
    again = e.run(START + 1000)
    assert again.repeats == 0 and not again.decisions
    e.submit("b", "g/gpu1")
    with pytest.raises(StaleResult):
        again.waiting_reasons()


def test_lowered_capacity_preempts_nothing_and_removed_resource_cancels_queue() -> None:
    e = Engine(_one(capacity=4))
    for i in range(5):
        e.submit(f"t{i}", "g/gpu1")
    e.run()
    e.set_estate(_one(capacity=2))
    res = e.run(START + HOUR)
    assert not res.preemptions and e.state.pool_used["p"] == 4000
    e.end("t0")
    res = e.run(START + 2 * HOUR)
    assert not res.placements and res.waiting_reason("t4").kind == "capacity"
    gone = build_estate(
        [{"name": "p", "capacity": 2}],
        [{"name": "other", "pools": ["p"], "policies": ["g"]}],
        [{"name": "g", "reservation": 0, "limit": 8}],
    )
    e.set_estate(gone)
    res = e.run(START + 3 * HOUR)
    assert [c.task for c in res.cancellations] == ["t4"]
    assert e.state.tasks["t1"].state == "placed" and e.state.tasks["t1"].orphan


def test_time_never_goes_backwards() -> None:
    e = Engine(_one())
    e.run(START + 1000)
    with pytest.raises(ValueError):
        e.run(START)


def test_queues_parked_on_several_pools_all_wake_when_those_pools_free_together() -> None:
    """Regression: a queue parked on two pools that free up at the same moment used to wake
    only one of them, so other work that fit stayed queued until the next event."""

    est = build_estate(
        [{"name": "A", "capacity": 2}, {"name": "B", "capacity": 1}],
        [
            {"name": "r", "gpus": 1, "pools": ["A", "B"], "policies": ["g1"]},
            {"name": "s", "gpus": 1, "pools": ["A"], "policies": ["g2"]},
            {"name": "t", "gpus": 1, "pools": ["A", "B"], "policies": ["g3"]},
        ],
        [
            {"name": "g1", "reservation": 0, "limit": 5},
            {"name": "g2", "reservation": 0, "limit": 5},
            {"name": "g3", "reservation": 0, "limit": 5},
        ],
    )
    idx = EstateIndex.build(est)
    st = State(idx, START)
    for i in range(3):
        st.submit(f"z{i}", "g3/t", "u", None, None, at=START)
    run_pass(idx, st, START)
    st.submit("x", "g1/r", "u", None, None, at=START + MIN)
    st.submit("y", "g2/s", "u", None, None, at=START + MIN)
    run_pass(idx, st, START + MIN)
    for i in range(3):
        st.end(f"z{i}", START + 2 * MIN)
    run_pass(idx, st, START + 2 * MIN)
    assert st.tasks["x"].state == "placed" and st.tasks["y"].state == "placed"
    later = run_pass(idx, st, START + 3 * MIN)
    assert later.placements == []
