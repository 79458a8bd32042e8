"""The incremental fair choice (``fairtree.FairTree``, issue 28, and ``fairtree.FlatTree``,
its flat form) against the naive walk (``fair.fair_pick``) on random states: the same
candidate at every step, flat and under a three-level tree, with random weights, usage and
candidates coming and going."""

from __future__ import annotations

import random

import pytest

from kliqued.engine import EstateIndex, State
from kliqued.engine.fair import fair_pick
from kliqued.engine.fairtree import FairTree, FlatTree
from kliqued.engine.index import GroupInfo
from kliqued.engine.rules import Key

from tests.bench.bench_engine import with_hierarchy, xl_estate
from tests.engine.helpers import START


def _index(org: bool, seed: int) -> EstateIndex:
    est = xl_estate(profiles=10)  # 200 compute resources over 2,000 policies
    if org:
        est = with_hierarchy(est)
    rnd = random.Random(seed)
    pols = [
        p.model_copy(update={"lend_weight_milli": rnd.choice((500, 1000, 1500, 3000))})
        for p in est.policies
    ]
    return EstateIndex.build(est.model_copy(update={"policies": pols}).with_revision())


@pytest.mark.parametrize(("org", "flat_tree"), [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("seed", range(6))
def test_tree_picks_what_fair_pick_picks(org: bool, flat_tree: bool, seed: int) -> None:
    index = _index(org, seed)
    state = State(index, START)
    rnd = random.Random(seed)
    groups = index.groups
    used = state.used
    for x, xi in groups.items():  # shares from 0 to well above, some levels equal
        used[x] = xi.reservation + rnd.choice((-2, 0, 0, 1, 2, 5)) * 1000
    names = sorted(index.resources)
    tree: FairTree[str] | FlatTree[str] = (
        FlatTree(index, state) if flat_tree else FairTree(index, state)
    )
    cands: dict[str, tuple[Key, GroupInfo]] = {}

    def put(name: str) -> None:
        cr = index.resources[name]
        key: Key = (rnd.randrange(3), rnd.randrange(4), rnd.randrange(10_000), name)
        cands[name] = (key, groups[cr.group])
        tree.add(name, key, groups[cr.group], name)

    for name in rnd.sample(names, 120):
        put(name)
    steps = 0
    while cands:
        want = fair_pick(index, state, [(c[0], c[1], n) for n, c in sorted(cands.items())])
        assert tree.pick() == want
        steps += 1
        _, gi = cands.pop(want)
        tree.remove(want)
        # A placement: usage rises at every level of the picked group.
        for x in gi.levels:
            used[x] += rnd.choice((1000, 2000))
        tree.moved(gi.levels)
        # Candidates change: some looked at again (a new key), some gone, some new.
        for _ in range(rnd.randrange(4) if steps < 200 else 0):
            n = rnd.choice(names)
            if n in cands and rnd.random() < 0.5:
                del cands[n]
                tree.remove(n)
            else:
                put(n)
    assert steps >= 120
