"""The real engine against the reference engine on hierarchical estates (organisation.md).

As tests/engine/test_differential.py, on estates with business units, departments and teams
(envelopes with reservations, limits and budgets; user limits; project priority) compiled by
the real compiler: every pass of the engine must decide exactly what the reference decides
from the same snapshot, with the same preemption texts, and just before each pass the engine
asks for, the reference must find nothing to do (no missed wake-up: an envelope's usage fell,
a department's budget ran out, a protection ended). Some timelines move a team to another
parent or change the lending settings mid-run: the envelopes' counts must follow, and a
changed protect_for applies at once. lending.md's shares, lost work and protection reasons
are compared as in test_differential.compare_lending.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings

from kliqued.engine import EstateIndex, Preemption, State, run_pass

from . import reference as ref
from .helpers import MIN, START
from .org_worlds import apply_actions, org_worlds, time_limit
from .test_differential import compare_lending, real_decisions
from tests.harness.examples import examples


def compare_pass(index: EstateIndex, state: State, now: int):
    rs = ref.snapshot(index, state, now)
    expected = Counter(ref.run_pass(index, rs))
    res = run_pass(index, state, now)
    got = real_decisions(res)
    assert got == expected, (
        f"at +{(now - START) / MIN:g} min the engine decided\n"
        f"  {sorted(got.elements())}\nthe reference\n"
        f"  {sorted(expected.elements())}"
    )
    texts = sorted((d.task, d.text) for d in res.decisions if isinstance(d, Preemption))
    assert texts == sorted(rs.texts), "preemption texts differ"
    after = ref.snapshot(index, state, now)
    compare_lending(index, state, res, after)
    assert ref.run_pass(index, after) == [], "the pass left work the rules would place"
    return res


def assert_quiet(index: EstateIndex, state: State, at: int) -> None:
    rs = ref.snapshot(index, state, at)
    assert ref.run_pass(index, rs) == [], (
        f"at +{(at - START) / MIN:g} min the rules would act but the engine asked for no pass"
    )


def drive(estate, steps, changes=None, checkpoints=()) -> None:
    """Runs the timeline; ``changes`` (step index -> estate) are estate changes made just
    before that step (a team moved to another parent, new lending settings);
    ``checkpoints`` as org_worlds.apply_actions takes them."""
    index = EstateIndex.build(estate)
    state = State(index, START)
    now = START
    n = 0
    res = compare_pass(index, state, now)
    for i, (dt, actions) in enumerate(steps):
        target = now + dt * MIN
        while res.next_pass_at is not None and res.next_pass_at < target:
            if res.next_pass_at - 1 > now:
                assert_quiet(index, state, res.next_pass_at - 1)
            now = res.next_pass_at
            res = compare_pass(index, state, now)
        if target > now and (res.next_pass_at is None or target < res.next_pass_at):
            assert_quiet(index, state, target)
        now = target
        if changes and i in changes:
            index = EstateIndex.build(changes[i])  # the pass binds it
        n = apply_actions(index, state, actions, now, n, checkpoints)
        res = compare_pass(index, state, now)


@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)
@given(org_worlds())
def test_engine_decides_as_the_reference_on_hierarchies(world):
    with time_limit(30):
        drive(*world)


@settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)
@given(org_worlds(borrowing=True))
def test_engine_rebalances_as_the_reference_on_hierarchies(world):
    """lending.md on hierarchies where teams borrow: fair order and phase 4 (rebalances
    between teams of one department and across departments)."""
    with time_limit(30):
        drive(*world)
