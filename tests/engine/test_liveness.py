"""Pools with no live worker and placed tasks no worker starts (issue 10): the engine's side.

The caller says which pools take placements (``State.set_pool_live``) and which placed
tasks a worker took (``State.set_started``); the engine never reads a clock, so the start
timeout is a time trigger like a budget's run-out.
"""

from __future__ import annotations

from kliqued.engine import UNSTARTED, State
from tests.harness.typed import present

from .helpers import MIN, START, Engine, build_estate


def _two_pools(timeout_s: int = 300):
    return build_estate(
        [
            {"name": "a", "capacity": 2, "start_timeout_s": timeout_s},
            {"name": "b", "capacity": 2, "start_timeout_s": timeout_s},
        ],
        [{"name": "gpu1", "pools": ["a", "b"], "policies": ["g"]}],
        [{"name": "g", "reservation": 0, "limit": 8}],
    )


def _engine(estate) -> Engine:
    e = Engine(estate)
    e.state.self_starting = set()  # as the daemon: every start is reported
    return e


def test_a_pool_without_a_live_worker_takes_no_placement_and_the_reason_names_it() -> None:
    e = _engine(_two_pools())
    e.state.set_pool_live("a", False, START)
    for i in range(3):
        e.submit(f"t{i}", "g/gpu1")
    e.run()
    assert [e.where(f"t{i}") for i in range(3)] == ["b", "b", "queued"]
    r = present(present(e.last).waiting_reason("t2"))
    assert (r.kind, r.text) == ("capacity", "no room in pools b; no live worker in a")
    e.state.set_pool_live("b", False, START + 1)
    e.run(START + 1)
    assert present(present(e.last).waiting_reason("t2")).text == "no live worker in a, b"


def test_a_pool_whose_worker_comes_back_takes_the_waiting_work_at_the_next_pass() -> None:
    e = _engine(_two_pools())
    e.state.set_pool_live("a", False, START)
    e.state.set_pool_live("b", False, START)
    e.submit("t", "g/gpu1")
    e.run()
    assert e.where("t") == "queued"
    e.state.set_pool_live("b", True, START + MIN)
    res = e.run(START + MIN)
    assert [(p.task, p.pool) for p in res.placements] == [("t", "b")]


def test_unstarted_work_is_requeued_at_its_start_timeout_keeping_its_place() -> None:
    e = _engine(_two_pools(timeout_s=300))
    e.submit("x", "g/gpu1")
    e.submit("y", "g/gpu1")
    e.run()
    e.state.set_started("x", True, START + MIN)
    e.now = START + 2 * MIN
    e.state.set_pool_live("a", False, e.now)  # its worker stops
    e.submit("z", "g/gpu1")
    res = e.run()
    assert e.where("z") == "b"
    assert res.next_pass_at == START + 5 * MIN  # the engine asks for a pass at y's deadline
    e.now = START + 3 * MIN
    e.state.set_pool_live("b", False, e.now)
    e.submit("w", "g/gpu1")
    res = e.advance(START + 5 * MIN)[-1]
    pre = res.preemptions
    assert [(p.task, p.pool, p.kind, p.text) for p in pre] == [
        ("y", "a", UNSTARTED, "requeued: not started within 5m on a")
    ]
    assert e.where("x") == "a"  # it started: it stays
    # y keeps its place: ahead of w, which never ran.
    assert [t.id for t in e.state.queue("g/gpu1")] == ["y", "w"]
    assert e.state.tasks["y"].last_preempt_text == "requeued: not started within 5m on a"
    assert present(present(e.last).waiting_reason("y")).text == "no live worker in a, b"


def test_a_task_handed_back_unstarted_gets_a_full_timeout_again() -> None:
    e = _engine(_two_pools(timeout_s=300))
    e.submit("x", "g/gpu1")
    e.run()
    e.state.set_started("x", True, START + MIN)
    e.state.set_started("x", False, START + 4 * MIN)  # the lease never reached its worker
    e.state.set_pool_live("a", False, START + 4 * MIN)
    res = e.advance(START + 8 * MIN)[-1]
    assert not res.preemptions and e.where("x") == "a"
    res = e.run(START + 9 * MIN)
    assert [p.task for p in res.preemptions] == ["x"]


def test_a_restart_gives_unstarted_work_its_timeout_again() -> None:
    e = _engine(_two_pools(timeout_s=300))
    e.submit("x", "g/gpu1")
    e.run()
    e.state.set_pool_live("a", False, START + MIN)
    e.state.restart_start_timers(START + 30 * MIN)  # the daemon was down for half an hour
    res = e.run(START + 30 * MIN)
    assert not res.preemptions and e.where("x") == "a"
    assert res.next_pass_at == START + 35 * MIN


def test_no_timeout_and_self_starting_pools_never_requeue() -> None:
    e = _engine(_two_pools(timeout_s=0))
    e.submit("x", "g/gpu1")
    e.run()
    e.state.set_pool_live("a", False, START)
    res = e.run()
    assert res.next_pass_at is None
    e.run(START + 600 * MIN)
    assert e.where("x") == "a"
    # The default State counts every placement as started (a caller with no workers).
    e2 = Engine(_two_pools(timeout_s=60))
    assert isinstance(e2.state, State) and e2.state.self_starting is None
    e2.submit("x", "g/gpu1")
    assert e2.run().next_pass_at is None
    assert e2.state.tasks["x"].started


def test_a_removed_compute_resource_keeps_its_unstarted_task() -> None:
    e = _engine(_two_pools(timeout_s=60))
    e.submit("x", "g/gpu1")
    e.run()
    e.state.set_pool_live("a", False, START)
    other = build_estate(
        [
            {"name": "a", "capacity": 2, "start_timeout_s": 60},
            {"name": "b", "capacity": 2, "start_timeout_s": 60},
        ],
        [{"name": "cpu", "gpus": 0, "pools": ["a"], "policies": ["g"]}],
        [{"name": "g", "reservation": 0, "limit": 8}],
    )
    e.set_estate(other)
    res = e.run(START + 2 * MIN)
    assert not res.preemptions and e.where("x") == "a"


def test_a_pool_with_a_live_worker_keeps_its_unstarted_work_until_the_worker_goes() -> None:
    """A live worker that has not taken a task yet (the pool declares more GPUs than its
    workers have, docs/decisions.md G6) keeps it: requeueing would only place it there
    again. Once the pool has no live worker, a task past its timeout goes back at once."""
    e = _engine(_two_pools(timeout_s=300))
    e.submit("x", "g/gpu1")
    res = e.run()
    assert res.next_pass_at is None  # nothing is due while a has a live worker
    res = e.run(START + 20 * MIN)
    assert not res.preemptions and e.where("x") == "a"
    e.state.set_pool_live("a", False, START + 21 * MIN)
    res = e.run(START + 21 * MIN)
    assert [(p.task, p.kind) for p in res.preemptions] == [("x", UNSTARTED)]
    assert e.where("x") == "b"  # requeued, and placed where a worker is, in the same pass


def test_an_autoscaled_pool_takes_work_with_no_worker_and_times_out_its_starts() -> None:
    """Its nodes come with the demand placed on it, so it takes placements without a live
    worker; a node that never comes is the start timeout's case: the task goes back and is
    placed where a worker is."""
    e = _engine(
        build_estate(
            [
                {"name": "cloud", "capacity": 4, "autoscale": True, "start_timeout_s": 600},
                {"name": "onprem", "capacity": 1},
            ],
            [{"name": "gpu1", "pools": ["cloud", "onprem"], "policies": ["g"]}],
            [{"name": "g", "reservation": 0, "limit": 8}],
        )
    )
    e.state.set_pool_live("cloud", False, START)
    e.submit("x", "g/gpu1")
    res = e.run()
    assert e.where("x") == "cloud" and "cloud" not in e.state.unavailable
    assert res.next_pass_at == START + 10 * MIN
    res = e.advance(START + 10 * MIN)[-1]
    assert [(p.task, p.kind) for p in res.preemptions] == [("x", UNSTARTED)]
    assert e.where("x") == "cloud"  # first fit again: its first pool still takes work
    e.state.set_started("x", True, START + 11 * MIN)  # a node came and took it
    assert e.run(START + 30 * MIN).preemptions == []


def _cloud_and_onprem():
    return build_estate(
        [
            {"name": "onprem", "capacity": 1},
            {"name": "aws-eu-burst", "capacity": 4, "autoscale": True, "start_timeout_s": 600},
        ],
        [{"name": "gpu1", "pools": ["onprem", "aws-eu-burst"], "policies": ["g"]}],
        [{"name": "g", "reservation": 0, "limit": 8}],
    )


def test_an_autoscaled_pool_with_no_autoscaler_takes_no_work_and_the_reason_says_so() -> None:
    """Issue 25, item 8: an autoscaled pool takes work with no worker only because its
    autoscaler will launch nodes for it; with no autoscaler running nothing would start it,
    and the task would sit there charged until its start timeout."""
    e = _engine(_cloud_and_onprem())
    e.state.set_pool_live("aws-eu-burst", False, START)
    e.state.set_autoscaler_live("aws-eu-burst", False, START)
    e.submit("a", "g/gpu1")
    e.submit("b", "g/gpu1")
    e.run()
    assert [e.where("a"), e.where("b")] == ["onprem", "queued"]
    r = present(present(e.last).waiting_reason("b"))
    assert (r.kind, r.text) == (
        "capacity",
        "no room in pools onprem; no autoscaler running for aws-eu-burst",
    )
    # its autoscaler starts: the pool takes the waiting work at the next pass
    e.state.set_autoscaler_live("aws-eu-burst", True, START + MIN)
    res = e.run(START + MIN)
    assert [(p.task, p.pool) for p in res.placements] == [("b", "aws-eu-burst")]


def test_a_lost_autoscaler_sends_the_unstarted_work_back_at_once_not_at_its_timeout() -> None:
    e = _engine(_cloud_and_onprem())
    e.state.set_pool_live("aws-eu-burst", False, START)
    e.submit("a", "g/gpu1")
    e.submit("b", "g/gpu1")
    e.submit("c", "g/gpu1")
    e.run()
    assert [e.where(t) for t in "abc"] == ["onprem", "aws-eu-burst", "aws-eu-burst"]
    e.state.set_started("c", True, START + MIN)  # a node came and took c
    e.state.set_autoscaler_live("aws-eu-burst", False, START + 2 * MIN)
    res = e.run(START + 2 * MIN)  # long before the 10m start timeout
    assert [(p.task, p.pool, p.kind, p.text) for p in res.preemptions] == [
        ("b", "aws-eu-burst", UNSTARTED, "requeued: no autoscaler running for aws-eu-burst")
    ]
    assert e.where("c") == "aws-eu-burst"  # started: it stays
    assert e.where("b") == "queued" and "aws-eu-burst" in e.state.unavailable


def test_an_autoscaler_back_before_the_pass_keeps_the_unstarted_work_placed() -> None:
    e = _engine(_cloud_and_onprem())
    e.state.set_pool_live("aws-eu-burst", False, START)
    e.submit("a", "g/gpu1")
    e.submit("b", "g/gpu1")
    e.run()
    e.state.set_autoscaler_live("aws-eu-burst", False, START + MIN)
    e.state.set_autoscaler_live("aws-eu-burst", True, START + MIN + 1)
    res = e.run(START + 2 * MIN)
    assert res.preemptions == [] and e.where("b") == "aws-eu-burst"
    res = e.advance(START + 10 * MIN)[-1]  # its start timeout still applies
    assert [(p.task, p.text) for p in res.preemptions] == [
        ("b", "requeued: not started within 10m on aws-eu-burst")
    ]


def test_a_pool_with_a_live_worker_takes_work_whether_or_not_its_autoscaler_runs() -> None:
    e = _engine(_cloud_and_onprem())
    e.state.set_autoscaler_live("aws-eu-burst", False, START)
    e.submit("a", "g/gpu1")
    e.submit("b", "g/gpu1")
    e.run()
    assert e.where("b") == "aws-eu-burst" and "aws-eu-burst" not in e.state.unavailable


def test_a_worker_back_recalls_the_unstarted_work_placed_on_a_later_pool_at_once() -> None:
    """Issue 26, item 5: onprem's worker was lost, its task went to the autoscaled pool (no
    node yet); when the worker comes back the task goes back at once, not at the 10m start
    timeout, and the next pass places it on onprem, first in the profile's order. Started
    work stays where it runs."""
    e = _engine(_cloud_and_onprem())
    e.state.set_pool_live("aws-eu-burst", False, START)
    e.state.set_pool_live("onprem", False, START)  # onprem's worker is lost
    e.submit("a", "g/gpu1")
    e.submit("b", "g/gpu1")
    e.run()
    assert [e.where("a"), e.where("b")] == ["aws-eu-burst", "aws-eu-burst"]
    e.state.set_started("b", True, START + MIN)  # a node came and took b
    e.state.set_pool_live("onprem", True, START + 2 * MIN)  # the worker is back
    res = e.run(START + 2 * MIN)
    assert [(p.task, p.pool, p.kind, p.text) for p in res.preemptions] == [
        ("a", "aws-eu-burst", UNSTARTED, "requeued: onprem has a live worker again")
    ]
    assert [(p.task, p.pool) for p in res.placements] == [("a", "onprem")]
    assert e.where("b") == "aws-eu-burst"
    assert e.state.recalled == {}


def test_a_worker_back_leaves_work_placed_on_an_earlier_pool_of_the_profile() -> None:
    """Only a later pool's work is recalled: work on a pool the profile lists first would
    only be placed there again (a requeue and a ledger interval for nothing)."""
    e = _engine(
        build_estate(
            [
                {"name": "cloud", "capacity": 4, "autoscale": True, "start_timeout_s": 600},
                {"name": "onprem", "capacity": 1},
            ],
            [{"name": "gpu1", "pools": ["cloud", "onprem"], "policies": ["g"]}],
            [{"name": "g", "reservation": 0, "limit": 8}],
        )
    )
    e.state.set_pool_live("cloud", False, START)
    e.state.set_pool_live("onprem", False, START)
    e.submit("x", "g/gpu1")
    e.run()
    assert e.where("x") == "cloud"
    e.state.set_pool_live("onprem", True, START + MIN)
    assert e.run(START + MIN).preemptions == [] and e.where("x") == "cloud"
    res = e.advance(START + 10 * MIN)[-1]  # its start timeout still applies
    assert [(p.task, p.text) for p in res.preemptions] == [
        ("x", "requeued: not started within 10m on cloud")
    ]
