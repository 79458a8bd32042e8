"""Log compaction (issue 18, part 3): after a snapshot, the lease events of tasks ended past
the retention leave the log; every decision and request stays, the task answers the same,
a running task keeps its events, and a full replay of the compacted log rebuilds the same
state. Both backends."""

from __future__ import annotations

from pathlib import Path

import duckdb

from tests.daemon.fleet import FleetServer, HttpWorker
from tests.daemon.test_durability import snapshot
from tests.harness.typed import present
from tests.harness.wait import wait_for

NOISE = {"leased", "started", "stopped", "unleased"}


def kinds(fs: FleetServer, task: str) -> list[str]:
    return [e["kind"] for e in fs.events(task=task)]


def test_compaction_keeps_decisions_and_answers(tmp_path: Path, db: str | None) -> None:
    fs = FleetServer(
        tmp_path,
        extra=["--compact-after", "0s", "--keep-ended", "0", "--snapshot-every", "1000000"],
        db=db,
        ttl="60s",
    ).start()
    erin = fs.token({"user": "erin"})
    w = HttpWorker(fs, fs.token({"worker": True, "pool": "bare"}), "w1")
    w.register()
    done, running = (fs.submit(erin, "team-b/one", ["true"]) for _ in range(2))
    wait_for(lambda: fs.task(running)["state"] == "placed" and fs.task(done)["state"] == "placed")
    leases = {x["task"]: x["epoch"] for x in w.lease()}
    assert set(leases) == {done, running}
    for tid, epoch in leases.items():
        assert w.report(tid, epoch, "started")[0] == 200
    st, body = w.report(done, leases[done], "finished", 0)
    assert st == 200
    view = body["task"]
    assert view["state"] == "ended" and view["worker"] == "w1"
    assert NOISE & set(kinds(fs, done)) == {"leased", "started"}
    before = snapshot(fs)
    assert fs.stop() == 0  # a clean stop snapshots, and compaction follows it

    log = fs.log()
    assert "log compaction: 2 worker events" in log, log
    fs.start()
    assert kinds(fs, done) == ["submitted", "placed", "ended"]  # the decisions stay
    assert NOISE & set(kinds(fs, running)) == {"leased", "started"}  # not ended: kept
    assert fs.task(done) == view  # the history keeps the worker, epoch, start, exit code
    after = snapshot(fs)
    assert after == before
    # a full replay of the compacted log: the same state
    assert fs.stop() == 0
    con = duckdb.connect(str(fs.local_db))
    try:
        con.execute("DELETE FROM snapshots")
        assert present(con.execute("SELECT sum(removed) FROM log_compactions").fetchone())[0] == 2
    finally:
        con.close()
    fs.start()
    assert "after the snapshot" not in fs.log().split("--- start")[-1]
    assert snapshot(fs) == before
    assert fs.stop() == 0
