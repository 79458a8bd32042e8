"""Hierarchies where the engine and the reference once disagreed, kept as fixed cases.

Each case is a small estate (compiled by the real compiler) and a timeline in the format of
tests/engine/org_worlds.py, run through the differential driver of test_org_differential.py:
every pass must decide what the reference decides, and nothing may be left for the rules to
do between passes.
"""

from __future__ import annotations

from typing import Any

from .org_worlds import compile_doc, time_limit
from .test_org_differential import drive


def _pool(name: str, capacity: int) -> dict[str, Any]:
    return {"name": name, "kind": "baremetal", "capacity": capacity, "gpu_type": "h100"}


def test_a_lend_that_takes_an_envelope_past_its_reservation_lets_the_repeat_reclaim():
    """engine.md: lending can make a borrower whose work a reclaim takes back, and the repeat
    at one moment does that now. Here y1's lend takes department d to 2 > its reservation 1,
    so x1 (d's work on p1) becomes eligible for w1, which is within reservation only through
    its envelope e (e: 0 + 1 <= 1): the same pass must preempt x1 and place w1."""
    estate = compile_doc({
        "pools": [_pool("p0", 1), _pool("p1", 1)],
        "profiles": [{"name": "rx", "pools": ["p1"], "policies": ["x"], "gpus": 1},
                     {"name": "rw", "pools": ["p1"], "policies": ["w"], "gpus": 1},
                     {"name": "ry", "pools": ["p0"], "policies": ["y"], "gpus": 1}],
        "policies": [{"name": "d", "group": "d", "reservation": 1, "limit": 2},
                     {"name": "x", "group": "x", "reservation": 0, "limit": 2},
                     {"name": "y", "group": "y", "reservation": 0, "limit": 2},
                     {"name": "e", "group": "e", "reservation": 1, "limit": 1},
                     {"name": "w", "group": "w", "reservation": 0, "limit": 1}],
        "groups": [{"name": "d"}, {"name": "x", "users": ["u0"], "parent": "d"},
                   {"name": "y", "users": ["u0"], "parent": "d"},
                   {"name": "e"}, {"name": "w", "users": ["u0"], "parent": "e"}]})
    assert estate is not None
    # compute resources by name: w/rw (0), x/rx (1), y/ry (2)
    with time_limit(30):
        drive(estate, [(0, [(True, 1, None, 0, 3)]),
                       (1, [(True, 0, None, 0, 3), (True, 2, None, 0, 3)])])


def test_a_best_effort_queue_held_only_by_its_users_limit_does_not_stall_the_pass():
    """organisation.md, User limit: a held task is passed over as if not in the queue. Here
    b is u's second task (u at its limit of 1) and the only one queued; when c ends and room
    frees on p, the pass must return with b still queued (the engine looped: the queue was
    parked as waiting for room, and the room it gained woke it again, forever)."""
    estate = compile_doc({
        "pools": [_pool("p", 3)],
        "profiles": [{"name": "one", "pools": ["p"], "policies": ["t"], "gpus": 1,
                      "queueing": "best_effort"}],
        "policies": [{"name": "t", "group": "t", "reservation": 0, "limit": 2,
                      "user_limit": 1}],
        "groups": [{"name": "t", "users": ["u0", "u1"]}]})
    assert estate is not None
    # t0 (u0) placed, t1 (u0) held by u0's limit, t2 (u1) placed; then t2 ends
    with time_limit(30):
        drive(estate, [(0, [(True, 0, None, 0, 3), (True, 0, None, 0, 3),
                            (True, 0, None, 1, 3)]),
                       (1, [(False, 2, None, 0, 3)])])
