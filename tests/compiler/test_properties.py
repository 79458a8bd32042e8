"""Property tests: compile is deterministic, and no input makes validate raise."""

from __future__ import annotations

import itertools
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML
from io import StringIO

from compiler.api import SourceFile, compile_files
from compiler.reservations import check_reservations
from tests.harness.examples import examples
from tests.harness.typed import present

NAMES = st.sampled_from(["a", "b", "c", "d", "e"])


@st.composite
def estates(draw) -> dict:
    """Small estates, valid or not: the compiler must handle both without raising."""
    pool_names = draw(st.lists(NAMES, min_size=1, max_size=4, unique=True))
    pools = [
        {
            "name": f"p{n}",
            "kind": draw(st.sampled_from(["baremetal", "kubernetes", "hpc"])),
            "capacity": draw(st.integers(0, 16)),
            "gpu_type": "h100",
            "generation": draw(st.integers(2018, 2025)),
        }
        for n in pool_names
    ]
    group_names = draw(st.lists(NAMES, min_size=1, max_size=4, unique=True))
    policies = []
    for g in group_names:
        limit = draw(st.integers(1, 16))
        policies.append(
            {
                "name": f"g{g}",
                "group": f"g{g}",
                "reservation": draw(st.integers(0, limit)),
                "limit": limit,
            }
        )
    profiles = []
    for i in range(draw(st.integers(1, 3))):
        chosen = draw(
            st.lists(st.sampled_from([p["name"] for p in pools]), min_size=1, unique=True)
        )
        pols = draw(
            st.lists(st.sampled_from([p["name"] for p in policies]), min_size=1, unique=True)
        )
        profiles.append(
            {
                "name": f"f{i}",
                "gpus": draw(st.sampled_from([0, 0.25, 1, 2])),
                "pools": chosen,
                "policies": pols,
            }
        )
    return {
        "pools": pools,
        "profiles": profiles,
        "policies": policies,
        "groups": [{"name": f"g{g}"} for g in group_names],
        "pricing": [
            {"gpu_type": "h100", "per_gpu_hour": 2.5, "effective_from": "2026-01-01T00:00:00Z"}
        ],
    }


def _dump(data: dict) -> bytes:
    y = YAML()
    buf = StringIO()
    y.dump(data, buf)
    return buf.getvalue().encode()


def _shuffled(data: dict, rng: random.Random) -> dict:
    out = {}
    for key in rng.sample(list(data), len(data)):
        items = [dict(rng.sample(list(obj.items()), len(obj))) for obj in data[key]]
        out[key] = items
    return out


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(estates(), st.integers(0, 2**32 - 1))
def test_compile_is_deterministic_whatever_the_split_and_key_order(data: dict, seed: int) -> None:
    rng = random.Random(seed)
    whole = compile_files([SourceFile("e.yaml", _dump(data))])
    # Same content in another file split (sections into separate files, keys shuffled).
    # Declaration order within a section is kept: it carries meaning (execution order).
    files = [
        SourceFile(f"{i:02d}-{k}.yaml", _dump(_shuffled({k: v}, rng)))
        for i, (k, v) in enumerate(data.items())
    ]
    split = compile_files(files)
    assert sorted(d.message for d in whole.diagnostics) == sorted(
        d.message for d in split.diagnostics
    )
    if whole.estate is None:
        assert split.estate is None
    else:
        assert split.estate is not None
        assert whole.estate.canonical_json() == split.estate.canonical_json()
    again = compile_files([SourceFile("e.yaml", _dump(data))])
    assert (again.estate is None) == (whole.estate is None)
    if whole.estate is not None:
        assert present(again.estate).revision == whole.estate.revision


@settings(max_examples=examples(150), deadline=None)
@given(st.binary(max_size=400))
def test_arbitrary_bytes_never_raise(data: bytes) -> None:
    result = compile_files([SourceFile("x.yaml", data)])
    assert result.estate is None or not result.errors


YAML_ATOMS = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-5, 100),
        st.floats(allow_nan=True),
        st.text(max_size=8),
        st.sampled_from(["pools", "name", "gpus", "h100", "1s"]),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(
            st.sampled_from(
                [
                    "pools",
                    "profiles",
                    "policies",
                    "groups",
                    "pricing",
                    "settings",
                    "name",
                    "kind",
                    "capacity",
                    "gpus",
                    "pools_by",
                    "budget",
                    "limit",
                    "x",
                ]
            ),
            inner,
            max_size=5,
        ),
    ),
    max_leaves=25,
)


@settings(max_examples=examples(200), deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(
            ["pools", "profiles", "policies", "groups", "pricing", "settings", "version", "junk"]
        ),
        YAML_ATOMS,
        max_size=6,
    )
)
def test_arbitrary_yaml_structures_never_raise(data: dict) -> None:
    try:
        text = _dump(data)
    except Exception:  # a value ruamel itself cannot write is not a compiler input
        return
    result = compile_files([SourceFile("x.yaml", text)])
    for d in result.diagnostics:
        assert d.render()


@settings(max_examples=examples(150), deadline=None)
@given(
    st.dictionaries(st.sampled_from("abcde"), st.integers(0, 10), min_size=1),
    st.dictionaries(st.sampled_from("pqr"), st.integers(0, 12), min_size=1),
    st.data(),
)
def test_max_flow_agrees_with_every_subset(res: dict, cap: dict, data) -> None:
    reach = {p: data.draw(st.lists(st.sampled_from(sorted(cap)), unique=True)) for p in res}
    shortfalls = check_reservations(res, reach, cap)
    violated = False
    for k in range(1, len(res) + 1):
        for subset in itertools.combinations(sorted(res), k):
            pools = {q for p in subset for q in reach[p]}
            if sum(res[p] for p in subset) > sum(cap[q] for q in pools):
                violated = True
    assert violated == bool(shortfalls)
    for s in shortfalls:
        # each reported set really does not fit, by the amount it says
        assert set(s.pools) == {q for p in s.policies for q in reach[p]}
        assert s.reserved_milli == sum(res[p] for p in s.policies)
        assert s.capacity_milli == sum(cap[q] for q in s.pools)
        assert s.short_milli > 0


@st.composite
def trees(draw) -> dict:
    """Estates with departments. Half are tidy (departments above teams, no cycle, envelopes
    that reserve nothing of their own, user limits that fit), so that valid trees are
    common; the others take any parents (cycles, unknown names, self-parents), envelopes
    listed by profiles, and any user limit."""
    data = draw(estates())
    tidy = draw(st.booleans())
    names = [g["name"] for g in data["groups"]]
    extra = [f"d{n}" for n in draw(st.lists(NAMES, min_size=1, max_size=3, unique=True))]
    groups = []
    for i, name in enumerate(names + extra):
        g: dict = {"name": name}
        if not tidy:
            options = [None] + names + extra + ["nowhere"]
        elif name in extra:
            options = [None] + extra[: extra.index(name)]
        else:
            options = [None] + extra
        parent = draw(st.sampled_from(options))
        if parent is not None:
            g["parent"] = parent
        groups.append(g)
    data["groups"] = groups
    for name in extra:
        if draw(st.booleans()):
            limit = draw(st.integers(4 if tidy else 1, 32))
            pol: dict = {
                "name": name,
                "group": name,
                "limit": limit,
                "reservation": draw(st.integers(0, 4 if tidy else limit)),
            }
            if not tidy and draw(st.booleans()):
                pol["user_limit"] = draw(st.integers(0, 8))
            data["policies"].append(pol)
    has_parent = {g["name"] for g in groups if "parent" in g}
    for pol in data["policies"]:
        if tidy and pol["name"] not in extra and pol["group"] in has_parent:
            pol["reservation"] = 0  # the department reserves for its teams
        if pol["name"] not in extra and draw(st.booleans()):
            pol["user_limit"] = (
                draw(st.integers(min(2, pol["limit"]), pol["limit"]))
                if tidy
                else draw(st.integers(0, 8))
            )
    return data


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees())
def test_any_tree_compiles_or_fails_cleanly_and_a_valid_one_is_consistent(data: dict) -> None:
    result = compile_files([SourceFile("e.yaml", _dump(data))])
    assert all(d.pos is not None for d in result.diagnostics)
    est = result.estate
    if est is None:
        assert result.errors
        return
    policies = {p.name: p for p in est.policies}
    for p in est.policies:
        assert p.levels[0] == p.name and len(set(p.levels)) == len(p.levels)
        assert all(policies[e].envelope for e in p.levels[1:])
        if p.envelope:
            assert not p.profiles and p.user_limit_milli is None
            nearest = sum(policies[b].reservation_milli for b in p.below)
            assert p.shared_reservation_milli == p.reservation_milli - nearest >= 0
            assert all(policies[b].levels[1] == p.name for b in p.below)
        else:
            assert p.shared_reservation_milli == 0 and p.below == []
            if p.user_limit_milli is not None:
                assert p.user_limit_milli <= p.limit_milli
    assert not {c.policy for c in est.compute_resources} & {
        p.name for p in est.policies if p.envelope
    }
