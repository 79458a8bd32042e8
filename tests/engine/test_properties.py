"""Properties of the engine on random small estates and timelines (hypothesis).

Each example builds an estate, submits and ends tasks over time, runs every pass the engine
asks for (next_pass_at) and checks engine.md's invariants after each pass.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kliqued.engine import EstateIndex, Placement, Preemption, State, run_pass
from kliqued.engine.budget import budget_units

from .helpers import MIN, START, build_estate
from tests.harness.examples import examples


@st.composite
def worlds(draw):
    n_pools = draw(st.integers(1, 3))
    pools = [{"name": f"p{i}", "capacity": draw(st.integers(1, 6))} for i in range(n_pools)]
    n_pol = draw(st.integers(1, 3))
    policies = []
    for i in range(n_pol):
        limit = draw(st.integers(3, 6))
        pol = {"name": f"g{i}", "reservation": draw(st.integers(0, 3)), "limit": limit}
        if draw(st.booleans()):
            pol["budget"] = {
                "hours": draw(st.sampled_from([0.1, 0.5, 1, 3])),
                "period": draw(st.sampled_from(["day", "week"])),
                "alert_at": [0.5],
            }
        policies.append(pol)
    profiles = []
    for j in range(draw(st.integers(1, 3))):
        pl = draw(st.permutations([p["name"] for p in pools]))
        pl = pl[: draw(st.integers(1, len(pl)))]
        pols = draw(st.permutations([p["name"] for p in policies]))
        pols = pols[: draw(st.integers(1, len(pols)))]
        prof = {
            "name": f"r{j}",
            "pools": pl,
            "policies": pols,
            "weight": draw(st.sampled_from([0, 1, 2])),
            "queueing": draw(st.sampled_from(["strict", "best_effort"])),
        }
        if draw(st.booleans()):
            prof["from_task"] = (1, 2)
        else:
            prof["gpus"] = draw(st.sampled_from([0.5, 1, 2]))
        profiles.append(prof)
    estate = build_estate(pools, profiles, policies)
    steps = draw(
        st.lists(
            st.tuples(
                st.integers(0, 90),  # minutes after the previous step
                st.lists(
                    st.tuples(
                        st.integers(0, 3).map(bool),
                        st.integers(0, 999),
                        st.sampled_from([None, 1, 2]),
                    ),
                    min_size=1,
                    max_size=6,
                ),
            ),
            min_size=1,
            max_size=8,
        )
    )
    return estate, steps


def simulate(estate, steps):
    """Runs a random timeline; returns a log of (time, decisions) and checks invariants."""
    index = EstateIndex.build(estate)
    state = State(index, START)
    crs = sorted(index.resources)
    log = []
    now = START
    n = 0
    res = run_pass(index, state, now)
    for dt, actions in steps:
        target = now + dt * MIN
        while res.next_pass_at is not None and res.next_pass_at < target:
            now = res.next_pass_at
            res = run_pass(index, state, now)
            check(index, state, res, now)
            log.append((now, res.decisions))
        now = target
        for submit, k, gpus in actions:
            if submit:
                cr = index.resources[crs[k % len(crs)]]
                g = None if cr.fixed_size is not None else (gpus or 1) * 1000
                state.submit(f"t{n}", cr.name, "u", None, g, at=now)
                n += 1
            elif state.tasks:
                tid = sorted(state.tasks)[k % len(state.tasks)]
                state.end(tid, now)
        queue_before = {name: [t.id for t in q] for name, q in state.queues.items()}
        res = run_pass(index, state, now)
        check(index, state, res, now, queue_before)
        log.append((now, res.decisions))
    return log


def check(index, state, res, now, queue_before=None):
    for p, info in index.pools.items():
        assert state.pool_used.get(p, 0) <= info.capacity, f"pool {p} over capacity"
    for g, gi in index.groups.items():
        used = state.used.get(g, 0)
        assert used <= gi.limit, f"group {g} over its limit"
        assert used == sum(t.size for t in state.placed_by_group.get(g, {}).values())
        if gi.budget is not None:
            # Time is in whole milliseconds: the run-out pass runs at the first millisecond
            # the budget is used up, so less than one millisecond's charge may pass it
            # (at most 12 tasks x weight 2 here).
            spent = state.meter(g).used(gi.budget.period, now, True)
            assert spent - budget_units(gi.budget) < 12 * 2000, f"budget of {g} overrun"
    # A reclaim serves only work within reservation and never takes a victim's group below
    # its reservation (checked on the state after the pass: victims' groups only lost work).
    for d in res.decisions:
        if isinstance(d, Preemption) and d.kind == "reclaimed":
            gi = index.groups[d.group]
            assert state.used.get(d.group, 0) >= gi.reservation or any(
                isinstance(e, Placement) and e.group == d.group for e in res.decisions
            ), "a reclaim took a borrower below its reservation"
            w = index.groups[d.by]
            assert state.used.get(d.by, 0) <= w.reservation or any(
                isinstance(e, Placement) and e.group == d.by and e.phase == "lend"
                for e in res.decisions
            ), "a reclaim served work beyond the reservation"
    # Strict queues start in order: what was placed was ahead of everything still queued.
    if queue_before is not None:
        placed_now = {d.task for d in res.decisions if isinstance(d, Placement)}
        preempted_now = {d.task for d in res.decisions if isinstance(d, Preemption)}
        for name, before in queue_before.items():
            cr = index.resources.get(name)
            if cr is None or not cr.strict:
                continue
            # A task placed and then reclaimed within the same pass is queued again at the
            # front; engine.md lets the next task of the queue be lent in that pass.
            still = [t for t in before if state.tasks[t].status == 0 and t not in preempted_now]
            for tid in before:
                if tid in placed_now and tid not in preempted_now:
                    assert not still or before.index(tid) < before.index(still[0]), (
                        f"strict queue {name} started {tid} out of order"
                    )
    reasons = res.waiting_reasons()
    queued = {t.id for t in state.tasks.values() if t.status == 0}
    # Every queued task knows its place in line, and it is the queue's own order.
    for name in state.queues:
        order = [t.id for t in state.queue(name)]
        assert [state.position(tid) for tid in order] == list(range(len(order))), name
    assert set(reasons) == queued, "a queued task without a reason"
    assert all(r.kind != "pending" for r in reasons.values()), [
        (k, r) for k, r in reasons.items() if r.kind == "pending"
    ]


FAST = settings(
    max_examples=examples(100),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@FAST
@given(worlds())
def test_invariants_hold(world):
    simulate(*world)


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
def test_same_input_same_decisions(world):
    assert simulate(*world) == simulate(*world)
