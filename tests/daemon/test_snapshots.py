"""Snapshots (issue 18, part 3): a restart loads the last snapshot and replays only the log
after it, to the same state; a snapshot half-written or of another format is ignored (the
whole log replays); ``kill -9`` while a snapshot is being taken loses nothing. Both backends
(the snapshots are in the DuckDB file beside the history, the log in either)."""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pytest

from kliqued.daemon.state.snapshot import TEST_DELAY_ENV
from tests.daemon.test_durability import CMD, Load, all_tasks, last_seq, settled, snapshot
from tests.harness.daemon import Server
from tests.harness.typed import present
from tests.harness.wait import wait_for


def busy(s: Server, n: int = 12) -> None:
    bob = s.token({"user": "bob"})
    erin = s.token({"user": "erin"})
    ids = [
        s.ok("POST", "/v1/tasks", {"resource": "team-a/one", **CMD}, bob)["id"] for _ in range(n)
    ]
    for _ in range(3):
        s.ok("POST", "/v1/tasks", {"resource": "team-b/one", **CMD}, erin)
    for t in ids[::3]:
        s.ok("POST", f"/v1/tasks/{t}/cancel", token=bob)
    settled(s)


def started_from(s: Server) -> tuple[int, int]:
    """(events replayed, the snapshot's event or 0) of the last start."""
    m = re.findall(
        r"replayed (\d+) events \(\d+ tasks\) in [\d.]+ s"
        r"(?: after the snapshot at event (\d+))?",
        s.log(),
    )
    assert m, s.log()
    return int(m[-1][0]), int(m[-1][1] or 0)


def test_restart_replays_only_after_the_snapshot(tmp_path: Path, db: str | None) -> None:
    s = Server(tmp_path, db=db)
    s.extra = ["--snapshot-every", "25", "--keep-ended", "2"]
    s.start()
    busy(s)
    wait_for(lambda: "snapshot at event" in s.log(), what="a snapshot")
    busy(s, 4)  # and more after it
    before = snapshot(s)
    seq = last_seq(s)
    s.kill()  # no snapshot at stop: the start must replay the log after the last one
    s.start()
    wait_for(lambda: s.ok("GET", "/v1/engine")["last_pass_at"])
    replayed, at = started_from(s)
    assert at > 0 and replayed == seq - at, (replayed, at, seq)
    assert snapshot(s) == before
    assert s.stop() == 0  # a clean stop snapshots: the next start replays nothing
    s.start()
    assert started_from(s)[0] == 0
    assert snapshot(s) == before
    assert s.stop() == 0


@pytest.mark.parametrize("spoil", ["older-format", "half-written", "another-build"])
def test_a_bad_snapshot_is_ignored(tmp_path: Path, db: str | None, spoil: str) -> None:
    s = Server(tmp_path, db=db)
    s.extra = ["--keep-ended", "2"]
    s.start()
    busy(s)
    before = snapshot(s)
    seq = last_seq(s)
    assert s.stop() == 0  # it snapshots
    con = duckdb.connect(str(s.local_db))
    try:
        assert present(con.execute("SELECT count(*) FROM snapshots").fetchone())[0] >= 1
        con.execute(
            {
                "older-format": "UPDATE snapshots SET format = format - 1",
                "half-written": "UPDATE snapshots SET body = body[1:size // 2]",
                "another-build": "UPDATE snapshots SET build = 'x'",
            }[spoil]
        )
    finally:
        con.close()
    s.start()
    wait_for(lambda: s.ok("GET", "/v1/engine")["last_pass_at"])
    assert started_from(s) == (seq, 0)  # the whole log
    assert (
        "not used: "
        + {
            "older-format": "format",
            "half-written": "its body does not",
            "another-build": "written by another build",
        }[spoil]
        in s.log()
    )
    assert snapshot(s) == before
    assert s.stop() == 0


def test_kill_9_during_a_snapshot(
    tmp_path: Path, db: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = Server(tmp_path, db=db)
    s.extra = ["--snapshot-every", "30", "--keep-ended", "5"]
    monkeypatch.setenv(TEST_DELAY_ENV, "3")  # the snapshot's copy waits: the kill lands in it
    s.start()
    tokens = {"bob": s.token({"user": "bob"}), "erin": s.token({"user": "erin"})}
    load = Load(s, tokens)
    load.start()
    assert s.proc is not None
    children = Path(f"/proc/{s.proc.pid}/task/{s.proc.pid}/children")
    wait_for(
        lambda: children.read_text().split() or load.errors,
        timeout=60,
        what="a snapshot's process forked",
    )
    forked = children.read_text().split()
    s.kill()
    load.join(10)
    assert not load.errors, load.errors[:3]
    # the copy outlives its parent for a moment but holds neither the port nor the database
    assert forked and Path(f"/proc/{forked[0]}").exists()
    s.start()
    tasks = all_tasks(s)
    by_key: dict[str, list[str]] = {}
    for t in tasks:
        by_key.setdefault(t["labels"]["key"], []).append(t["id"])
    assert all(len(v) == 1 for v in by_key.values()), "a key made two tasks"
    for key, tid in load.acked.items():
        assert by_key.get(key) == [tid], key
    wait_for(
        lambda: (
            not Path(f"/proc/{forked[0]}").exists()
            or "Z" in Path(f"/proc/{forked[0]}/stat").read_text().split()[2]
        ),
        timeout=10,
        what="the orphaned copy to exit",
    )
    assert s.stop() == 0
