"""The evicted tasks' Idempotency-Key filter: never a false "absent", few false "maybe"."""

from __future__ import annotations

import pickle

from klique_util.keyfilter import FIRST, KeyFilter


def test_every_added_key_is_found_across_growth_and_a_pickle() -> None:
    f = KeyFilter()
    keys = [f"alice\0key-{i}" for i in range(FIRST * 2)]  # two filters
    for k in keys:
        f.add(k)
    assert len(f) == len(keys)
    g = pickle.loads(pickle.dumps(f))
    assert all(k in g for k in keys)


def test_few_keys_never_added_are_reported_maybe() -> None:
    f = KeyFilter()
    for i in range(FIRST):
        f.add(f"alice\0key-{i}")
    probes = 20_000
    false = sum(f"bob\0key-{i}" in f for i in range(probes))
    assert false / probes < 0.02  # designed for 1 %


def test_an_empty_filter_holds_nothing() -> None:
    assert "alice\0k" not in KeyFilter()
