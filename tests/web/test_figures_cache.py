"""The usage page's CIO figures are cached per month and scope (kliqued/web/data.py
``FiguresCache``): reused for a minute; older ones are computed again, in the background
for a live refresh, awaited for a page opened; on a real DuckDB store with the example
estate's capacity."""

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


def test_figures_are_reused_for_a_minute_and_a_page_opened_never_gets_older_ones(store) -> None:
    s, pool = store
    cache = FiguresCache()

    async def run() -> None:
        now = T0 + 100 * HOUR
        first = await cache.get(s, None, dt.date(2026, 11, 17), now)
        assert set(first) >= {"estate_use", "idle", "as_of"}
        assert "lending" not in first and "business_units" not in first  # only the page's
        assert used(first) == 0
        s.commit_sync(
            Batch(
                ops=[
                    ops.opens([interval(1, pool, T0)]),
                    ops.closes([("T-1#1", T0 + 2 * HOUR, "finished")]),
                ]
            )
        )
        # younger than a minute: the held ones, for a page and its live refresh alike
        assert await cache.get(s, None, NOV, now + FIGURES_FRESH_MS - 1) is first
        assert await cache.get(s, None, NOV, now + FIGURES_FRESH_MS - 1, fresh=True) is first
        # older: a live refresh gets the held ones while new ones are computed ...
        at = now + FIGURES_FRESH_MS
        assert await cache.get(s, None, NOV, at) is first
        # ... and a page opened waits for the new ones (issue 32: a 14-minute-old all-zero
        # snapshot on first view)
        opened = await cache.get(s, None, NOV, at, fresh=True)
        assert opened is not first and used(opened) == pytest.approx(2.0)
        assert opened["as_of"] > first["as_of"]
        # the month's capacity counts up to now: an unchanged ledger still ages
        later = await cache.get(s, None, NOV, at + FIGURES_FRESH_MS, fresh=True)
        assert later is not opened and later["as_of"] > opened["as_of"]
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
