"""The real engine against the reference engine of tests/engine/reference.py (hypothesis).

On random small estates and timelines, every pass of the real engine must decide exactly what
the reference decides from the same snapshot; and between passes, at the moment just before
the next pass the engine asks for, the reference must find nothing to do (otherwise the
engine missed a wake-up: work that could be placed, or a budget that ran out, was left
until something else happened).
"""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kliqued.engine import EstateIndex, Placement, Preemption, State, run_pass

from . import reference as ref
from .helpers import MIN, START, build_estate
from .test_properties import worlds


def real_decisions(res) -> Counter:
    out: Counter = Counter()
    for d in res.decisions:
        if isinstance(d, Placement):
            out[("place", d.task, d.pool, d.phase)] += 1
        elif isinstance(d, Preemption):
            out[("preempt", d.task, d.kind, d.by)] += 1
    return out


def compare_pass(index: EstateIndex, state: State, now: int):
    """Runs one real pass at ``now`` and checks it against the reference."""
    rs = ref.snapshot(index, state, now)
    expected = Counter(ref.run_pass(index, rs))
    res = run_pass(index, state, now)
    got = real_decisions(res)
    assert got == expected, (f"at +{(now - START) / MIN:g} min the engine decided\n"
                             f"  {sorted(got.elements())}\nthe reference\n"
                             f"  {sorted(expected.elements())}")
    # Nothing placeable is left unplaced, no used-up budget is left running.
    after = ref.snapshot(index, state, now)
    assert ref.run_pass(index, after) == [], "the pass left work the rules would place"
    return res


def assert_quiet(index: EstateIndex, state: State, at: int) -> None:
    """At ``at`` (no pass asked for yet), the rules have nothing to do."""
    rs = ref.snapshot(index, state, at)
    assert ref.run_pass(index, rs) == [], (
        f"at +{(at - START) / MIN:g} min the rules would act but the engine asked for no pass")


def drive(estate, steps) -> None:
    index = EstateIndex.build(estate)
    state = State(index, START)
    crs = sorted(index.resources)
    now = START
    n = 0
    res = compare_pass(index, state, now)
    for dt, actions in steps:
        target = now + dt * MIN
        while res.next_pass_at is not None and res.next_pass_at < target:
            if res.next_pass_at - 1 > now:
                assert_quiet(index, state, res.next_pass_at - 1)
            now = res.next_pass_at
            res = compare_pass(index, state, now)
        if target > now and (res.next_pass_at is None or target < res.next_pass_at):
            assert_quiet(index, state, target)
        now = target
        for submit, k, gpus in actions:
            if submit:
                cr = index.resources[crs[k % len(crs)]]
                g = None if cr.fixed_size is not None else round((gpus or 1) * 1000)
                state.submit(f"t{n}", cr.name, "u", None, g, at=now)
                n += 1
            elif state.tasks:
                tid = sorted(state.tasks)[k % len(state.tasks)]
                state.end(tid, now)
        res = compare_pass(index, state, now)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(worlds())
def test_engine_decides_as_the_reference(world):
    drive(*world)


@st.composite
def contended_worlds(draw):
    """Small pools, every group with a reservation, tasks of mixed sizes: reclaims with
    several victims, sparing and ineligible victims happen often."""
    pools = [{"name": f"p{i}", "capacity": draw(st.integers(2, 5))}
             for i in range(draw(st.integers(1, 2)))]
    policies = [{"name": f"g{i}", "reservation": draw(st.integers(1, 3)),
                 "limit": draw(st.integers(4, 8))} for i in range(draw(st.integers(2, 3)))]
    if draw(st.booleans()):
        policies[0]["budget"] = {"hours": draw(st.sampled_from([0.2, 1])), "period": "day"}
    profiles = []
    for j, pol in enumerate(policies):
        pl = draw(st.permutations([p["name"] for p in pools]))
        profiles.append({"name": f"r{j}", "pools": pl, "policies": [pol["name"]],
                         "from_task": (1, 3),
                         "queueing": draw(st.sampled_from(["strict", "best_effort"]))})
    estate = build_estate(pools, profiles, policies)
    steps = draw(st.lists(st.tuples(
        st.integers(0, 30),
        st.lists(st.tuples(st.integers(0, 4).map(bool), st.integers(0, 999),
                           st.sampled_from([None, 0.5, 1, 1.5, 2, 3])),
                 min_size=1, max_size=6)), min_size=2, max_size=8))
    return estate, steps


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(contended_worlds())
def test_engine_reclaims_as_the_reference(world):
    drive(*world)
