"""Shared test fixtures: where the repo and ../shared are."""

from __future__ import annotations

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
