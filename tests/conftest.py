"""Shared test fixtures: where the repo and ../shared are."""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
ESTATE = REPO / "estate"


def require_shared(*parts: str) -> Path:
    """The path under ../shared, or a skip that says why (CI has it; a bare clone may not)."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent: clone the repo with ../shared beside it to run this")
    return path


@pytest.fixture(scope="session", autouse=True)
def _no_server_left_behind():
    """No ``kliqued serve`` a test started outlives the session, whichever test forgot it."""
    yield
    from tests.harness.daemon import kill_leftovers
    kill_leftovers()


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
