"""Table tests for the engine's rules (engine.md), called directly rather than through whole
passes: the reclaim's victim choice, the budget start check, and rules.py's phase caps,
feasibility checks (in the order reasons name them) and order key."""

from __future__ import annotations

import pytest

from compiler.compiled import CBudget
from kliqued.engine.budget import Meter, start_ok
from kliqued.engine.reasons import waiting_reasons
from kliqued.engine.reclaim import choose_victims
from kliqued.engine.rules import first_failing, headroom, order_key, phase_cap
from tests.harness.typed import present

from .helpers import HOUR, MIN, START, Engine, build_estate, g

# --------------------------------------------------------------------------- victim choice


def borrowed_pool(
    placements: list[tuple[str, str, float]], reservations: dict[str, float], capacity: float = 8
) -> Engine:
    """One pool; a group ``w`` (waiting) and the borrowers in ``reservations``. Tasks are
    placed in the order given (the last is the newest), each ``(id, group, gpus)``."""
    groups = {"w": 0.0, **reservations}
    policies = [{"name": n, "reservation": r, "limit": capacity} for n, r in groups.items()]
    profiles = [
        {
            "name": f"r-{n}",
            "pools": ["p"],
            "policies": [n],
            "from_task": (0.5, capacity),
            "queueing": "best_effort",
        }
        for n in groups
    ]
    e = Engine(build_estate([{"name": "p", "capacity": capacity}], profiles, policies))
    for i, (tid, grp, gpus) in enumerate(placements):
        e.submit(tid, f"{grp}/r-{grp}", gpus)
        e.run(START + i)  # one placement per moment: the order of placement is the order given
        assert e.where(tid) == "p", f"{tid} was not placed"
    return e


def victims(e: Engine, need: float, waiting: str = "w") -> list[str] | None:
    # ``need`` more milli-GPUs free on "p": a task of that much more than the pool's room.
    size = g(need) + e.state.free["p"]
    chosen = choose_victims(e.index, e.state, "p", e.index.groups[waiting], size, waiting)
    return None if chosen is None else [t.id for t in chosen]


@pytest.mark.parametrize(
    "placements, reservations, need, expected",
    [
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
        (
            [("a1", "a", 1), ("a2", "a", 1), ("a3", "a", 1), ("b1", "b", 1)],
            {"a": 2, "b": 0},
            3,
            None,
        ),
        (
            [("a1", "a", 1), ("a2", "a", 1), ("a3", "a", 1), ("b1", "b", 2)],
            {"a": 2, "b": 0},
            3,
            ["b1", "a3"],
        ),
        # sparing, last chosen to first: the small newest victim is not needed once the big one is
        ([("a1", "a", 2), ("a2", "a", 0.5)], {"a": 0}, 2, ["a1"]),
        ([("a1", "a", 1), ("a2", "a", 2), ("a3", "a", 0.5)], {"a": 0}, 2, ["a2"]),
        # sparing goes from the last chosen back: of 1+1+2 chosen for 3, the first 1 is spared
        ([("a1", "a", 2), ("a2", "a", 1), ("a3", "a", 1)], {"a": 0}, 3, ["a1", "a3"]),
        # the waiting group's own work is never a victim
        ([("w1", "w", 2), ("a1", "a", 1)], {"a": 0}, 2, None),
        # nothing borrowed in the pool: it cannot be freed
        ([("a1", "a", 2)], {"a": 2}, 1, None),
    ],
)
def test_choose_victims(placements, reservations, need, expected) -> None:
    e = borrowed_pool(placements, reservations)
    got = victims(e, need)
    if expected is None:
        assert got is None
    else:
        assert sorted(present(got)) == sorted(expected)


def test_reclaim_passes_over_a_pool_that_cannot_be_freed() -> None:
    """The waiting task's first pool holds only work within reservation; the second pool has a
    borrower: the reclaim takes it there and places the task on the second pool."""
    pools = [{"name": "p1", "capacity": 2}, {"name": "p2", "capacity": 2}]
    policies = [
        {"name": "w", "reservation": 2, "limit": 4},
        {"name": "b", "reservation": 2, "limit": 4},
        {"name": "a", "reservation": 0, "limit": 4},
    ]
    profiles = [
        {"name": f"r{n}", "pools": ["p1", "p2"], "policies": [n], "gpus": 2}
        for n in ("w", "b", "a")
    ]
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
BUDGET = CBudget(hours_milli=1000, period="day", low_watermark_s=LOW_WATERMARK_S, alert_at_milli=[])
UNITS = 1000 * HOUR  # one budget hour in charge units (weight milli x ms)


def meter(rate_milli: int, weighted_tasks: int, spent_units: int) -> Meter:
    """A meter at START that has spent ``spent_units`` today, with that rate now."""
    m = Meter(START)
    m.days[START // (24 * HOUR)] = spent_units
    m.rate, m.weighted_tasks = rate_milli, weighted_tasks
    return m


@pytest.mark.parametrize(
    "rate, tasks, spent, weight, ok",
    [
        # remaining / (rate + w) >= low watermark: 0.5 h left, rate 1 + w 1 -> 0.25 h = exactly
        # the 15 min watermark: starts
        (1000, 1, UNITS // 2, 1000, True),
        # one unit less left: the check fails
        (1000, 1, UNITS // 2 + 1, 1000, False),
        # the one-task exception: nothing weighted placed, any budget left lets one start
        (0, 0, UNITS - 1, 1000, True),
        (0, 0, UNITS, 1000, False),  # ... but not with nothing left
        # weight-0 tasks placed do not end the exception
        (0, 0, UNITS - 1, 5000, True),
        # a heavier task needs more left: 0.5 h at rate 1 + w 2 -> 10 min < 15 min
        (1000, 1, UNITS // 2, 2000, False),
    ],
)
def test_start_check(rate, tasks, spent, weight, ok) -> None:
    assert start_ok(meter(rate, tasks, spent), BUDGET, weight, START, True) is ok


def test_weight_zero_never_waits_for_budget() -> None:
    """A budget used up stops weighted work; weight-0 work of the same group still starts."""
    pools = [{"name": "p", "capacity": 4}]
    policies = [
        {"name": "a", "reservation": 4, "limit": 4, "budget": {"hours": 0.1, "period": "day"}}
    ]
    profiles = [
        {"name": "free", "pools": ["p"], "policies": ["a"], "gpus": 1, "weight": 0},
        {"name": "paid", "pools": ["p"], "policies": ["a"], "gpus": 1, "weight": 1},
    ]
    e = Engine(build_estate(pools, profiles, policies))
    e.submit("paid1", "a/paid")
    e.run(START)
    e.advance(START + 7 * MIN)  # 0.1 h = 6 min: used up, phase 0 preempted it
    assert e.where("paid1") == "queued"
    e.submit("free1", "a/free")
    e.submit("paid2", "a/paid")
    e.run(START + 8 * MIN)
    assert e.where("free1") == "p" and e.where("paid2") == "queued"


# --------------------------------------------------------------------------- rules.py checks


def one_group(
    capacity: float, reservation: float, limit: float, gpus: float, budget: dict | None = None
) -> Engine:
    """One pool of ``capacity``; group ``a`` (``reservation``/``limit``) with a best_effort
    profile ``r`` of ``gpus`` per task, weight 1."""
    policy: dict = {"name": "a", "reservation": reservation, "limit": limit}
    if budget is not None:
        policy["budget"] = budget
    return Engine(
        build_estate(
            [{"name": "p", "capacity": capacity}],
            [
                {
                    "name": "r",
                    "pools": ["p"],
                    "policies": ["a"],
                    "gpus": gpus,
                    "queueing": "best_effort",
                    "weight": 1,
                }
            ],
            [policy],
        )
    )


@pytest.mark.parametrize(
    "reservation, limit, lend, cap",
    [
        (2, 4, False, 2000),  # phases 1 and 2: within the reservation
        (2, 4, True, 4000),  # phase 3: up to the limit
        (4, 2, False, 2000),  # a reservation above the limit is capped by the limit
        (0, 4, False, 0),
    ],
)
def test_phase_cap_and_headroom(reservation, limit, lend, cap) -> None:
    e = one_group(8, reservation, limit, 1)
    gi, cr = e.index.groups["a"], e.index.resources["a/r"]
    assert phase_cap(gi, lend) == cap
    assert headroom(e.index, e.state, cr, lend) == cap  # nothing used yet
    e.submit("t1", "a/r")
    e.run(START)
    if e.where("t1") == "p":
        assert headroom(e.index, e.state, cr, lend) == cap - 1000


@pytest.mark.parametrize(
    "capacity, limit, budget, size, expected",
    [
        (8, 4, None, 1, None),  # everything passes
        (8, 4, None, 5, "limit"),  # above the limit
        (2, 4, None, 3, "capacity"),  # within the limit, no pool has room
        (2, 1, None, 3, "limit"),  # limit and capacity fail: limit is named first
        # budget used up (0 h) and no room: the budget is named before capacity
        (2, 4, {"hours": 0, "period": "day"}, 3, "budget"),
        (8, 1, {"hours": 0, "period": "day"}, 3, "limit"),  # ... and after the limit
    ],
)
def test_first_failing_in_reason_order(capacity, limit, budget, size, expected) -> None:
    e = one_group(capacity, 0, limit, 1, budget)
    cr = e.index.resources["a/r"]
    assert first_failing(e.index, e.state, cr, g(size), START) == expected


def test_order_key_orders_pool_position_policy_submission_id() -> None:
    e = one_group(8, 0, 4, 1)
    cr = e.index.resources["a/r"]
    e.submit("t2", "a/r")
    e.submit("t1", "a/r")
    t2, t1 = e.state.tasks["t2"], e.state.tasks["t1"]
    assert order_key(cr, 0, t2) < order_key(cr, 0, t1)  # submitted first
    assert order_key(cr, 0, t1) < order_key(cr, 1, t2)  # the pool's execution order first


def test_reason_is_the_first_failing_check() -> None:
    """The reason a waiting task shows comes from the check the pass applies."""
    e = one_group(2, 0, 2, 1)
    for i in range(4):
        e.submit(f"t{i}", "a/r")
    e.run(START)
    cr = e.index.resources["a/r"]
    reasons = waiting_reasons(e.index, e.state, START)
    assert set(reasons) == {"t2", "t3"}
    for r in reasons.values():
        assert r.kind == first_failing(e.index, e.state, cr, 1000, START) == "limit"
