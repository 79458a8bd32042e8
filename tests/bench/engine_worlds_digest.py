"""A digest of every decision, in order, the engine makes on tests/engine's random worlds.

The differential tests compare each pass with the reference engine as a multiset; a change
meant to make the engine faster without changing anything must also keep the order of the
decisions and the moments of the next passes. This drives the same worlds as
tests/engine/test_org_differential.py and test_differential.py (hierarchies, flat estates,
contended ones, flat estates with lending.md's settings drawn), generated derandomized so that two checkouts draw the same ones, and prints
one digest per kind; run it in both checkouts with the same Python and compare:

    .venv/bin/python -m tests.bench.engine_worlds_digest 2000
    cd ../base && ../wt/.venv/bin/python -m tests.bench.engine_worlds_digest 2000

The reference engine is not run (the differential tests do that).
"""

from __future__ import annotations

import hashlib
import sys

from hypothesis import HealthCheck, Phase, given, settings

from kliqued.engine import EstateIndex, PassResult, State, run_pass
from tests.engine import test_differential as flat
from tests.engine import test_org_differential as org
from tests.engine.org_worlds import org_worlds
from tests.engine.test_properties import worlds


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv else 300
    h = hashlib.sha256()
    counts = [0, 0]

    def record(index: EstateIndex, state: State, now: int) -> PassResult:
        res = run_pass(index, state, now)
        for d in res.decisions:
            h.update(repr(d).encode())
        h.update(repr(res.next_pass_at).encode())
        counts[1] += len(res.decisions)
        return res

    def quiet(*_args: object) -> None:
        return None

    # drive() calls these by their module names: no reference, every decision recorded.
    for m in (org, flat):
        m.compare_pass = record  # type: ignore[attr-defined]  # set here, read by drive()
        m.assert_quiet = quiet  # type: ignore[attr-defined]  # set here, read by drive()
    same = settings(
        max_examples=n,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )

    @same
    @given(org_worlds())
    def hierarchies(world) -> None:
        counts[0] += 1
        org.drive(*world)

    @same
    @given(worlds())
    def flat_worlds(world) -> None:
        counts[0] += 1
        flat.drive(*world)

    @same
    @given(flat.contended_worlds())
    def contended(world) -> None:
        counts[0] += 1
        flat.drive(*world)

    @same
    @given(flat.lending_worlds())
    def lending(world) -> None:
        counts[0] += 1
        flat.drive(*world)

    for test in (hierarchies, flat_worlds, contended, lending):
        test()
        print(
            f"{test.__name__}: {counts[0]} worlds, {counts[1]} decisions, "
            f"digest {h.hexdigest()[:16]}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
