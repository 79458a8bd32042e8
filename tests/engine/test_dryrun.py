"""Issue 31: a dry run answers what the engine then does (hypothesis).

On the differential tests' random worlds (flat, contended, lending.md's settings, and
hierarchies built by the compiler), at every settled moment of the timeline each compute
resource gets a dry run of a task; then, on a copy of the state, the same task is submitted
and a pass runs at the same moment. The dry run must have said what that pass did: the same
pool and phase and the same victims, or the same waiting reason and place in line. The live
state must be left exactly as it was (its version, its tasks).
"""

from __future__ import annotations

import pytest

import copy

from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from kliqued.engine import EstateIndex, Placement, Preemption, State, SubmissionError, run_pass
from kliqued.engine.dryrun import dry_run, forecast

from .helpers import MIN, START, build_estate
from .org_worlds import apply_actions, org_worlds
from .test_differential import contended_worlds, lending_worlds
from .test_nodes_properties import worlds as node_worlds
from .test_properties import worlds
from tests.harness.examples import examples

SETTINGS = settings(
    max_examples=examples(120),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def check_moment(index: EstateIndex, state: State, now: int, sizes=(None, 1000, 2000)) -> int:
    """Every compute resource, each size its profile takes: dry run, then the real thing on a
    copy. Returns how many answers were compared."""
    compared = 0
    for name in sorted(index.resources):
        cr = index.resources[name]
        users = sorted(index.users.get(cr.group, ()))
        if not users:
            continue
        for gpus in sizes if cr.fixed_size is None else (None,):
            version, ntasks = state.version, len(state.tasks)
            try:
                dry = dry_run(index, state, name, users[0], None, gpus, now)
            except SubmissionError:
                continue
            assert (state.version, len(state.tasks)) == (version, ntasks), "the dry run wrote"
            real = copy.deepcopy(state, {id(index): index})
            real.submit("probe", name, users[0], None, gpus, at=now)
            res = run_pass(index, real, now)
            mine = [
                i
                for i, d in enumerate(res.decisions)
                if isinstance(d, Placement) and d.task == "probe"
            ]
            what = f"{name} gpus={gpus} at +{(now - START) / MIN:g} min: {dry}"
            if mine:
                i = mine[0]
                d = res.decisions[i]
                assert isinstance(d, Placement)
                assert dry.placed, f"placed on {d.pool} ({d.phase}) but dry run said {what}"
                assert (dry.pool, dry.phase) == (d.pool, d.phase), what
                taken = []
                j = i - 1
                while j >= 0:
                    p = res.decisions[j]
                    if not (
                        isinstance(p, Preemption)
                        and p.by == cr.group
                        and p.kind in ("reclaimed", "rebalanced")
                    ):
                        break
                    taken.append(p.task)
                    j -= 1
                assert sorted(v.task for v in dry.victims) == sorted(taken), what
                assert dry.forecast.start_at == now
            else:
                assert not dry.placed, f"dry run said placed, the pass did not: {what}"
                reason = res.waiting_reason("probe")
                assert reason is not None
                assert dry.reason == reason, what
                assert dry.position == real.position("probe"), what
                fc = forecast(index, real, "probe", now)
                assert fc == dry.forecast, what
                if fc.start_at is not None:
                    assert fc.start_at > now
            compared += 1
    return compared


def drive(estate, steps, changes=None, apply=None) -> None:
    index = EstateIndex.build(estate)
    state = State(index, START)
    crs = sorted(index.resources)
    now = START
    n = 0
    res = run_pass(index, state, now)
    for i, (dt, actions) in enumerate(steps):
        target = now + dt * MIN
        while res.next_pass_at is not None and res.next_pass_at < target:
            now = res.next_pass_at
            res = run_pass(index, state, now)
            check_moment(index, state, now)
        now = target
        if changes and i in changes:
            index = EstateIndex.build(changes[i])
        if apply is not None:
            n = apply(index, state, actions, now, n)
        else:
            for submit, k, gpus, *_ in actions:
                if submit:
                    cr = index.resources[crs[k % len(crs)]]
                    g = None if cr.fixed_size is not None else round((gpus or 1) * 1000)
                    try:
                        state.submit(f"t{n}", cr.name, "u", None, g, at=now)
                    except SubmissionError:
                        pass  # a size no machine holds (the node worlds)
                    n += 1
                elif state.tasks:
                    state.end(sorted(state.tasks)[k % len(state.tasks)], now)
        res = run_pass(index, state, now)
        note(f"step {i} at +{(now - START) / MIN:g} min: {len(res.decisions)} decisions")
        check_moment(index, state, now)


@SETTINGS
@given(worlds())
def test_dry_run_agrees_with_the_pass(world):
    drive(*world)


@SETTINGS
@given(contended_worlds())
def test_dry_run_agrees_when_it_reclaims(world):
    drive(*world)


@pytest.mark.slow  # long on its own: make test, not make check
@SETTINGS
@given(lending_worlds())
def test_dry_run_agrees_with_lending(world):
    estate, steps, changes, _checkpoints, _reports = world
    drive(estate, steps, changes)


@SETTINGS
@given(node_worlds(), st.integers(0, 4))
def test_dry_run_agrees_on_machines_and_gangs(world, reservation):
    """Pools that declare their machines, gangs over several of them (issue 15), and a
    reservation for the first group so that reclaims must find room on one machine."""
    estate, steps = world
    first = estate.policies[0]
    estate = estate.model_copy(
        update={
            "policies": [
                first.model_copy(
                    update={"reservation_milli": min(reservation * 1000, first.limit_milli)}
                ),
                *estate.policies[1:],
            ]
        }
    ).with_revision()
    drive(estate, steps)


@pytest.mark.slow  # long on its own: make test, not make check
@SETTINGS
@given(org_worlds(borrowing=True))
def test_dry_run_agrees_on_hierarchies(world):
    estate, steps, changes, checkpoints = world
    drive(
        estate,
        steps,
        changes,
        apply=lambda index, state, actions, now, n: apply_actions(
            index, state, actions, now, n, checkpoints
        ),
    )


def test_a_reclaim_names_its_victims_and_their_protection():
    """team-a (reservation 2) reclaims from team-b's borrowed, unprotected work: the dry run
    names the victim, its lost work and its protection's end."""
    from compiler.compiled import CLending

    estate = build_estate(
        [{"name": "p", "capacity": 2}],
        [
            {"name": "one", "gpus": 1, "pools": ["p"], "policies": ["a", "b"]},
        ],
        [{"name": "a", "reservation": 2, "limit": 2}, {"name": "b", "reservation": 0, "limit": 2}],
        lending=CLending(protect_for_s=600),
    )
    index = EstateIndex.build(estate)
    state = State(index, START)
    state.submit("b1", "b/one", "u", None, None, at=START)
    state.submit("b2", "b/one", "u", None, None, at=START)
    run_pass(index, state, START)
    early = dry_run(index, state, "a/one", "u", None, None, START + 5 * MIN)
    assert not early.placed
    assert early.reason is not None and "protected until" in early.reason.text
    assert early.forecast.basis == "protection-end"
    assert early.forecast.start_at == START + 10 * MIN
    later = START + 11 * MIN
    run_pass(index, state, later)
    dry = dry_run(index, state, "a/one", "u", None, None, later)
    assert (dry.placed, dry.pool, dry.phase) == (True, "p", "reclaim")
    assert len(dry.victims) == 1
    v = dry.victims[0]
    assert (v.group, v.kind, v.protected_until) == ("b", "reclaimed", START + 10 * MIN)
    assert v.lost_ms == 11 * MIN


def test_budget_with_the_task_and_its_reset():
    """The budget with the task running: the rate rises by its weight and the run-out comes
    sooner; a used-up budget forecasts its period's reset."""
    estate = build_estate(
        [{"name": "p", "capacity": 4}],
        [
            {
                "name": "one",
                "gpus": 1,
                "weight": 1,
                "pools": ["p"],
                "policies": ["a"],
                "queueing": "best_effort",
            }
        ],
        [{"name": "a", "reservation": 0, "limit": 4, "budget": {"hours": 2, "period": "day"}}],
        low_watermark_s=0,
    )
    index = EstateIndex.build(estate)
    state = State(index, START)
    state.submit("a1", "a/one", "u", None, None, at=START)
    run_pass(index, state, START)
    dry = dry_run(index, state, "a/one", "u", None, None, START)
    assert dry.placed and dry.phase == "lend"
    (b,) = dry.budgets
    assert (b.rate_milli, b.rate_with_milli) == (1000, 2000)
    assert b.runout_at == START + 120 * MIN and b.runout_with_at == START + 60 * MIN
    assert b.start_ok
    at = START + 121 * MIN
    run_pass(index, state, at)  # phase 0 preempts a1: the budget is used up
    dry = dry_run(index, state, "a/one", "u", None, None, at)
    assert not dry.placed and dry.reason is not None and dry.reason.kind == "budget"
    assert not dry.budgets[0].start_ok
    assert dry.forecast.basis == "budget-reset"
    assert dry.forecast.start_at == START + 24 * 60 * MIN


def test_known_ends_give_a_forecast():
    """With a scenario's runtimes (``ends``), a task waiting for capacity is forecast at the
    end that frees enough room; without, the forecast is unknown."""
    estate = build_estate(
        [{"name": "p", "capacity": 2}],
        [{"name": "two", "gpus": 2, "pools": ["p"], "policies": ["a"]}],
        [{"name": "a", "reservation": 0, "limit": 4}],
    )
    index = EstateIndex.build(estate)
    state = State(index, START)
    state.submit("a1", "a/two", "u", None, None, at=START)
    run_pass(index, state, START)
    dry = dry_run(index, state, "a/two", "u", None, None, START)
    assert dry.forecast.start_at is None and dry.forecast.text == "unknown: waits for capacity"
    dry = dry_run(index, state, "a/two", "u", None, None, START, ends={"a1": START + 30 * MIN})
    assert (dry.forecast.basis, dry.forecast.start_at) == ("task-end", START + 30 * MIN)


def test_behind_a_head_that_waits_for_its_budget():
    """In a strict queue, a task behind a head that waits for the budget's reset is
    forecast at that reset too."""
    estate = build_estate(
        [{"name": "p", "capacity": 4}],
        [{"name": "one", "gpus": 1, "pools": ["p"], "policies": ["a"]}],
        [{"name": "a", "reservation": 0, "limit": 4, "budget": {"hours": 1, "period": "day"}}],
        low_watermark_s=0,
    )
    index = EstateIndex.build(estate)
    state = State(index, START)
    state.submit("a1", "a/one", "u", None, None, at=START)
    run_pass(index, state, START)
    at = START + 61 * MIN
    run_pass(index, state, at)  # a1 preempted (used up), back at the head of the queue
    dry = dry_run(index, state, "a/one", "u", None, None, at)
    assert dry.reason is not None and dry.reason.text == "behind 1 task in a/one"
    assert (dry.forecast.basis, dry.forecast.start_at) == ("budget-reset", START + 24 * 60 * MIN)
    assert dry.forecast.text.endswith("the head of its queue waits until then")
