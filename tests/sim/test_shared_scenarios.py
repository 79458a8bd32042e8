"""The public conformance scenarios (../shared/scenarios, its organisation/ folder for
organisation.md and its lending/ folder for lending.md) must all pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from kliqued.sim.runner import simulate
from kliqued.sim.scenario import load_scenario

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared"
SCENARIOS = (
    sorted((SHARED / "scenarios").glob("*.yaml"))
    + sorted((SHARED / "scenarios" / "organisation").glob("*.yaml"))
    + sorted((SHARED / "scenarios" / "lending").glob("*.yaml"))
    if SHARED.is_dir()
    else []
)


@pytest.mark.shared
@pytest.mark.parametrize(
    "path", SCENARIOS or [None], ids=lambda p: f"{p.parent.name}/{p.stem}" if p else "none"
)
def test_shared_scenario(path: Path | None) -> None:
    if path is None:
        pytest.skip(f"{SHARED} is absent: the shared conformance scenarios are not here")
    result = simulate(load_scenario(str(path)))
    assert not result.misses, "\n".join(
        f"{m.key} at {m.at}: expected {m.expected}, found {m.found}" for m in result.misses
    )
