"""The index's resolved copies of the tree (GroupInfo.outer, budgeted, sized_by_task) say what
the groups say: the engine's checks read them instead of looking each level up, so a copy that
drifted would change decisions without any rule changing."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from kliqued.engine import EstateIndex, State, run_pass
from klique_util.units import SECOND_MS

from .helpers import START
from .org_worlds import org_estates
from tests.harness.examples import examples


@settings(
    max_examples=examples(80),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(org_estates())
def test_resolved_levels_match_the_groups(estate):
    index = EstateIndex.build(estate)
    groups = index.groups
    for gi in groups.values():
        assert gi.outer == tuple((x, groups[x].reservation, groups[x].limit) for x in gi.levels[1:])
        budgeted = [(x, groups[x].budget) for x in gi.levels if groups[x].budget is not None]
        assert [(x, b) for x, b, _ in gi.budgeted] == budgeted
        assert all(wm == b.low_watermark_s * SECOND_MS for _, b, wm in gi.budgeted)
        cr = index.resources
        assert gi.sized_by_task == tuple(
            n for n in gi.resources if not cr[n].strict and cr[n].fixed_size is None
        )


@settings(
    max_examples=examples(20),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(org_estates())
def test_what_a_pass_looked_up_of_the_budgets_does_not_outlive_it(estate):
    index = EstateIndex.build(estate)
    state = State(index, START)
    for i, name in enumerate(sorted(index.resources)):
        group = index.resources[name].group
        state.submit(f"t{i}", name, sorted(index.users[group])[0], None, None, at=START)
    run_pass(index, state, START)
    assert state.pass_budget_left is None
