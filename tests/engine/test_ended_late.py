"""A task whose end is heard late (issue 26): ``State.end(task, at, ran_until=...)`` changes
the state at ``at`` (time never goes back for the passes) and takes back, at every level,
the budget and GPU time charged after ``ran_until``, so the meters charge what ran."""

from __future__ import annotations

from .helpers import MIN, START, Engine, build_estate

HOUR = 60 * MIN


def _estate():
    return build_estate(
        [{"name": "a", "capacity": 4}],
        [{"name": "gpu2", "gpus": 2, "weight": 1, "pools": ["a"], "policies": ["g"]}],
        [{"name": "g", "reservation": 4, "limit": 4, "budget": {"hours": 100, "period": "month"}}],
    )


def _used(e: Engine, at: int) -> tuple[int, int]:
    m = e.state.meters["g"]
    return m.used("month", at, True), e.state.gpu_units("g", at)


def test_an_end_heard_late_charges_until_the_end_not_until_the_news() -> None:
    late, ontime = Engine(_estate()), Engine(_estate())
    for e in (late, ontime):
        e.submit("t", "g/gpu2")
        e.run()
    ontime.state.end("t", START + 10 * MIN)
    late.state.end("t", START + 40 * MIN, ran_until=START + 10 * MIN)
    assert late.state.tasks["t"].ended_at == START + 10 * MIN
    assert _used(late, START + 50 * MIN) == _used(ontime, START + 50 * MIN)
    weighted, gpu = _used(late, START + 50 * MIN)
    assert gpu == 2000 * 10 * MIN and weighted == 1000 * 10 * MIN  # weight 1 a task
    # the state moved on at the news: a later pass is fine, an earlier time is refused
    late.run(START + 41 * MIN)


def test_an_end_before_the_placement_or_after_the_news_is_clamped() -> None:
    e = Engine(_estate())
    e.submit("t", "g/gpu2")
    e.run(START + 5 * MIN)
    e.state.end("t", START + 20 * MIN, ran_until=START)  # before its placement
    assert e.state.tasks["t"].ended_at == START + 5 * MIN
    assert _used(e, START + 30 * MIN)[1] == 0
    e.now = START + 30 * MIN
    e.submit("u", "g/gpu2")
    e.run()
    e.state.end("u", START + 40 * MIN, ran_until=START + HOUR)  # after the news
    assert _used(e, START + HOUR)[1] == 2000 * 10 * MIN


def test_no_budget_is_taken_back_for_time_the_engine_was_off() -> None:
    e = Engine(_estate())
    e.submit("t", "g/gpu2")
    e.run()
    e.state.set_enabled(False, START + 10 * MIN)
    e.state.set_enabled(True, START + 20 * MIN)
    e.state.end("t", START + 30 * MIN, ran_until=START + 15 * MIN)
    weighted, gpu = _used(e, START + HOUR)
    assert weighted == 1000 * 10 * MIN  # 0-10 charged; 10-20 off; 20-30 taken back
    assert gpu == 2000 * 15 * MIN
