"""Hierarchies where the engine and the reference once disagreed, kept as fixed cases.

Each case is a small estate (compiled by the real compiler) and a timeline in the format of
tests/engine/org_worlds.py, run through the differential driver of test_org_differential.py:
every pass must decide what the reference decides, and nothing may be left for the rules to
do between passes.
"""

from __future__ import annotations

from typing import Any

from kliqued.engine import EstateIndex, Preemption, State, run_pass

from .helpers import START
from .org_worlds import apply_actions, compile_doc, time_limit
from .test_org_differential import drive
from .test_org_properties import Tree, overrun, simulate


def _pool(name: str, capacity: int) -> dict[str, Any]:
    return {"name": name, "kind": "baremetal", "capacity": capacity, "gpu_type": "h100"}


def test_a_lend_that_takes_an_envelope_past_its_reservation_lets_the_repeat_reclaim():
    """engine.md: lending can make a borrower whose work a reclaim takes back, and the repeat
    at one moment does that now. Here y1's lend takes department d to 2 > its reservation 1,
    so x1 (d's work on p1) becomes eligible for w1, which is within reservation only through
    its envelope e (e: 0 + 1 <= 1): the same pass must preempt x1 and place w1."""
    estate = compile_doc(
        {
            "pools": [_pool("p0", 1), _pool("p1", 1)],
            "profiles": [
                {"name": "rx", "pools": ["p1"], "policies": ["x"], "gpus": 1},
                {"name": "rw", "pools": ["p1"], "policies": ["w"], "gpus": 1},
                {"name": "ry", "pools": ["p0"], "policies": ["y"], "gpus": 1},
            ],
            "policies": [
                {"name": "d", "group": "d", "reservation": 1, "limit": 2},
                {"name": "x", "group": "x", "reservation": 0, "limit": 2},
                {"name": "y", "group": "y", "reservation": 0, "limit": 2},
                {"name": "e", "group": "e", "reservation": 1, "limit": 1},
                {"name": "w", "group": "w", "reservation": 0, "limit": 1},
            ],
            "groups": [
                {"name": "d"},
                {"name": "x", "users": ["u0"], "parent": "d"},
                {"name": "y", "users": ["u0"], "parent": "d"},
                {"name": "e"},
                {"name": "w", "users": ["u0"], "parent": "e"},
            ],
        }
    )
    assert estate is not None
    # compute resources by name: w/rw (0), x/rx (1), y/ry (2)
    with time_limit(30):
        drive(
            estate,
            [(0, [(True, 1, None, 0, 3)]), (1, [(True, 0, None, 0, 3), (True, 2, None, 0, 3)])],
        )


def test_a_best_effort_queue_held_only_by_its_users_limit_does_not_stall_the_pass():
    """organisation.md, User limit: a held task is passed over as if not in the queue. Here
    b is u's second task (u at its limit of 1) and the only one queued; when c ends and room
    frees on p, the pass must return with b still queued (the engine looped: the queue was
    parked as waiting for room, and the room it gained woke it again, forever)."""
    estate = compile_doc(
        {
            "pools": [_pool("p", 3)],
            "profiles": [
                {
                    "name": "one",
                    "pools": ["p"],
                    "policies": ["t"],
                    "gpus": 1,
                    "queueing": "best_effort",
                }
            ],
            "policies": [
                {"name": "t", "group": "t", "reservation": 0, "limit": 2, "user_limit": 1}
            ],
            "groups": [{"name": "t", "users": ["u0", "u1"]}],
        }
    )
    assert estate is not None
    # t0 (u0) placed, t1 (u0) held by u0's limit, t2 (u1) placed; then t2 ends
    with time_limit(30):
        drive(
            estate,
            [
                (0, [(True, 0, None, 0, 3), (True, 0, None, 0, 3), (True, 0, None, 1, 3)]),
                (1, [(False, 2, None, 0, 3)]),
            ],
        )


def test_an_envelope_budget_runs_out_within_one_millisecond_of_its_rate():
    """engine.md, Time budgets: the pass runs at the exact run-out, in whole milliseconds. d0's
    3 h at rate 7 (weights 2+2+2+1) run out 1,542,857.14 ms after the start, so the pass at
    1,542,858 ms passes the budget by 6,000 units (less than one millisecond at rate 7,000)
    and preempts all four; the overrun stays after they stop. The property test once measured
    it against what was still placed (nothing) and called it an overrun."""
    estate = compile_doc(
        {
            "pools": [_pool("p0", 3), _pool("p1", 2)],
            "profiles": [
                {
                    "name": "r0",
                    "pools": ["p0"],
                    "policies": ["t2"],
                    "time_weight": 2,
                    "gpus": {"from_task": "gpus", "default": 1, "max": 2},
                },
                {
                    "name": "r1",
                    "pools": ["p0", "p1"],
                    "policies": ["t2"],
                    "time_weight": 1,
                    "gpus": 0.5,
                },
            ],
            "policies": [
                {"name": "t2", "group": "t2", "reservation": 0, "limit": 4},
                {
                    "name": "d0",
                    "group": "d0",
                    "reservation": 0,
                    "limit": 4,
                    "budget": {"hours": 3, "period": "day"},
                },
            ],
            "groups": [
                {"name": "d0"},
                {"name": "d1", "parent": "d0"},
                {"name": "t2", "users": ["u0", "u1"], "parent": "d1"},
            ],
        }
    )
    assert estate is not None
    index = EstateIndex.build(estate)
    state = State(index, START)
    n = apply_actions(index, state, [(True, 0, None, 0, 0)] * 3 + [(True, 1, None, 0, 0)], START, 0)
    res = run_pass(index, state, START)
    assert len(state.placed_tasks()) == n == 4
    assert res.next_pass_at == START + 1_542_858
    res = run_pass(index, state, res.next_pass_at)
    assert sorted(d.task for d in res.decisions if isinstance(d, Preemption)) == [
        "t0",
        "t1",
        "t2",
        "t3",
    ]
    tree = Tree(index)
    assert overrun(tree, state, "d0", START + 1_542_858) == 6_000
    with time_limit(30):
        simulate(
            estate,
            [
                (0, [(True, 0, None, 0, 0)] * 3 + [(True, 1, None, 0, 0)]),
                (26, [(False, 0, None, 0, 0)]),
            ],
        )


def test_a_team_budget_overrun_after_phase_0_is_measured_at_the_rate_that_ran():
    """The same for a team (hypothesis seed 2 of the raised runs): t4 runs seven weight-1
    tasks, its run-out pass is 5,000 units late in the last millisecond (below 7,000) and
    preempts all seven; the check after that pass must not count the now empty team's rate."""
    estate = compile_doc(
        {
            "pools": [_pool("p0", 4), _pool("p1", 2), _pool("p2", 2)],
            "profiles": [
                {"name": "r0", "pools": ["p0"], "policies": ["t4"], "time_weight": 1, "gpus": 0.5},
                {"name": "r1", "pools": ["p0"], "policies": ["t4"], "time_weight": 0, "gpus": 0.5},
                {"name": "r2", "pools": ["p0"], "policies": ["t2"], "time_weight": 0, "gpus": 0.5},
            ],
            "policies": [
                {
                    "name": "t2",
                    "group": "t2",
                    "reservation": 0,
                    "limit": 2,
                    "budget": {"hours": 0.1, "period": "day"},
                },
                {
                    "name": "t4",
                    "group": "t4",
                    "reservation": 0,
                    "limit": 4,
                    "budget": {"hours": 3, "period": "day"},
                },
                {
                    "name": "t5",
                    "group": "t5",
                    "reservation": 0,
                    "limit": 2,
                    "budget": {"hours": 0.1, "period": "day"},
                },
            ],
            "groups": [
                {"name": "d0"},
                {"name": "d1", "parent": "d0"},
                {"name": "t2", "users": ["u0", "u1"], "parent": "d1"},
                {"name": "d3", "parent": "d0"},
                {"name": "t4", "users": ["u0", "u1"], "parent": "d3"},
                {"name": "t5", "users": ["u0", "u1"], "parent": "d3"},
            ],
        }
    )
    assert estate is not None
    with time_limit(30):
        simulate(
            estate,
            [
                (0, [(True, 0, None, 0, 0)] + [(True, 1, None, 0, 0)] * 4),
                (11, [(False, 0, None, 0, 0)] + [(True, 1, None, 0, 0)] * 3),
                (20, [(False, 0, None, 0, 0)]),
            ],
        )


def test_a_department_left_with_no_team_keeps_none_of_the_hours_its_team_took_away():
    """organisation.md, Estate changes: moving a group moves its counts, "the weighted hours it
    spent in the current period", to the new envelope. t5 runs two weight-1 tasks under d4
    for 47 minutes, then moves up to d0, leaving d4 (budget 3 h) with no team below. d4 never held a task, so it keeps no hours: d0 counts t5's hours
    once (through t5) and is not used up, and nothing is preempted. The reference once read
    d4's old envelope meter as the spending of a team and counted t5's hours twice."""
    doc: dict[str, Any] = {
        "pools": [_pool("p0", 2), _pool("p1", 2), _pool("p2", 2)],
        "profiles": [
            {
                "name": "r0",
                "pools": ["p0"],
                "policies": ["t2", "t3", "t5"],
                "time_weight": 1,
                "gpus": {"from_task": "gpus", "default": 1, "max": 2},
            },
            {
                "name": "r1",
                "pools": ["p0"],
                "policies": ["t2"],
                "time_weight": 0,
                "gpus": {"from_task": "gpus", "default": 1, "max": 2},
            },
        ],
        "policies": [
            {
                "name": "t2",
                "group": "t2",
                "reservation": 0,
                "limit": 2,
                "budget": {"hours": 0.1, "period": "day"},
            },
            {
                "name": "t3",
                "group": "t3",
                "reservation": 0,
                "limit": 2,
                "budget": {"hours": 0.1, "period": "day"},
            },
            {
                "name": "d1",
                "group": "d1",
                "reservation": 0,
                "limit": 2,
                "budget": {"hours": 0.1, "period": "day"},
            },
            {"name": "t5", "group": "t5", "reservation": 0, "limit": 2},
            {
                "name": "d4",
                "group": "d4",
                "reservation": 0,
                "limit": 2,
                "budget": {"hours": 3, "period": "day"},
            },
            {
                "name": "d0",
                "group": "d0",
                "reservation": 0,
                "limit": 2,
                "budget": {"hours": 3, "period": "day"},
            },
        ],
        "groups": [
            {"name": "d0"},
            {"name": "d1", "parent": "d0"},
            {"name": "t2", "users": ["u0", "u1"], "parent": "d1"},
            {"name": "t3", "users": ["u0", "u1"], "parent": "d1"},
            {"name": "d4", "parent": "d0"},
            {"name": "t5", "users": ["u0", "u1"], "parent": "d4"},
        ],
    }
    estate = compile_doc(doc)
    doc["groups"][-1]["parent"] = "d0"
    moved = compile_doc(doc)
    assert estate is not None and moved is not None
    # compute resources by name: t2/r0 (0), t2/r1 (1), t3/r0 (2), t5/r0 (3)
    steps = [
        (0, [(True, 0, None, 0, 0), (True, 3, None, 0, 0), (True, 3, None, 0, 0)]),
        (7, [(False, 0, None, 0, 0)]),
        (20, [(False, 0, None, 0, 0)]),
        (20, [(False, 0, None, 0, 0)]),
    ]
    with time_limit(30):
        drive(estate, steps, {3: moved})
        simulate(estate, steps, {3: moved})


def test_a_placement_that_holds_a_users_head_lets_the_next_task_of_a_strict_queue_go():
    """organisation.md, User limit: a task its user's limit holds keeps its place but is
    passed over, even in a strict queue. Here ``any``'s head t4 (u0, 2 GPUs) waits for the
    team's limit (room 1.5); then t7 (u0, 0.5 on ``half``) is placed, which puts t4 past
    u0's limit of 2, so ``any``'s head as the rules see it is t6 (0.5), which fits: the same
    pass places it. The engine left it queued with the reason "waits for the next pass"
    (test_org_properties found it): only best_effort queues were looked at again after a
    placement of their group."""
    estate = compile_doc(
        {
            "pools": [_pool("p", 4)],
            "profiles": [
                {"name": "half", "pools": ["p"], "policies": ["t"], "gpus": 0.5},
                {
                    "name": "any",
                    "pools": ["p"],
                    "policies": ["t"],
                    "gpus": {"from_task": "gpus", "default": 1, "max": 2},
                },
            ],
            "policies": [
                {"name": "t", "group": "t", "reservation": 0, "limit": 2, "user_limit": 2}
            ],
            "groups": [{"name": "t", "users": ["u0", "u1"]}],
        }
    )
    assert estate is not None
    index = EstateIndex.build(estate)
    state = State(index, START)
    state.submit("t0", "t/half", "u1", None, None, at=START)
    assert [p.task for p in run_pass(index, state, START + 1).placements] == ["t0"]
    state.submit("t4", "t/any", "u0", None, 2000, at=START + 2)
    state.submit("t6", "t/any", "u0", None, 500, at=START + 3)
    state.submit("t7", "t/half", "u0", None, None, at=START + 4)
    res = run_pass(index, state, START + 5)
    assert sorted(p.task for p in res.placements) == ["t6", "t7"]
    reasons = res.waiting_reasons()
    assert set(reasons) == {"t4"} and reasons["t4"].kind == "user_limit", reasons
