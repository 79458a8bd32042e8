"""The real engine against the reference engine of tests/engine/reference.py (hypothesis).

On random small estates and timelines, every pass of the real engine must decide exactly what
the reference decides from the same snapshot; and between passes, at the moment just before
the next pass the engine asks for, the reference must find nothing to do (otherwise the
engine missed a wake-up: work that could be placed, or a budget that ran out, was left
until something else happened). With lending.md's settings (``lending_worlds``) each pass
also compares each preemption's size and lost work, every level's share, and the protection
end a waiting task's reason names; a protection that ends is a wake-up like any other.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from compiler.compiled import CLending

from kliqued.engine import EstateIndex, Placement, Preemption, State, run_pass
from kliqued.engine.fair import share
from kliqued.engine.periods import format_minute

from . import reference as ref
from .helpers import MIN, START, build_estate
from .test_properties import worlds
from tests.harness.examples import examples


def real_decisions(res) -> Counter:
    out: Counter = Counter()
    for d in res.decisions:
        if isinstance(d, Placement):
            out[("place", d.task, d.pool, d.phase)] += 1
        elif isinstance(d, Preemption):
            out[("preempt", d.task, d.kind, d.by, d.size_milli, d.lost_ms)] += 1
    return out


def compare_lending(index: EstateIndex, state: State, res, after: ref.RState) -> None:
    """lending.md after a pass: every level's share, and the protection end a waiting task's
    reason names (the reference's ``protected_until``), are the reference's."""
    for pol in index.estate.policies:
        got, want = share(index, state, pol.group), ref.share(after, pol.name)
        assert got == want, f"share of {pol.name}: the engine {got}, the reference {want}"
    if not any(ms > 0 for ms in after.org.protect_ms.values()):
        return
    reasons = res.waiting_reasons()
    for t in after.tasks.values():
        if t.pool is not None or t.id not in reasons:
            continue
        until = ref.protected_until(after, t)
        text = reasons[t.id].text
        if until is None:
            assert "protected until" not in text, (t.id, text, "the reference: no protection")
        else:
            want_text = f"borrowed work protected until {format_minute(until)}"
            assert reasons[t.id].kind == "capacity" and text.endswith(want_text), (
                t.id,
                text,
                want_text,
            )


def compare_pass(index: EstateIndex, state: State, now: int):
    """Runs one real pass at ``now`` and checks it against the reference."""
    rs = ref.snapshot(index, state, now)
    expected = Counter(ref.run_pass(index, rs))
    res = run_pass(index, state, now)
    got = real_decisions(res)
    assert got == expected, (
        f"at +{(now - START) / MIN:g} min the engine decided\n"
        f"  {sorted(got.elements())}\nthe reference\n"
        f"  {sorted(expected.elements())}"
    )
    # Nothing placeable is left unplaced, no used-up budget is left running.
    after = ref.snapshot(index, state, now)
    compare_lending(index, state, res, after)
    assert ref.run_pass(index, after) == [], "the pass left work the rules would place"
    return res


def assert_quiet(index: EstateIndex, state: State, at: int) -> None:
    """At ``at`` (no pass asked for yet), the rules have nothing to do."""
    rs = ref.snapshot(index, state, at)
    assert ref.run_pass(index, rs) == [], (
        f"at +{(at - START) / MIN:g} min the rules would act but the engine asked for no pass"
    )


def drive(
    estate, steps, changes=None, checkpoints: tuple[int, ...] = (), reports: bool = False
) -> None:
    """Runs the timeline. ``changes``: before step i, the estate becomes ``changes[i]`` (the
    next pass binds it); ``checkpoints``: task number n checkpoints every
    ``checkpoints[n % len]`` minutes (0: never); ``reports``: an end action whose ``k`` is a
    multiple of 3 reports a checkpoint of that task instead (lending.md)."""
    index = EstateIndex.build(estate)
    state = State(index, START)
    crs = sorted(index.resources)
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
            index = EstateIndex.build(changes[i])
        for submit, k, gpus in actions:
            if submit:
                cr = index.resources[crs[k % len(crs)]]
                g = None if cr.fixed_size is not None else round((gpus or 1) * 1000)
                every = checkpoints[n % len(checkpoints)] * MIN if checkpoints else None
                state.submit(f"t{n}", cr.name, "u", None, g, at=now, checkpoint_ms=every)
                n += 1
            elif reports and k % 3 == 0 and state.tasks:
                state.checkpoint(sorted(state.tasks)[k % len(state.tasks)], now)
            elif state.tasks:
                tid = sorted(state.tasks)[k % len(state.tasks)]
                state.end(tid, now)
        res = compare_pass(index, state, now)


@settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(worlds())
def test_engine_decides_as_the_reference(world):
    drive(*world)


@st.composite
def contended_worlds(draw):
    """Small pools, every group with a reservation, tasks of mixed sizes: reclaims with
    several victims, sparing and ineligible victims happen often."""
    pools = [
        {"name": f"p{i}", "capacity": draw(st.integers(2, 5))}
        for i in range(draw(st.integers(1, 2)))
    ]
    policies = [
        {"name": f"g{i}", "reservation": draw(st.integers(1, 3)), "limit": draw(st.integers(4, 8))}
        for i in range(draw(st.integers(2, 3)))
    ]
    if draw(st.booleans()):
        policies[0]["budget"] = {"hours": draw(st.sampled_from([0.2, 1])), "period": "day"}
    profiles = []
    for j, pol in enumerate(policies):
        pl = draw(st.permutations([p["name"] for p in pools]))
        profiles.append(
            {
                "name": f"r{j}",
                "pools": pl,
                "policies": [pol["name"]],
                "from_task": (1, 3),
                "queueing": draw(st.sampled_from(["strict", "best_effort"])),
            }
        )
    estate = build_estate(pools, profiles, policies)
    steps = draw(
        st.lists(
            st.tuples(
                st.integers(0, 30),
                st.lists(
                    st.tuples(
                        st.integers(0, 4).map(bool),
                        st.integers(0, 999),
                        st.sampled_from([None, 0.5, 1, 1.5, 2, 3]),
                    ),
                    min_size=1,
                    max_size=6,
                ),
            ),
            min_size=2,
            max_size=8,
        )
    )
    return estate, steps


@settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(contended_worlds())
def test_engine_reclaims_as_the_reference(world):
    drive(*world)


@st.composite
def lendings(draw) -> CLending:
    """settings.lending: every combination of order, protection and victims (lending.md)."""
    return CLending(
        order=draw(st.sampled_from(["ordered", "fair"])),
        protect_for_s=draw(st.sampled_from([0, 0, 90, 5 * 60, 20 * 60])),
        victims=draw(st.sampled_from(["newest", "least_lost_work"])),
    )


@st.composite
def lending_worlds(draw):
    """Flat estates with settings.lending drawn, policies with their own lend_weight and
    protect_for, tasks that checkpoint (and report checkpoints), and sometimes a change of
    the lending settings mid-run (lending.md: a changed protect_for applies at once). Pools
    are small and groups borrow, so reclaims, protected victims, fair picks and rebalances
    happen often."""
    pools = [
        {"name": f"p{i}", "capacity": draw(st.integers(2, 8))}
        for i in range(draw(st.integers(1, 2)))
    ]
    policies = []
    for i in range(draw(st.integers(2, 4))):
        pol = {
            "name": f"g{i}",
            "reservation": draw(st.sampled_from([0, 0, 1, 2])),
            "limit": draw(st.integers(3, 8)),
            "lend_weight": draw(st.sampled_from([0.5, 1, 1, 2, 3])),
        }
        if draw(st.integers(0, 2)) == 0:
            pol["protect_for_s"] = draw(st.sampled_from([0, 5 * 60, 30 * 60]))
        policies.append(pol)
    if draw(st.integers(0, 2)) == 0:
        policies[0]["budget"] = {"hours": draw(st.sampled_from([0.3, 1])), "period": "day"}
    profiles = []
    for j in range(draw(st.integers(1, 3))):
        pl = draw(st.permutations([p["name"] for p in pools]))
        pols = draw(st.permutations([p["name"] for p in policies]))
        prof = {
            "name": f"r{j}",
            "pools": pl,
            "policies": pols[: draw(st.integers(1, len(pols)))],
            "queueing": draw(st.sampled_from(["strict", "best_effort"])),
            "weight": draw(st.sampled_from([0, 1])),
        }
        if draw(st.booleans()):
            prof["from_task"] = (1, 3)
        else:
            prof["gpus"] = draw(st.sampled_from([0.5, 1, 2]))
        profiles.append(prof)
    estate = build_estate(pools, profiles, policies, lending=draw(lendings()))
    steps = draw(
        st.lists(
            st.tuples(
                st.integers(0, 30),
                st.lists(
                    st.tuples(
                        st.integers(0, 3).map(bool),
                        st.integers(0, 999),
                        st.sampled_from([None, 0.5, 1, 2, 3]),
                    ),
                    min_size=1,
                    max_size=6,
                ),
            ),
            min_size=2,
            max_size=8,
        )
    )
    changes = {}
    if draw(st.integers(0, 2)) == 0:
        at = draw(st.integers(0, len(steps) - 1))
        changes[at] = build_estate(pools, profiles, policies, lending=draw(lendings()))
        note(f"before step {at}: {changes[at].settings.lending}")
    checkpoints = tuple(draw(st.lists(st.sampled_from([0, 0, 7, 15, 30]), min_size=1, max_size=4)))
    return estate, steps, changes, checkpoints, True


@settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(lending_worlds())
def test_engine_lends_as_the_reference(world):
    drive(*world)
