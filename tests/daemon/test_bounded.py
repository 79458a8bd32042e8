"""Bounded state (issue 18, part 3): ended tasks leave memory for the task history and stay
queryable with the same answers; on both backends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb

from tests.daemon.fleet import FleetServer, HttpWorker
from tests.daemon.test_durability import CMD, all_tasks, settled
from tests.harness.daemon import Server
from tests.harness.wait import wait_for


def records_in_memory(s: Server) -> int:
    status, text = s.call("GET", "/metrics", token=s.token("role:planner"))
    assert status == 200
    for line in text.splitlines():
        if line.startswith("klique_task_records "):
            return int(float(line.split()[1]))
    raise AssertionError("no klique_task_records in /metrics")


def history_ids(s: Server) -> dict[str, int]:
    """Each task id in the history, with how many rows it has."""
    con = duckdb.connect(str(s.local_db), read_only=True)
    try:
        return dict(con.execute("SELECT id, count(*) FROM task_history GROUP BY id").fetchall())
    finally:
        con.close()


def test_ended_tasks_leave_memory_and_answer_the_same(tmp_path: Path, db: str | None) -> None:
    s = Server(tmp_path, db=db)
    s.extra = ["--keep-ended", "0"]
    s.start()
    bob = s.token({"user": "bob"})
    erin = s.token({"user": "erin"})
    keyed = s.call(
        "POST",
        "/v1/tasks",
        {"resource": "team-a/one", **CMD},
        bob,
        headers={"Idempotency-Key": "once"},
    )[1]["id"]
    ended = [keyed] + [
        s.ok("POST", "/v1/tasks", {"resource": "team-a/one", **CMD}, bob)["id"] for _ in range(3)
    ]
    live = s.ok("POST", "/v1/tasks", {"resource": "team-b/one", **CMD}, erin)["id"]
    wait_for(lambda: s.ok("GET", f"/v1/tasks/{ended[0]}")["state"] == "placed")
    views: dict[str, dict[str, Any]] = {}
    for t in ended:  # the cancel's answer is the ended task's view, made from memory
        views[t] = s.ok("POST", f"/v1/tasks/{t}/cancel", token=bob)
        assert views[t]["state"] == "ended"
    settled(s)
    wait_for(lambda: records_in_memory(s) == 1, what="the ended tasks evicted")

    for t in ended:  # read back from the history: the same answer
        assert s.ok("GET", f"/v1/tasks/{t}", token=bob) == views[t]
        assert s.ok("POST", f"/v1/tasks/{t}/cancel", token=bob) == views[t]  # no change
        assert s.call("GET", f"/v1/tasks/{t}", token=erin)[0] == 404  # still not erin's
        assert s.ok("GET", f"/v1/events?task={t}")["events"][0]["kind"] == "submitted"
    assert s.ok("GET", f"/v1/tasks/{live}")["state"] in ("queued", "placed")
    # listings merge memory and history in id order; state=ended comes from the history
    listed = all_tasks(s)
    assert [t["id"] for t in listed] == sorted(ended + [live])
    assert {t["id"]: t for t in listed if t["id"] in views} == views
    page = s.ok("GET", "/v1/tasks?state=ended&limit=2", token=bob)
    assert [t["id"] for t in page["tasks"]] == sorted(ended)[:2] and page["next"]
    rest = s.ok("GET", f"/v1/tasks?state=ended&after={page['next']}", token=bob)
    assert [t["id"] for t in rest["tasks"]] == sorted(ended)[2:] and rest["next"] is None
    assert s.ok("GET", "/v1/tasks?state=ended", token=erin)["tasks"] == []
    # a retried Idempotency-Key finds the evicted task
    status, again = s.call(
        "POST",
        "/v1/tasks",
        {"resource": "team-a/one", **CMD},
        bob,
        headers={"Idempotency-Key": "once"},
    )
    assert (status, again) == (200, views[keyed])

    # kill -9 and a restart without a snapshot: the whole log replays, the tasks end and
    # leave memory again; each stays in the history once, with the same answers
    s.kill()
    s.extra = ["--keep-ended", "0", "--snapshot-every", "0"]
    s.start()
    wait_for(lambda: records_in_memory(s) == 1, what="the ended tasks evicted again")
    for t in ended:
        assert s.ok("GET", f"/v1/tasks/{t}", token=bob) == views[t]
    assert [t["id"] for t in all_tasks(s)] == sorted(ended + [live])
    assert s.stop() == 0
    assert history_ids(s) == {t: 1 for t in ended}
    # and a restart keeping them all in memory reads the same from memory
    s.extra = []
    s.start()
    assert records_in_memory(s) == 1 + len(ended)
    for t in ended:
        assert s.ok("GET", f"/v1/tasks/{t}", token=bob) == views[t]
    assert s.stop() == 0
    assert history_ids(s) == {t: 1 for t in ended}


def test_a_worker_late_on_an_evicted_task_gets_the_same_answers(tmp_path: Path) -> None:
    """A worker's retried report and log upload for a task that left memory since: the same
    answers as before (a retry changes nothing), and its log is still read."""
    fs = FleetServer(tmp_path, extra=["--keep-ended", "0"], ttl="60s").start()
    erin = fs.token({"user": "erin"})
    w = HttpWorker(fs, fs.token({"worker": True, "pool": "bare"}), "w1")
    w.register()
    tid = fs.submit(erin, "team-b/one", ["true"])
    wait_for(lambda: fs.task(tid)["state"] == "placed")
    (lease,) = w.lease()
    assert w.report(tid, lease["epoch"], "started")[0] == 200
    assert w.call("POST", f"/v1/tasks/{tid}/log?offset=0&epoch=1", raw=b"hi\n") == (
        200,
        {"size": 3},
    )
    st, first = w.report(tid, 1, "finished", 0)
    assert st == 200 and first["task"]["state"] == "ended"
    wait_for(lambda: records_in_memory(fs) == 0, what="the task evicted")
    assert w.report(tid, 1, "finished", 0) == (200, first)
    assert w.report(tid, 1, "failed", 1)[0] == 200  # the lease is closed: nothing changes
    assert w.report(tid, 2, "finished", 0)[0] == 409
    assert w.call("POST", f"/v1/tasks/{tid}/log?offset=3&epoch=1", raw=b"more\n") == (
        200,
        {"size": 8},
    )
    assert fs.call("GET", f"/v1/tasks/{tid}/log", token=erin)[1] == "hi\nmore\n"
    assert fs.task(tid) == first["task"]
    assert fs.stop() == 0
