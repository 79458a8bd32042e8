"""The read API the daemon and the simulator use instead of the engine's internals
(issue 11, item 3): what each returns, and that callers cannot edit the state through it."""

from __future__ import annotations

from kliqued.engine.state import State

from .helpers import START, Engine, build_estate


def two_groups() -> Engine:
    """Pools p1, p2 (4 GPUs each); group ``a`` reserves 1 GPU, ``w`` nothing; 1-GPU tasks."""
    pools = [{"name": "p1", "capacity": 4}, {"name": "p2", "capacity": 4}]
    policies = [
        {"name": "a", "reservation": 1, "limit": 8},
        {"name": "w", "reservation": 0, "limit": 8},
    ]
    profiles = [
        {"name": f"r{n}", "pools": ["p1", "p2"], "policies": [n], "gpus": 1} for n in ("a", "w")
    ]
    return Engine(build_estate(pools, profiles, policies))


def test_borrowed_by_pool_counts_the_newest_placements() -> None:
    """a holds 6 GPUs with 1 reserved: the first four went to p1, the next two to p2, and
    the 5 borrowed are the newest (a2..a6), the ones a reclaim takes first."""
    e = two_groups()
    for i in range(1, 7):
        e.submit(f"a{i}", "a/ra")
        e.run(START + i)
    assert [e.where(f"a{i}") for i in range(1, 7)] == ["p1"] * 4 + ["p2"] * 2
    # a1 (oldest, on p1) is the reserved one: 3 borrowed on p1, 2 on p2
    assert e.state.borrowed_by_pool() == {"p1": 3000, "p2": 2000}


def test_placed_views_are_copies() -> None:
    e = two_groups()
    e.submit("a1", "a/ra")
    e.submit("w1", "w/rw")
    e.run(START)
    assert sorted(t.id for t in e.state.placed_on("p1")) == ["a1", "w1"]
    assert [t.id for t in e.state.placed_of("a")] == ["a1"]
    e.state.placed_of("a").clear()
    e.state.placed_on("p1").clear()
    assert [t.id for t in e.state.placed_of("a")] == ["a1"]
    assert e.state.placed_on("p2") == [] and e.state.placed_of("nobody") == []


def removed_resource_cancels() -> Engine:
    """``w1`` queued on a full pool, then its compute resource is removed: bind cancels it."""
    e = two_groups()
    for i in range(8):
        e.submit(f"a{i}", "a/ra")
    e.submit("w1", "w/rw")
    e.run(START)
    assert e.where("w1") == "queued"
    pools = [{"name": "p1", "capacity": 4}, {"name": "p2", "capacity": 4}]
    e.set_estate(
        build_estate(
            pools,
            [{"name": "ra", "pools": ["p1", "p2"], "policies": ["a"], "gpus": 1}],
            [{"name": "a", "reservation": 1, "limit": 8}],
        )
    )
    e.state.bind(e.index, START + 1)
    return e


def test_take_cancellations_hands_them_over_once() -> None:
    e = removed_resource_cancels()
    assert [c.task for c in e.state.take_cancellations()] == ["w1"]
    assert e.state.take_cancellations() == []


def test_forget_drops_a_cancellation_not_yet_reported() -> None:
    """The daemon ends and forgets a task before the pass reports its cancellation: the
    pass does not report a cancellation of a task that is gone."""
    e = removed_resource_cancels()
    e.state.end("w1", START + 2, "cancelled")
    e.state.forget("w1")
    res = e.run(START + 3)
    assert [d for d in res.decisions if getattr(d, "task", None) == "w1"] == []


def test_wait_for_starts_once_per_pool() -> None:
    e = two_groups()
    st = State(e.index, START)
    assert st.wait_for_starts("p1") is True  # every pool counted starts by itself
    assert st.wait_for_starts("p1") is False  # already waiting
    assert st.wait_for_starts("p2") is True
    daemon = State(e.index, START, self_starting=set())
    assert daemon.wait_for_starts("p1") is False  # the daemon waits for every start
