"""The pass's shortcuts (issues 28 and 29) say "nothing to do here" only where the full look
would say so too.

- Phase 4's gate on a flat estate (``passes._nobody_takes``, takers.py) answers from two
  heaps kept across passes; whenever it says no team can take anything, the full check it
  stands in front of (``Givers.any_taker``) must say so as well.
- An outer round of phase 1 (``passes._served``) passes over queues the round before looked
  at; every queue it passes over must have no candidate in that round.
- Phase 4 on a flat estate lists the queues of teams that cannot take only when a move
  needs them (``passes._taking_teams``): each world is run twice, listing every queue and
  listing later, and the decisions must be the same, in order.

The engine runs for real on tests/engine's random worlds (the differential tests' timelines,
without the reference); the two functions are wrapped to check each answer against the full
look at the same moment, and the wrappers count what they checked, so a world in which the
shortcut never answered proves nothing and the totals say so.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from hypothesis import HealthCheck, given, settings

from kliqued.engine import EstateIndex, PassResult, State, passes, run_pass
from kliqued.engine.passes import Givers

from . import test_differential as flat
from . import test_org_differential as org
from .org_worlds import org_worlds
from tests.harness.examples import examples

SEEN: Counter[str] = Counter()
"""What the wrappers checked, over every example of this module's tests."""


def _engine_only(index: EstateIndex, state: State, now: int) -> PassResult:
    return run_pass(index, state, now)


def _quiet(*_args: object) -> None:
    return None


@contextmanager
def _wrapped(name: str, wrapper: Callable[..., object]) -> Iterator[None]:
    """``passes.<name>`` replaced by ``wrapper`` (which calls the real one), and the
    differential drivers running the engine alone, for the time of one example."""
    real = getattr(passes, name)
    saved = [(m, getattr(m, "compare_pass"), getattr(m, "assert_quiet")) for m in (flat, org)]
    setattr(passes, name, wrapper(real))
    for m in (flat, org):  # drive() calls these by their module names
        setattr(m, "compare_pass", _engine_only)
        setattr(m, "assert_quiet", _quiet)
    try:
        yield
    finally:
        setattr(passes, name, real)
        for m, cp, aq in saved:
            setattr(m, "compare_pass", cp)
            setattr(m, "assert_quiet", aq)


def _checked_gate(real: Callable[[EstateIndex, State], bool]) -> Callable[..., bool]:
    def gate(index: EstateIndex, state: State) -> bool:
        nobody = real(index, state)
        if nobody:
            SEEN["gate said nobody"] += 1
            assert not Givers(index, state, state.clock).any_taker(), (
                "phase 4's gate said no team could take anything, but one can"
            )
        else:
            SEEN["gate let phase 4 look"] += 1
        return nobody

    return gate


def _checked_served(
    real: Callable[[EstateIndex, State, set[str], int], Callable[[str], bool]],
) -> Callable[..., Callable[[str], bool]]:
    def served(
        index: EstateIndex, state: State, before: set[str], upto: int
    ) -> Callable[[str], bool]:
        skip = real(index, state, before, upto)

        def check(name: str) -> bool:
            if not skip(name):
                return False
            SEEN["queues passed over"] += 1
            cr = index.resources[name]
            c = passes._candidate(index, state, cr, False, state.clock, upto)
            assert c is None, (
                f"round {upto} of phase 1 passed over {name}, which has a candidate: {c}"
            )
            return True

        return check

    return served


@settings(
    max_examples=examples(100),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(flat.lending_worlds())
def test_phase4_gate_never_hides_a_taker(world) -> None:
    with _wrapped("_nobody_takes", _checked_gate):
        flat.drive(*world)


@settings(
    max_examples=examples(100),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(org_worlds())
def test_outer_rounds_pass_over_no_candidate(world) -> None:
    with _wrapped("_served", _checked_served):
        org.drive(*world)


def _recorder(log: list[tuple[int, list[str], int | None]]) -> Callable[..., PassResult]:
    def record(index: EstateIndex, state: State, now: int) -> PassResult:
        res = run_pass(index, state, now)
        log.append((now, [repr(d) for d in res.decisions], res.next_pass_at))
        return res

    return record


def _counted_taking(real: Callable[[State], set[str]]) -> Callable[[State], set[str]]:
    def taking(state: State) -> set[str]:
        teams = real(state)
        assert state.index is not None
        SEEN["teams phase 4 did not list"] += len(set(state.index.groups) - teams)
        return teams

    return taking


def _every_team(state: State) -> set[str]:
    assert state.index is not None
    return set(state.index.groups)


@settings(
    max_examples=examples(100),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(flat.lending_worlds())
def test_phase4_listing_teams_later_decides_the_same(world) -> None:
    """Phase 4 lists the queues of teams that cannot take only when a move needs them
    (``passes._taking_teams``, decisions L1): every decision, in order, and every next
    pass moment must be those of listing every queue at the phase's start."""
    logs: list[list[tuple[int, list[str], int | None]]] = []
    for taking in (_every_team, _counted_taking(passes._taking_teams)):
        log: list[tuple[int, list[str], int | None]] = []
        real = passes._taking_teams
        saved = (flat.compare_pass, flat.assert_quiet)
        setattr(passes, "_taking_teams", taking)
        setattr(flat, "compare_pass", _recorder(log))
        setattr(flat, "assert_quiet", _quiet)
        try:
            flat.drive(*world)
        finally:
            setattr(passes, "_taking_teams", real)
            setattr(flat, "compare_pass", saved[0])
            setattr(flat, "assert_quiet", saved[1])
        logs.append(log)
    assert logs[0] == logs[1]


def test_the_shortcuts_were_exercised() -> None:
    """Run after the three above (a module's tests run in file order, also under xdist):
    each shortcut answered "nothing" somewhere, so the checks above checked something."""
    if not SEEN:
        import pytest

        pytest.skip("run with the two tests above (alone, it has nothing to look at)")
    assert SEEN["gate said nobody"] > 0, SEEN
    assert SEEN["queues passed over"] > 0, SEEN
    assert SEEN["teams phase 4 did not list"] > 0, SEEN
