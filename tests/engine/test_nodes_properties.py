"""Node shapes under random timelines (hypothesis, issue 15): machines never hold more than
they have, every placed task sits on machines that add up to its size, and a pass leaves no
work that would fit both its group's limit and some pool's machines (no missed wake-up, and
no endless look at a gang that does not fit).

Reservations are 0 here so every placement is phase 3 and the check "nothing placeable is
left" needs no reclaim rules; reclaim on machines is covered by tests/scenarios/nodes-gang.yaml.
"""

from __future__ import annotations

from compiler.compiled import CNodes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kliqued.engine import EstateIndex, State, run_pass
from kliqued.engine.errors import SubmissionError
from kliqued.engine.rules import first_fit, headroom

from .helpers import MIN, START, build_estate, g
from tests.harness.examples import examples


@st.composite
def worlds(draw):
    pools, shapes = [], {}
    for i in range(draw(st.integers(1, 2))):
        groups = draw(
            st.lists(
                st.tuples(st.integers(1, 3), st.sampled_from([2, 4, 8])), min_size=1, max_size=2
            )
        )
        pools.append({"name": f"p{i}", "capacity": sum(c * x for c, x in groups)})
        shapes[f"p{i}"] = groups
    policies = [
        {"name": f"g{i}", "reservation": 0, "limit": draw(st.integers(4, 24))}
        for i in range(draw(st.integers(1, 2)))
    ]
    profiles, gangs = [], {}
    for j in range(draw(st.integers(1, 3))):
        pl = draw(st.permutations([p["name"] for p in pools]))
        nodes = draw(st.sampled_from([1, 1, 2]))
        prof = {
            "name": f"r{j}",
            "pools": pl[: draw(st.integers(1, len(pl)))],
            "policies": [p["name"] for p in policies],
            "queueing": draw(st.sampled_from(["strict", "best_effort"])),
            "gpus": draw(st.sampled_from([1, 2, 4] if nodes == 1 else [2, 4, 8])),
        }
        if nodes == 1 and draw(st.booleans()):
            del prof["gpus"]
            prof["from_task"] = (1, 8)
        gangs[prof["name"]] = nodes
        profiles.append(prof)
    est = build_estate(pools, profiles, policies)
    est = est.model_copy(
        update={
            "pools": [
                p.model_copy(
                    update={"nodes": [CNodes(count=c, gpus_milli=g(x)) for c, x in shapes[p.name]]}
                )
                for p in est.pools
            ],
            "profiles": [p.model_copy(update={"nodes": gangs[p.name]}) for p in est.profiles],
        }
    ).with_revision()
    steps = draw(
        st.lists(
            st.tuples(
                st.integers(0, 30),
                st.lists(
                    st.tuples(st.booleans(), st.integers(0, 999), st.sampled_from([1, 2, 3, 6])),
                    min_size=1,
                    max_size=6,
                ),
            ),
            min_size=1,
            max_size=8,
        )
    )
    return est, steps


def check(index: EstateIndex, state: State) -> None:
    for p, free in state.node_free.items():
        caps = index.pools[p].node_caps
        held = [0] * len(caps)
        for t in state.placed_on(p):
            assert sum(a for _, a in t.alloc) == t.size, t
            assert len({i for i, _ in t.alloc}) == len(t.alloc) == max(1, t.nodes) or t.size == 0
            for i, a in t.alloc:
                held[i] += a
        assert [c - h for c, h in zip(caps, held)] == free
        assert min(free) >= 0
    # Nothing left that fits: strict heads, and every best_effort task.
    for name, q in state.queues.items():
        cr = index.resources[name]
        tasks = list(q)
        for t in tasks[:1] if cr.strict else tasks:
            if t.size <= headroom(index, state, cr, True):
                assert first_fit(state, cr, t.size) is None, (
                    f"{t.id} ({t.size} over {cr.nodes}) fits {first_fit(state, cr, t.size)} "
                    f"but was left queued; machines {state.node_free}"
                )


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
def test_machines_hold_what_is_placed_and_nothing_placeable_waits(world) -> None:
    est, steps = world
    index = EstateIndex.build(est)
    state = State(index, START)
    crs = sorted(index.resources)
    now, n = START, 0
    res = run_pass(index, state, now)
    check(index, state)
    for dt, actions in steps:
        now += dt * MIN + 1
        for submit, k, gpus in actions:
            if submit:
                cr = index.resources[crs[k % len(crs)]]
                want = None if cr.fixed_size is not None else g(gpus)
                try:
                    state.submit(f"t{n}", cr.name, "u", None, want, at=now)
                except SubmissionError:
                    pass  # a size no machine holds is refused: tests/compiler/test_nodes.py
                n += 1
            elif state.tasks:
                tid = sorted(state.tasks)[k % len(state.tasks)]
                state.end(tid, now)
        res = run_pass(index, state, now)
        check(index, state)
    assert res is not None
