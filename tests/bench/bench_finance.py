"""Finance benchmark (issue 17): the FOCUS export of one month, and a chargeback statement,
over a 10-million-interval ledger.

Targets: the FOCUS export of a month within 10 s (the whole CSV text produced, as the daemon
streams it), a business unit's statement within 1 s; median of 3 on a 2-core machine. The
ledger is bench_ledger's (a year of placements by 30 groups in 2 business units, 4 GPU
types, one price change mid-year, 1,000 still open), with group paths, so the month exported
holds about a twelfth of the intervals.
"""

from __future__ import annotations

import tempfile
import time
from datetime import date
from pathlib import Path

import duckdb

from kliqued.ledger import ensure_schema
from kliqued.ledger.focus import focus_csv
from kliqued.ledger.schema import rebuild_monthly
from kliqued.ledger.statement import build

from .bench_ledger import GENERATE, PRICES, ROWS, _row

MONTH = date(2025, 6, 1)
PATHS = {
    **{f"group-{i}": f"bu-{i % 2}/dept-{i % 6}/group-{i}" for i in range(30)},
    "bu-0": "bu-0",
    "bu-1": "bu-1",
}


def _focus(conn) -> int:
    n = 0
    for chunk in focus_csv(conn, MONTH):
        n += chunk.count("\n")
    return n - 1


def run(rows: int = ROWS, repeat: int = 3) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        conn = duckdb.connect(
            str(Path(tmp) / "ledger.duckdb"), config={"enable_external_access": False}
        )
        ensure_schema(conn)
        conn.execute(PRICES)
        step = 365 * 24 * 3_600_000 // rows
        conn.execute(GENERATE.format(n=rows, step=max(step, 1)))
        conn.execute("CHECKPOINT")
        conn.execute("BEGIN")
        rebuild_monthly(conn)
        conn.execute("COMMIT")
        times, lines = [], 0
        for _ in range(repeat):
            t = time.perf_counter()
            lines = _focus(conn)
            times.append(time.perf_counter() - t)
        out = [
            _row(
                "FOCUS 1.2 export of one month (CSV text, focus_csv)",
                times,
                f"{lines:,} charges of a {rows / 1e6:g}M-interval ledger",
                10.0,
            )
        ]
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            st = build(conn, "bu-0", MONTH, PATHS, "EUR")
            times.append(time.perf_counter() - t)
        out.append(
            _row(
                "chargeback statement of a business unit for a month",
                times,
                f"{len(st.lines):,} lines, {rows / 1e6:g}M-interval ledger",
                1.0,
            )
        )
        conn.close()
    return out + lending(LENDING_ROWS, repeat)


LENDING_ROWS = 1_000_000
"""The ledger of the statements that derive lending: a tenth of the above (the derivation
costs its month's intervals times their policy's concurrency; 10M would take hours)."""

RESERVED = 200
"""Each of the 30 policies' reservation: about 250 GPUs held on average, so borrowing is
constant and every interval is expanded over its policy's segments (the worst case)."""

CAPACITY = f"""
INSERT INTO capacity SELECT TIMESTAMP '2025-01-01', 'r1', 'pool-' || i, 'on-prem',
       ['h100-80gb', 'l40s-48gb', 'l4-24gb', 'h100-80gb-neocloud'][1 + i % 4], 10000
FROM range(6) t(i);
INSERT INTO reservations SELECT TIMESTAMP '2025-01-01', 'r1', 'group-' || i, 'group-' || i,
       'bu-' || (i % 2) || '/dept-' || (i % 6) || '/group-' || i, {RESERVED},
       ['h100-80gb', 'l40s-48gb', 'l4-24gb', 'h100-80gb-neocloud'][1 + i % 4]
FROM range(30) t(i);
"""


def lending(rows: int, repeat: int = 3) -> list[dict]:
    """A statement with ``attribution.reserved_idle: group``, and with ``borrowed: split``
    too: both derive the month's borrowing and lending (kliqued/ledger/lending.py), once."""
    with tempfile.TemporaryDirectory() as tmp:
        conn = duckdb.connect(
            str(Path(tmp) / "ledger.duckdb"), config={"enable_external_access": False}
        )
        ensure_schema(conn)
        conn.execute(PRICES)
        conn.execute(GENERATE.format(n=rows, step=max(365 * 24 * 3_600_000 // rows, 1)))
        conn.execute(CAPACITY)
        conn.execute("BEGIN")
        rebuild_monthly(conn)
        conn.execute("COMMIT")
        conn.execute("CHECKPOINT")  # as the daemon's ledger is (and run()'s above)
        out = []
        for what, kw in (
            ("reserved idle billed to its group", {"reserved_idle": True}),
            ("reserved idle and borrowed: split", {"reserved_idle": True, "borrowed": "split"}),
        ):
            times = []
            for _ in range(repeat):
                t = time.perf_counter()
                st = build(conn, "bu-0", MONTH, PATHS, "EUR", **kw)
                times.append(time.perf_counter() - t)
            out.append(
                _row(
                    f"chargeback statement of a business unit for a month, {what}",
                    times,
                    f"{len(st.lines):,} lines, {rows / 1e6:g}M-interval "
                    f"ledger, 30 policies borrowing all month ({repeat} runs)",
                    1.0,
                )
            )
        conn.close()
    return out


if __name__ == "__main__":
    import sys

    for r in run(int(sys.argv[1]) if len(sys.argv) > 1 else ROWS):
        print(r)
