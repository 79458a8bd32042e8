"""Ledger benchmark: GPU-hours and cost by group and month over 10 million ledger rows.

Target (issue 4): within 1 s on a 2-core machine, median of 5. The figure with the target is
``usage_monthly`` (the closed intervals pre-aggregated by the writer, the open ones live);
``usage_by_month`` (every interval split at query time) and ``usage_priced`` (the ASOF join)
are reported beside it. The rows are generated in SQL
(``INSERT INTO ledger SELECT ... FROM range(N)``) into a temporary DuckDB file with the real
schema (primary key included), in start order as the daemon appends them: a year of
placements by 30 groups, 500 users and 40 projects on 4 GPU types, one of which changes price
in the middle of the year; most intervals last minutes to two days, 1 in 50 up to 40 days (so
a few percent cross a month end), and the last 1,000 are still open.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import duckdb

from kliqued.ledger import IntervalRow, close_intervals, ensure_schema, open_intervals
from kliqued.ledger.schema import rebuild_monthly
from tests.harness.typed import present

ROWS = 10_000_000

GENERATE = """
INSERT INTO ledger
SELECT 't-' || i || '#1', 't-' || i, 'user-' || (i * 7 % 500), 'project-' || (i * 13 % 40),
       'group-' || (i % 30), 'group-' || (i % 30), 'profile-' || (i % 8),
       'group-' || (i % 30) || '/profile-' || (i % 8), 'pool-' || (i % 6),
       ['h100-80gb', 'l40s-48gb', 'l4-24gb', 'h100-80gb-neocloud'][1 + i % 4],
       CAST([0.25, 1, 1, 2, 4, 8][1 + i % 6] AS DECIMAL(12,3)),
       CAST([1, 1, 1.5, 0.5][1 + i % 4] AS DECIMAL(12,3)),
       start_at,
       CASE WHEN i >= {n} - 1000 THEN NULL
            ELSE start_at + to_milliseconds(CASE WHEN hash(i) % 50 = 0
                                                 THEN hash(i * 3) % 3456000000
                                                 ELSE hash(i * 3) % 172800000 END) END,
       CASE WHEN i >= {n} - 1000 THEN NULL ELSE 'finished' END,
       'sha256:bench',
       'bu-' || (i % 30 % 2) || '/dept-' || (i % 30 % 6) || '/group-' || (i % 30),
       ['api', 'api', 'api', 'schedule', 'pipeline'][1 + i % 5]
FROM (SELECT i, TIMESTAMP '2025-01-01' + to_milliseconds(i * {step}) AS start_at
      FROM range({n}) t(i))
"""

PRICES = """
INSERT INTO prices (gpu_type, per_gpu_hour, currency, effective_from) VALUES
  ('h100-80gb', 1.85, 'EUR', TIMESTAMP '2025-01-01'),
  ('l40s-48gb', 0.75, 'EUR', TIMESTAMP '2025-01-01'),
  ('l4-24gb', 0.35, 'EUR', TIMESTAMP '2025-01-01'),
  ('h100-80gb-neocloud', 2.35, 'EUR', TIMESTAMP '2025-01-01'),
  ('h100-80gb-neocloud', 1.95, 'EUR', TIMESTAMP '2025-07-01')
"""

BY_GROUP_MONTH = """
SELECT "group", month, sum(gpu_hours) AS gpu_hours, sum(cost) AS cost
FROM {view} GROUP BY ALL ORDER BY ALL"""

BY_UNIT_MONTH = """
SELECT business_unit, month, gpu_hours, cost FROM usage_by_business_unit ORDER BY ALL"""

ASOF = """
SELECT "group", date_trunc('month', start_at) AS month, sum(gpu_hours), sum(cost)
FROM usage_priced GROUP BY ALL"""


def _timed(conn, sql: str, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        conn.execute(sql).fetchall()
        out.append(time.perf_counter() - t)
    return out


def _row(name: str, times: list[float], size: str, target: float | None) -> dict:
    return {
        "name": name,
        "median_s": statistics.median(times),
        "max_s": max(times),
        "size": size,
        "target_s": target,
    }


def run(rows: int = ROWS, repeat: int = 5) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        conn = duckdb.connect(
            str(Path(tmp) / "ledger.duckdb"), config={"enable_external_access": False}
        )
        ensure_schema(conn)
        conn.execute(PRICES)
        step = 365 * 24 * 3_600_000 // rows  # a year of placements
        t = time.perf_counter()
        conn.execute(GENERATE.format(n=rows, step=max(step, 1)))
        conn.execute("CHECKPOINT")
        gen = time.perf_counter() - t
        t = time.perf_counter()
        conn.execute("BEGIN")
        rebuild_monthly(conn)  # what the writer maintains close by close, built in one go
        conn.execute("COMMIT")
        build = time.perf_counter() - t
        pieces, months, kept = present(
            conn.execute(
                "SELECT count(*), count(DISTINCT month), (SELECT count(*) FROM ledger_monthly) "
                "FROM usage_by_month"
            ).fetchone()
        )
        size = (
            f"{rows / 1e6:g}M intervals, {pieces - rows:,} more month pieces, {months} "
            f"months, 30 groups; {kept:,} ledger_monthly rows"
        )
        # one transaction: one now for both (the open intervals' current month grows between
        # two; on a month's first days by more than the check's millionth)
        conn.execute("BEGIN TRANSACTION READ ONLY")
        by_month = conn.execute(BY_GROUP_MONTH.format(view="usage_by_month")).fetchall()
        monthly = conn.execute(BY_GROUP_MONTH.format(view="usage_monthly")).fetchall()
        conn.execute("ROLLBACK")
        assert len(by_month) == len(monthly) and all(
            a[:2] == b[:2]
            and float(abs(a[2] - b[2])) < 1e-6 * max(1, float(a[2]))
            and float(abs(a[3] - b[3])) < 1e-6 * max(1, float(a[3]))
            for a, b in zip(by_month, monthly)
        )
        out = [
            _row(
                "GPU-hours and cost by group and month (usage_monthly)",
                _timed(conn, BY_GROUP_MONTH.format(view="usage_monthly"), repeat),
                size,
                1.0,
            ),
            _row(
                "same, computed from the 10M intervals at query time (usage_by_month)",
                _timed(conn, BY_GROUP_MONTH.format(view="usage_by_month"), repeat),
                f"{rows / 1e6:g}M intervals, generated in {gen:.0f} s; ledger_monthly "
                f"built from them in {build:.1f} s",
                None,
            ),
            _row(
                "GPU-hours and cost by business unit and month (usage_by_business_unit)",
                _timed(conn, BY_UNIT_MONTH, repeat),
                size + ", 2 business units",
                1.0,
            ),
            _row(
                "GPU-hours and cost by group and start month (usage_priced, ASOF join)",
                _timed(conn, ASOF, max(1, repeat // 2)),
                f"{rows / 1e6:g}M intervals",
                None,
            ),
        ]
        out.append(_write_bench(conn))
        conn.close()
    return out


def _write_bench(conn, batch: int = 5000, rounds: int = 4) -> dict:
    """What one engine pass pays to record placements and preemptions on a large ledger."""
    start = 1_767_225_600_000
    times = []
    for r in range(rounds):
        rows = [
            IntervalRow(
                f"w-{r}-{i}#1",
                f"w-{r}-{i}",
                "alice",
                None,
                "group-1",
                "group-1",
                "profile-1",
                "group-1/profile-1",
                "pool-1",
                "h100-80gb",
                1000,
                1000,
                start + i,
                "sha256:bench",
                "bu-1/dept-1/group-1",
            )
            for i in range(batch)
        ]
        t = time.perf_counter()
        conn.execute("BEGIN")
        open_intervals(conn, rows)
        close_intervals(conn, [(x.interval_id, start + 3_600_000, "finished") for x in rows])
        conn.execute("COMMIT")
        times.append(time.perf_counter() - t)
    return _row(
        f"open + close {batch:,} intervals in one transaction (with ledger_monthly)",
        times,
        f"on the {ROWS / 1e6:g}M-row ledger",
        None,
    )


if __name__ == "__main__":
    for r in run():
        print(
            f"{r['name']}: median {r['median_s'] * 1000:.0f} ms, max {r['max_s'] * 1000:.0f} ms"
            f" ({r['size']})"
        )
