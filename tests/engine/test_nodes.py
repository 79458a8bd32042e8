"""Node shapes in the engine (issue 15): placement on machines, the reason when the GPUs are
free but not on one machine, and an estate change that reshapes the machines."""

from __future__ import annotations

from compiler.compiled import CNodes

from kliqued.engine.reasons import waiting_reason

from .helpers import Engine, build_estate, g


def shaped(nodes: list[tuple[int, float]], capacity: float = 16):
    est = build_estate(
        [{"name": "p", "capacity": capacity}],
        [
            {"name": "five", "gpus": 5, "pools": ["p"], "policies": ["a"]},
            {"name": "gang", "gpus": 8, "pools": ["p"], "policies": ["a"]},
        ],
        [{"name": "a", "reservation": 0, "limit": 64}],
    )
    pools = [
        p.model_copy(update={"nodes": [CNodes(count=c, gpus_milli=g(x)) for c, x in nodes]})
        for p in est.pools
    ]
    profiles = [
        pr.model_copy(update={"nodes": 2}) if pr.name == "gang" else pr for pr in est.profiles
    ]
    return est.model_copy(update={"pools": pools, "profiles": profiles}).with_revision()


def test_free_gpus_on_no_single_machine_wait_with_the_machines_named() -> None:
    e = Engine(shaped([(2, 8)]))
    for i in range(3):
        e.submit(f"s{i}", "a/five")
    e.run()
    assert [e.where(f"s{i}") for i in range(3)] == ["p", "p", "queued"]
    assert e.state.free["p"] == g(6)  # 6 GPUs free, 3 on each machine
    r = waiting_reason(e.index, e.state, "s2", e.now)
    assert r is not None and r.kind == "capacity"
    assert r.text == "no machine with 5 GPUs free in pools p (most free on one machine: 3 in p)"


def test_a_gang_takes_its_share_on_distinct_machines_or_waits() -> None:
    e = Engine(shaped([(2, 8)]))
    e.submit("s0", "a/five")
    e.run()
    e.submit("g0", "a/gang")  # 4 GPUs on each of two machines; one machine has 3 free
    e.run()
    assert e.where("g0") == "queued"
    r = waiting_reason(e.index, e.state, "g0", e.now)
    assert r is not None and r.text == (
        "no 2 machines with 4 GPUs free each in pools p (most free on one machine: 8 in p)"
    )
    e.end("s0")
    e.submit("g1", "a/gang")
    e.run()
    assert e.where("g0") == "p" and e.where("g1") == "p"
    assert sorted(i for i, _ in e.state.tasks["g0"].alloc) == [0, 1]
    assert e.state.node_free["p"] == [0, 0]


def test_machines_reshaped_by_the_estate_preempt_nothing_and_make_new_work_wait() -> None:
    e = Engine(shaped([(2, 8)]))
    e.submit("s0", "a/five")
    e.submit("s1", "a/five")
    e.run()
    e.set_estate(shaped([(1, 8), (2, 4)]))  # the 8-GPU machine is now two of 4
    e.submit("s2", "a/five")
    e.run()
    assert e.where("s0") == "p" and e.where("s1") == "p"  # still placed
    assert e.where("s2") == "queued"
    # s0 went back on the 8-GPU machine; s1 (5) fits no 4-GPU machine and holds the
    # roomiest one, below zero
    assert e.state.node_free["p"] == [g(3), g(-1), g(4)]
    e.end("s0")
    e.run()
    assert e.where("s2") == "p"


def test_a_gang_waiting_for_a_pool_with_no_worker_goes_when_the_pool_comes_back() -> None:
    """A gang waits on its pool itself (not on room watchers), so a pool that takes work
    again must wake it (found by the gang workers' tests, branch gang)."""
    e = Engine(shaped([(2, 8)]))
    e.state.set_pool_live("p", False, e.now)
    e.submit("g0", "a/gang")
    e.run()
    assert e.where("g0") == "queued"
    e.now += 1000
    e.state.set_pool_live("p", True, e.now)
    e.run()
    assert e.where("g0") == "p"
