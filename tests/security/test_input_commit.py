"""Finding 1, defence in depth: no single request's data may make a group commit fatal.

The edge refuses the text DuckDB cannot hold (test_input_text.py); this checks the layer
below it with a real Daemon, Store (DuckDB) and Sequencer: a request whose events cannot be
stored, committed in one batch with good ones, is refused alone; the others are durable, the
sequencer goes on, and the log has no gap in its sequence numbers.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from compiler.api import compile_dir
from kliqued.daemon.auth import Principal
from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.state.prepared import Prepared
from kliqued.daemon.state.submission import Submission
from kliqued.daemon.errors import ApiError
from kliqued.daemon.events import Event
from kliqued.daemon.api.metrics import Metrics
from kliqued.daemon.state.loop import Sequencer
from kliqued.daemon.storage.store import Store

from tests.harness.daemon import SMALL_ESTATE

ALICE = Principal("user", "alice")


def _fields(command: list[str]) -> dict:
    return {
        "resource": "team-a/one",
        "user": "alice",
        "project": None,
        "gpus_milli": None,
        "command": command,
        "payload": None,
        "labels": {},
    }


async def _run(db: Path) -> tuple[list, Sequencer, Daemon]:
    store = Store(str(db))
    store.ensure_schema()
    d = Daemon()
    seq = Sequencer(d, store, 3600.0, metrics=Metrics(d))
    runner = asyncio.create_task(seq.run())
    compiled = compile_dir(SMALL_ESTATE).estate
    assert compiled is not None
    await seq.submit(
        lambda now, ov: d.prepare_estate(compiled, "test", "test", now, ov), barrier=True
    )

    def bad(now: int, ov: object) -> Prepared:  # what the edge would refuse, let through
        return Prepared([Event("submitted", "t-bad", ALICE.text, data={"x": "\ud800"})])

    good = [
        lambda now, ov, i=i: d.prepare_submit(
            ALICE, Submission(**_fields(["echo", str(i)])), now, ov
        )
        for i in range(3)
    ]
    # One batch: nothing yields between these submissions, so one cycle takes all four.
    futs = [asyncio.ensure_future(seq.submit(f)) for f in (good[0], bad, good[1], good[2])]
    results = await asyncio.gather(*futs, return_exceptions=True)
    # And with a pass in the same cycle: its placements (events and ledger intervals) are
    # committed before the requests, alone.
    seq.request_pass(0)
    futs = [asyncio.ensure_future(seq.submit(f)) for f in (bad, good[0])]
    late = await asyncio.gather(*futs, return_exceptions=True)
    assert isinstance(late[0], ApiError) and isinstance(late[1], tuple), late
    await seq.stop()
    await runner
    store.close()
    return results, seq, d


def test_one_unstorable_request_is_refused_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "k.duckdb"
    results, seq, d = asyncio.run(_run(db))
    assert caplog.text.count("committing its parts one by one") == 2
    assert seq.failed is None
    err = results[1]
    assert isinstance(err, ApiError) and err.status == 422 and err.code == "unstorable"
    ok = [r for i, r in enumerate(results) if i != 1]
    assert all(isinstance(r, tuple) and r[0] == 201 for r in ok), results
    assert {r[1] for r in ok} <= set(d.records) and len(d.records) == 4
    assert any(rec.state == "placed" for rec in d.records.values())
    store = Store(str(db))
    try:
        rows = store.conn.execute("SELECT seq, kind FROM events ORDER BY seq").fetchall()
    finally:
        store.close()
    assert [s for s, _ in rows] == list(range(1, len(rows) + 1))  # no gap
    assert [k for _, k in rows].count("submitted") == 4
    assert "placed" in [k for _, k in rows]
    assert d.seq == len(rows)


if __name__ == "__main__":
    pytest.main([__file__, "-q"])
