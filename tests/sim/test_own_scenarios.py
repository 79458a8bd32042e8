"""The project's own scenarios (tests/scenarios), one or more per rule of engine.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from kliqued.sim.runner import simulate
from kliqued.sim.scenario import load_scenario

HERE = Path(__file__).resolve().parents[1] / "scenarios"
SCENARIOS = sorted(HERE.glob("*.yaml"))


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_own_scenario(path: Path) -> None:
    result = simulate(load_scenario(str(path)))
    assert not result.misses, "\n".join(
        f"line {m.line}: {m.key} at +{(m.at - result.scenario.start) // 1000}s: expected "
        f"{m.expected}, found {m.found}"
        for m in result.misses
    )


def test_alerts_once_per_threshold_per_period() -> None:
    from kliqued.engine import Alert

    result = simulate(load_scenario(str(HERE / "alerts.yaml")))
    start = result.scenario.start
    alerts = [
        ((t - start) // 60_000, d.threshold_milli)
        for t, d in result.decisions
        if isinstance(d, Alert)
    ]
    assert alerts == [(30, 500), (54, 900), (24 * 60 + 30, 500)]
