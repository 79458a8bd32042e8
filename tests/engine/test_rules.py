"""Table tests for the two rules with a subtle order (engine.md): the reclaim's victim choice
and the budget start check, called directly rather than through whole passes."""

from __future__ import annotations

import pytest

from compiler.compiled import CBudget
from kliqued.engine.budget import Meter, start_ok
from kliqued.engine.reclaim import choose_victims

from .helpers import HOUR, MIN, START, Engine, build_estate, g

# --------------------------------------------------------------------------- victim choice


def borrowed_pool(placements: list[tuple[str, str, float]], reservations: dict[str, float],
                  capacity: float = 8) -> Engine:
    """One pool; a group ``w`` (waiting) and the borrowers in ``reservations``. Tasks are
    placed in the order given (the last is the newest), each ``(id, group, gpus)``."""
    groups = {"w": 0.0, **reservations}
    policies = [{"name": n, "reservation": r, "limit": capacity} for n, r in groups.items()]
    profiles = [{"name": f"r-{n}", "pools": ["p"], "policies": [n], "from_task": (0.5, capacity),
                 "queueing": "best_effort"} for n in groups]
    e = Engine(build_estate([{"name": "p", "capacity": capacity}], profiles, policies))
    for i, (tid, grp, gpus) in enumerate(placements):
        e.submit(tid, f"{grp}/r-{grp}", gpus)
        e.run(START + i)  # one placement per moment: the order of placement is the order given
        assert e.where(tid) == "p", f"{tid} was not placed"
    return e


def victims(e: Engine, need: float, waiting: str = "w") -> list[str] | None:
    chosen = choose_victims(e.index, e.state, "p", waiting, g(need))
    return None if chosen is None else [t.id for t in chosen]


@pytest.mark.parametrize("placements, reservations, need, expected", [
    # newest placement first, and only as much as needed
    ([("a1", "a", 1), ("a2", "a", 1), ("a3", "a", 1)], {"a": 0}, 2, ["a3", "a2"]),
    # across groups: newest first whatever the group
    ([("a1", "a", 1), ("b1", "b", 1), ("a2", "a", 1)], {"a": 0, "b": 0}, 2, ["a2", "b1"]),
    # a victim whose group would fall below its reservation is skipped
    ([("a1", "a", 1), ("b1", "b", 1), ("a2", "a", 1)], {"a": 1, "b": 0}, 2, ["a2", "b1"]),
    ([("b1", "b", 1), ("a1", "a", 1), ("a2", "a", 1)], {"a": 1, "b": 0}, 2, ["a2", "b1"]),
    # a newest victim bigger than its group's excess is skipped for an older, smaller one
    ([("a1", "a", 1), ("a2", "a", 2)], {"a": 2}, 1, ["a1"]),
    # the floor counts the victims already chosen: a keeps 2 of its 3 GPUs
    ([("a1", "a", 1), ("a2", "a", 1), ("a3", "a", 1), ("b1", "b", 1)], {"a": 2, "b": 0}, 3,
     None),
    ([("a1", "a", 1), ("a2", "a", 1), ("a3", "a", 1), ("b1", "b", 2)], {"a": 2, "b": 0}, 3,
     ["b1", "a3"]),
    # sparing, last chosen to first: the small newest victim is not needed once the big one is
    ([("a1", "a", 2), ("a2", "a", 0.5)], {"a": 0}, 2, ["a1"]),
    ([("a1", "a", 1), ("a2", "a", 2), ("a3", "a", 0.5)], {"a": 0}, 2, ["a2"]),
    # sparing goes from the last chosen back: of 1+1+2 chosen for 3, the first 1 is spared
    ([("a1", "a", 2), ("a2", "a", 1), ("a3", "a", 1)], {"a": 0}, 3, ["a1", "a3"]),
    # the waiting group's own work is never a victim
    ([("w1", "w", 2), ("a1", "a", 1)], {"a": 0}, 2, None),
    # nothing borrowed in the pool: it cannot be freed
    ([("a1", "a", 2)], {"a": 2}, 1, None),
])
def test_choose_victims(placements, reservations, need, expected) -> None:
    e = borrowed_pool(placements, reservations)
    got = victims(e, need)
    if expected is None:
        assert got is None
    else:
        assert sorted(got) == sorted(expected)


def test_reclaim_passes_over_a_pool_that_cannot_be_freed() -> None:
    """The waiting task's first pool holds only work within reservation; the second pool has a
    borrower: the reclaim takes it there and places the task on the second pool."""
    pools = [{"name": "p1", "capacity": 2}, {"name": "p2", "capacity": 2}]
    policies = [{"name": "w", "reservation": 2, "limit": 4},
                {"name": "b", "reservation": 2, "limit": 4},
                {"name": "a", "reservation": 0, "limit": 4}]
    profiles = [{"name": f"r{n}", "pools": ["p1", "p2"], "policies": [n], "gpus": 2}
                for n in ("w", "b", "a")]
    e = Engine(build_estate(pools, profiles, policies))
    e.submit("b1", "b/rb")
    e.run(START)
    e.submit("a1", "a/ra")
    e.run(START + 1)
    assert (e.where("b1"), e.where("a1")) == ("p1", "p2")  # b1 within reservation, a1 lent
    e.submit("w1", "w/rw")
    res = e.run(START + 2)
    assert [(d.task, d.text) for d in res.preemptions] == [("a1", "reclaimed by w")]
    assert e.where("w1") == "p2" and e.where("b1") == "p1"


# --------------------------------------------------------------------------- start check

LOW_WATERMARK_S = 900
BUDGET = CBudget(hours_milli=1000, period="day", low_watermark_s=LOW_WATERMARK_S,
                 alert_at_milli=[])
UNITS = 1000 * HOUR  # one budget hour in charge units (weight milli x ms)


def meter(rate_milli: int, weighted_tasks: int, spent_units: int) -> Meter:
    """A meter at START that has spent ``spent_units`` today, with that rate now."""
    m = Meter(START)
    m.days[START // (24 * HOUR)] = spent_units
    m.rate, m.weighted_tasks = rate_milli, weighted_tasks
    return m


@pytest.mark.parametrize("rate, tasks, spent, weight, ok", [
    # remaining / (rate + w) >= low watermark: 0.5 h left, rate 1 + w 1 -> 0.25 h = exactly
    # the 15 min watermark: starts
    (1000, 1, UNITS // 2, 1000, True),
    # one unit less left: the check fails
    (1000, 1, UNITS // 2 + 1, 1000, False),
    # the one-task exception: nothing weighted placed, any budget left lets one start
    (0, 0, UNITS - 1, 1000, True),
    (0, 0, UNITS, 1000, False),          # ... but not with nothing left
    # weight-0 tasks placed do not end the exception
    (0, 0, UNITS - 1, 5000, True),
    # a heavier task needs more left: 0.5 h at rate 1 + w 2 -> 10 min < 15 min
    (1000, 1, UNITS // 2, 2000, False),
])
def test_start_check(rate, tasks, spent, weight, ok) -> None:
    assert start_ok(meter(rate, tasks, spent), BUDGET, weight, START, True) is ok


def test_weight_zero_never_waits_for_budget() -> None:
    """A budget used up stops weighted work; weight-0 work of the same group still starts."""
    pools = [{"name": "p", "capacity": 4}]
    policies = [{"name": "a", "reservation": 4, "limit": 4,
                 "budget": {"hours": 0.1, "period": "day"}}]
    profiles = [{"name": "free", "pools": ["p"], "policies": ["a"], "gpus": 1, "weight": 0},
                {"name": "paid", "pools": ["p"], "policies": ["a"], "gpus": 1, "weight": 1}]
    e = Engine(build_estate(pools, profiles, policies))
    e.submit("paid1", "a/paid")
    e.run(START)
    e.advance(START + 7 * MIN)  # 0.1 h = 6 min: used up, phase 0 preempted it
    assert e.where("paid1") == "queued"
    e.submit("free1", "a/free")
    e.submit("paid2", "a/paid")
    e.run(START + 8 * MIN)
    assert e.where("free1") == "p" and e.where("paid2") == "queued"
