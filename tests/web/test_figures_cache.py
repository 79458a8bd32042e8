"""The usage page's CIO figures are cached per month and scope (kliqued/web/data.py
``FiguresCache``): computed again once the ledger changed and the held ones are older than
a minute, reused otherwise; on a real DuckDB store with the example estate's capacity."""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path

import pytest

from compiler.api import compile_dir
from kliqued.daemon.storage.store import Batch, Store
from kliqued.ledger import ops
from kliqued.ledger.writer import IntervalRow
from kliqued.web.data import FIGURES_FRESH_MS, FiguresCache

ROOT = Path(__file__).resolve().parents[2]
NOV = dt.date(2026, 11, 1)
T0 = int(dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc).timestamp() * 1000)
HOUR = 3_600_000


@pytest.fixture
def store(tmp_path: Path):
    result = compile_dir(ROOT / "estate")
    assert result.estate is not None, result.diagnostics
    s = Store(str(tmp_path / "k.duckdb"))
    s.ensure_schema()
    s.commit_sync(
        Batch(ops=[ops.ReplacePrices(result.estate), ops.RecordEstate(result.estate, T0)])
    )
    pool = result.estate.pools[0]
    yield s, pool
    s.close()


def used(fig: dict) -> float:
    return sum(float(r["gpu_hours"]) for r in fig["estate_use"])


def interval(n: int, pool, start: int) -> IntervalRow:
    return IntervalRow(
        f"T-{n}#1",
        f"T-{n}",
        "alice",
        None,
        "team-a",
        "team-a",
        "default",
        "team-a/one",
        pool.name,
        pool.gpu_type,
        1000,
        1000,
        start,
        None,
    )


def test_figures_are_reused_until_the_ledger_changed_and_a_minute_passed(store) -> None:
    s, pool = store
    cache = FiguresCache()

    async def run() -> None:
        now = T0 + 100 * HOUR
        first = await cache.get(s, None, dt.date(2026, 11, 17), now)
        assert set(first) >= {"estate_use", "idle", "as_of"}
        assert "lending" not in first and "business_units" not in first  # only the page's
        assert used(first) == 0
        # unchanged ledger: the same figures at any age
        assert await cache.get(s, None, NOV, now + 10 * FIGURES_FRESH_MS) is first
        s.commit_sync(
            Batch(
                ops=[
                    ops.opens([interval(1, pool, T0)]),
                    ops.closes([("T-1#1", T0 + 2 * HOUR, "finished")]),
                ]
            )
        )
        # changed, but the held figures are younger than a minute: still those
        assert await cache.get(s, None, NOV, now + FIGURES_FRESH_MS - 1) is first
        # older than a minute and the ledger moved: the held ones answer while the new
        # ones are computed in the background, then the new ones
        at = now + FIGURES_FRESH_MS
        assert await cache.get(s, None, NOV, at) is first
        later = first
        for _ in range(200):
            later = await cache.get(s, None, NOV, at)
            if later is not first:
                break
            await asyncio.sleep(0.02)
        assert later is not first and used(later) == pytest.approx(2.0)
        assert later["as_of"] > first["as_of"]
        # another scope is its own entry
        scoped = await cache.get(s, ["team-b"], NOV, at)
        assert scoped is not later and used(scoped) == 0

    asyncio.run(run())


def test_warm_computes_the_whole_estates_month_before_anyone_asks(store) -> None:
    s, _ = store
    cache = FiguresCache()

    async def run() -> None:
        cache.warm(s, dt.date(2026, 11, 30), T0 + HOUR)
        await asyncio.sleep(0)
        got = await cache.get(s, None, NOV, T0 + 5 * HOUR)
        assert got["as_of"] == "2026-11-01T01:00:00Z"  # the warm-up's, not this call's
        assert got["period"] == "2026-11"

    asyncio.run(run())
