"""Shared test fixtures (where the repo and ../shared are, the session's PostgreSQL) and the
suite's machinery: Hypothesis's profiles, the markers given by folder and fixture
(tests/harness/marking.py), and the session-end check that no process a test started
outlives the run (tests/harness/leftovers.py). CONTRIBUTING.md says how to use them."""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path

import pytest
from hypothesis import settings

from tests.harness import leftovers, marking
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


# ---------------------------------------------------------------------------- the suite


def pytest_configure(config: pytest.Config) -> None:
    """A fresh marker for this run in the environment every process a test starts inherits;
    an xdist worker keeps its controller's (the one check runs there)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ[leftovers.VAR] = leftovers.new_marker()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    marking.apply(items)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """After every fixture's teardown (and, under xdist, after the workers have ended): any
    live process carrying this run's marker is a leak. Printed, killed, and the run fails.
    The check comes before the harness kills the servers it remembers, so that safety net
    never hides a leak from it."""
    from tests.harness.inproc import stop_leftovers

    left = stop_leftovers()  # the in-process daemons of this process (each xdist worker's own)
    if left:
        session.config.get_terminal_writer().line(
            "\nin-process daemons left running by their tests (stopped now): " + ", ".join(left),
            red=True,
            bold=True,
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return  # the controller checks once for all its workers' processes
    me = os.getpid()
    xdist = session.config.pluginmanager.has_plugin("dsession")
    # under xdist the controller's own children are its workers (the tests run in them)
    found = [
        p
        for p in leftovers.settle(os.environ[leftovers.VAR], frozenset({me}))
        if not (xdist and p.ppid == me)
    ]
    from tests.harness.daemon import kill_leftovers

    if found:
        leftovers.kill(found)
        session.config.get_terminal_writer().line(
            "\n" + leftovers.report(found), red=True, bold=True
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    kill_leftovers()
