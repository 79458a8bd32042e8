"""tests/bench/bench_lending_replay.py (issue 28's figures): the estate copy it replays with
the lending settings really has them (and the example estate is left alone), a bad estate is
a clear error, and its table puts both runs' figures side by side."""

from __future__ import annotations

from pathlib import Path

import pytest

from compiler.api import compile_dir
from kliqued.engine import EstateIndex
from tests.bench.bench_lending_replay import ESTATE, LENDING, Run, SetupError, table, with_lending


def test_the_copy_has_the_lending_settings_and_the_estate_is_untouched(tmp_path: Path) -> None:
    before = {p: p.read_bytes() for p in ESTATE.rglob("*.yaml")}
    copy = with_lending(ESTATE, tmp_path / "estate", LENDING)
    est = compile_dir(copy).estate
    assert est is not None
    index = EstateIndex.build(est)
    assert index.fair and index.least_lost_work
    assert {gi.protect_ms for gi in index.groups.values()} == {30 * 60_000}
    assert {p: p.read_bytes() for p in ESTATE.rglob("*.yaml")} == before


def test_an_estate_that_cannot_take_them_is_a_clear_error(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "settings.yaml").write_text("settings:\n  lending: {order: fair}\n")
    with pytest.raises(SetupError, match="already has 'lending'"):
        with_lending(src, tmp_path / "a", LENDING)
    (src / "settings.yaml").write_text("pools: []\n")
    with pytest.raises(SetupError, match="no file has a block 'settings:'"):
        with_lending(src, tmp_path / "b", LENDING)


def _report(p50: float, rebalanced: int, lost: float, util: float) -> dict:
    g = {
        "wait_s": {"p50": p50, "p95": 3600.0, "max": 3600.0},
        "preemptions": {"reclaimed": 1, "rebalanced": rebalanced, "budget": 0},
        "lost_gpu_hours": lost,
        "gpu_hours": 10.0,
    }
    return {
        "pools": {"p": {"utilisation": util}},
        "overall": dict(g, utilisation_all_pools=util),
        "groups": {"team-a": g},
    }


def test_the_table_shows_both_runs_side_by_side() -> None:
    text = table(
        Run("ordered", _report(60.0, 0, 1.0, 0.5), 1.0),
        Run("fair", _report(120.0, 3, 2.25, 0.625), 2.0),
    )
    assert "| p | 50.0% | 62.5% |" in text
    # changed cells read ordered -> fair, unchanged ones once
    assert "| team-a | 1m00s → 2m00s | 1h00m00s | 1 | 0 → 3 | 0 | 1.0 → 2.2 | 10 |" in text
