"""The scaling decision (workers/autoscaler/decide.py): a pure function, tested by examples
and by properties over random observations."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from workers.autoscaler.decide import (
    Launch,
    NodeView,
    Observation,
    ScalePolicy,
    Terminate,
    decide,
    track_idle,
)
from tests.harness.examples import examples

POL = ScalePolicy(max_milli=4000, idle_timeout_s=60, spot_first=True, node_gpus=1)


def node(id, gpus=1, used=0, idle_since=None, up=True, spot=True, launched_at=0.0, gone=False):
    return NodeView(
        id, gpus, spot, launched_at, up=up, gone=gone, used_milli=used, idle_since=idle_since
    )


def launches(actions):
    return [a for a in actions if isinstance(a, Launch)]


def terminations(actions):
    return [a for a in actions if isinstance(a, Terminate)]


def test_nothing_waits_nothing_happens():
    assert decide(Observation(100, POL)) == []


def test_waiting_work_launches_spot_first_within_max():
    acts = decide(Observation(100, POL, waiting=(1000, 1000)))
    assert launches(acts) == [Launch(1, True), Launch(1, True)]
    # six waiting, max 4 GPUs: four nodes, the rest waits
    acts = decide(Observation(100, POL, waiting=(1000,) * 6))
    assert sum(a.gpus for a in launches(acts)) == 4


def test_fallback_to_on_demand_while_spot_is_unavailable():
    obs = Observation(100, POL, waiting=(1000,), spot_unavailable_until=400)
    assert launches(decide(obs)) == [Launch(1, False)]
    obs = Observation(401, POL, waiting=(1000,), spot_unavailable_until=400)
    assert launches(decide(obs)) == [Launch(1, True)]
    no_spot = ScalePolicy(4000, 60, spot_first=False)
    assert launches(decide(Observation(0, no_spot, waiting=(1000,)))) == [Launch(1, False)]


def test_existing_and_starting_nodes_take_work_first():
    # a starting node (not up yet) counts as room: no second launch for the same task
    assert (
        decide(Observation(100, POL, (node("a", up=False, launched_at=99),), waiting=(1000,))) == []
    )
    # fractions pack: 0.5 + 0.5 into one free GPU; a third half needs a node
    acts = decide(Observation(100, POL, (node("a"),), waiting=(500, 500, 500)))
    assert launches(acts) == [Launch(1, True)]


def test_big_task_gets_a_node_of_its_size_and_waits_beyond_max():
    pol = ScalePolicy(4000, 60, node_gpus=1)
    assert launches(decide(Observation(0, pol, waiting=(3000,)))) == [Launch(3, True)]
    assert launches(decide(Observation(0, pol, (node("a", 2, used=2000),), waiting=(3000,)))) == []


def test_idle_release_after_the_timeout_only():
    n = node("a", idle_since=100)
    assert decide(Observation(159, POL, (n,))) == []
    assert terminations(decide(Observation(160, POL, (n,))))[0].node == "a"
    # busy nodes and nodes that get waiting work are kept
    assert decide(Observation(1000, POL, (node("a", used=1000),))) == []
    acts = decide(Observation(1000, POL, (n,), waiting=(1000,)))
    assert acts == []


def test_stuck_and_gone_nodes_are_released():
    pol = ScalePolicy(4000, 60, launch_timeout_s=30)
    acts = decide(
        Observation(
            100, pol, (node("a", up=False, launched_at=60), node("b", gone=True)), waiting=(1000,)
        )
    )
    assert {t.node for t in terminations(acts)} == {"a", "b"}
    assert launches(acts) == [Launch(1, True)]  # the work still needs a node


def test_track_idle_keeps_the_first_idle_time():
    s = track_idle({}, {"a": 0, "b": 1000}, 10)
    assert s == {"a": 10}
    assert track_idle(s, {"a": 0}, 20) == {"a": 10}
    assert track_idle(s, {"a": 500}, 30) == {}


# properties ----------------------------------------------------------------------------------
policies = st.builds(
    ScalePolicy,
    max_milli=st.integers(0, 16).map(lambda g: g * 1000),
    idle_timeout_s=st.floats(1, 600),
    spot_first=st.booleans(),
    node_gpus=st.integers(1, 8),
)
milli = st.sampled_from([250, 500, 1000, 2000, 3000, 8000])
nodes_st = st.lists(
    st.builds(
        lambda i, g, frac, idle, up, spot: node(
            f"n{i}", g, int(g * 1000 * frac), None if frac else idle, up, spot, 0.0
        ),
        st.integers(0, 10**6),
        st.integers(1, 8),
        st.sampled_from([0, 0, 0.5, 1]),
        st.floats(0, 1000),
        st.booleans(),
        st.booleans(),
    ),
    max_size=6,
    unique_by=lambda n: n.id,
)


@settings(max_examples=examples(300), deadline=None)
@given(policies, nodes_st, st.lists(milli, max_size=12), st.floats(0, 2000), st.floats(-1, 3000))
def test_properties(pol, nodes, waiting, now, spot_until):
    obs = Observation(now, pol, tuple(nodes), tuple(waiting), spot_until)
    acts = decide(obs)
    dropped = {t.node for t in terminations(acts) if "idle" not in t.reason}
    live = sum(n.gpus for n in nodes if n.id not in dropped)  # gone or stuck: terminated first
    new = launches(acts)
    # never above max (what exists already may be, if max was lowered: then no launch)
    if new:
        assert live + sum(a.gpus for a in new) <= pol.max_gpus
    # spot first, on-demand only while spot is unavailable or not wanted
    for a in new:
        assert a.spot == (pol.spot_first and now >= spot_until)
    # a release only for an idle, empty, up node after the whole timeout
    byid = {n.id: n for n in nodes}
    for t in terminations(acts):
        n = byid[t.node]
        assert (
            n.gone
            or not n.up
            or (
                n.used_milli == 0
                and n.idle_since is not None
                and now - n.idle_since >= pol.idle_timeout_s
            )
        )
    # no launch and release of the same capacity for nothing: launches only with waiting work
    if not waiting:
        assert not new
    # no flapping: after the launches happened (starting nodes), nothing more is launched
    after = tuple(n for n in nodes if n.id not in {t.node for t in terminations(acts)}) + tuple(
        node(f"new{i}", a.gpus, up=False, launched_at=now, spot=a.spot) for i, a in enumerate(new)
    )
    again = decide(Observation(now, pol, after, tuple(waiting), spot_until))
    released_gpus = sum(byid[t.node].gpus for t in terminations(acts))
    if not released_gpus:
        assert launches(again) == []
    assert terminations(again) == []
