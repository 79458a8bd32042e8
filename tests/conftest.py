"""Shared test fixtures (where the repo and ../shared are, the session's PostgreSQL) and the
suite's machinery: Hypothesis's profiles, the markers given by folder and fixture
(tests/harness/marking.py), and the session-end check that no process a test started
outlives the run (tests/harness/leftovers.py). CONTRIBUTING.md says how to use them."""

from __future__ import annotations

import itertools
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from tests.harness import leftovers, marking, scheduling
from tests.harness.examples import DEV_MAX, profile

settings.register_profile("ci", settings())  # Hypothesis's defaults: today's counts, exactly
settings.register_profile("dev", max_examples=DEV_MAX)
settings.load_profile(profile())

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
ESTATE = REPO / "estate"


def require_shared(*parts: str) -> Path:
    """The path under ../shared, or a skip that says why (CI has it; a bare clone may not)."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent: clone the repo with ../shared beside it to run this")
    return path


@pytest.fixture(scope="session")
def postgres():
    """One real PostgreSQL for the session (tests/harness/postgres.py); a test makes its own
    database with ``postgres.createdb(name)``. Skips, saying why, where none can run."""
    from tests.harness.postgres import Postgres, unavailable

    why = unavailable()
    if why:
        pytest.skip(why)
    server = Postgres().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def oidc_people():
    """One real OpenID Provider for the session, shaped like a site's (tests/harness/oidc.py):
    the client ``klique`` (public, PKCE; the device grant). Skips, saying why, without
    Node.js/npm."""
    from tests.harness.oidc import Client, Provider, unavailable

    why = unavailable()
    if why:
        pytest.skip(why)
    provider = Provider("people", [Client("klique")]).start()
    try:
        yield provider
    finally:
        provider.stop()


@pytest.fixture(scope="session")
def oidc_actions():
    """A second real provider shaped like GitHub Actions' token service (``repository``,
    ``ref`` claims; ``ACTIONS_ID_TOKEN_REQUEST_URL``)."""
    from tests.harness.oidc import Provider, unavailable

    why = unavailable()
    if why:
        pytest.skip(why)
    provider = Provider("actions").start()
    try:
        yield provider
    finally:
        provider.stop()


@pytest.fixture
def idp_server(tmp_path: Path, oidc_people: Any, oidc_actions: Any) -> Iterator[Any]:
    """A daemon (in process) whose estate trusts the session's providers
    (tests/harness/oidc_estate.py): ``corp`` for people, ``github`` for CI jobs."""
    from tests.harness.inproc import InProcServer
    from tests.harness.oidc_estate import write_estate

    estate = write_estate(tmp_path / "estate", oidc_people, oidc_actions)
    s = InProcServer(tmp_path, estate).start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="session")
def postgres_prepared():
    """A PostgreSQL that takes prepared transactions (``max_prepared_transactions``), for
    the tests of batches an older kliqued left prepared (its two-phase commit); started
    only by the tests that ask for it."""
    from tests.harness.postgres import Postgres, unavailable

    why = unavailable()
    if why:
        pytest.skip(why)
    server = Postgres(prepared_transactions=4).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def prepared_pg_url(postgres_prepared, request) -> str:
    """A fresh database of :func:`postgres_prepared` for this test."""
    name = "p_" + re.sub(r"[^a-z0-9]+", "_", request.node.name.lower())[:50]
    return postgres_prepared.createdb(f"{name}_{os.getpid()}_{next(_DB_COUNTER)}")


@pytest.fixture
def pg_url(postgres, request) -> str:
    """A fresh database of the session's PostgreSQL for this test."""
    name = "t_" + re.sub(r"[^a-z0-9]+", "_", request.node.name.lower())[:50]
    return postgres.createdb(f"{name}_{os.getpid()}_{next(_DB_COUNTER)}")


_DB_COUNTER = itertools.count()


@pytest.fixture(scope="session", autouse=True)
def no_inproc_daemon_left() -> Iterator[None]:
    """An in-process daemon (tests/harness/inproc.py) still running when the session's
    fixtures end is a leak, as a leftover process is: stopped, and an error at the last
    test's teardown names it. A fixture rather than the session-end hook: under xdist an
    error here fails the run from the worker that has it. Set up first, so torn down after
    the fixtures that own the shared daemons."""
    yield
    inproc = sys.modules.get("tests.harness.inproc")  # not imported: nothing was started
    left = inproc.stop_leftovers() if inproc is not None else []
    assert not left, f"in-process daemons left running by their tests (stopped now): {left}"


# ---------------------------------------------------------------------------- the suite


def pytest_configure(config: pytest.Config) -> None:
    """A fresh marker for this run in the environment every process a test starts inherits;
    an xdist worker keeps its controller's (the one check runs there)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ[leftovers.VAR] = leftovers.new_marker()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    marking.apply(items)
    problems = scheduling.check_shared(marking.shared_services(items))
    if problems:
        raise pytest.UsageError("\n".join(problems))


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> scheduling.FileScheduling:
    """Under ``-n``: a file at a time per worker, the test Slurm's folder at a time."""
    return scheduling.FileScheduling(config, log)


DURATIONS_ENV = "KLIQUE_TEST_DURATIONS"
"""A file to write each scope's seconds to at the end of a run (merged into what it holds):
the order in which tests/harness/scheduling.py hands the scopes out
(``KLIQUE_TEST_DURATIONS=tests/harness/durations.json make test`` refreshes it)."""

_FINISHED: list[str] = []
"""The node ids of the tests whose teardown was reported (on the controller, under xdist)."""


_SECONDS: dict[str, float] = {}
"""Seconds per xdist scope (set-up, call and teardown of its tests), for ``KLIQUE_TEST_DURATIONS``."""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "teardown":
        _FINISHED.append(report.nodeid)
    scope = scheduling.scope_of(report.nodeid)
    _SECONDS[scope] = _SECONDS.get(scope, 0.0) + report.duration


def _unrun(session: pytest.Session) -> str | None:
    """Under xdist, a run that passed with fewer tests finished than collected lost some on
    the way to the workers (it happened: tests/harness/scheduling.py), which must not pass."""
    collected = session.testscollected
    if not session.config.pluginmanager.has_plugin("dsession") or not collected:
        return None
    if len(_FINISHED) >= collected:
        return None
    return (
        f"{collected - len(_FINISHED)} of the {collected} tests collected never ran: "
        f"the xdist scheduler lost them (tests/harness/scheduling.py)"
    )


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """After every fixture's teardown (and, under xdist, after the workers have ended): any
    live process carrying this run's marker is a leak. Printed, killed, and the run fails.
    The check comes before the harness kills the servers it remembers, so that safety net
    never hides a leak from it."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return  # the controller checks once for all its workers
    out = os.environ.get(DURATIONS_ENV)
    if out and _SECONDS:
        scheduling.record(_SECONDS, Path(out))
    me = os.getpid()
    xdist = session.config.pluginmanager.has_plugin("dsession")
    # under xdist the controller's own children are its workers (the tests run in them)
    found = [
        p
        for p in leftovers.settle(os.environ[leftovers.VAR], frozenset({me}))
        if not (xdist and p.ppid == me)
    ]
    from tests.harness.daemon import kill_leftovers

    lost = _unrun(session) if exitstatus == pytest.ExitCode.OK else None
    if lost:
        session.config.get_terminal_writer().line("\n" + lost, red=True, bold=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if found:
        leftovers.kill(found)
        session.config.get_terminal_writer().line(
            "\n" + leftovers.report(found), red=True, bold=True
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    kill_leftovers()
