"""What a task's owner reads about it (issue 10): GPU-hours while it holds GPUs (bug 8), why
it ended and who ended it (bug 5), a refusal that is not an empty answer (bug 11)."""

from __future__ import annotations

from .fleet import FleetServer, HttpWorker
from tests.harness.daemon import Server
from tests.harness.inproc import InProcServer
from .test_endpoints import submit, task_state
from tests.harness.wait import wait_for


def test_gpu_hours_count_the_current_placement(server: InProcServer, who) -> None:
    t = submit(server, who.bob, {"resource": "team-a/sized", "gpus": 2, "command": ["x"]})
    try:
        wait_for(lambda: task_state(server, t["id"])["state"] == "placed")
        server.step(0.4)  # the daemon's time passes; the test does not sleep through it
        first = task_state(server, t["id"], who.bob)["gpu_hours"]
        assert first >= 2 * 0.4 / 3600, first
        server.step(0.2)
        assert task_state(server, t["id"], who.bob)["gpu_hours"] > first
    finally:
        ended = server.ok("POST", f"/v1/tasks/{t['id']}/cancel", token=who.bob)
    assert ended["gpu_hours"] >= first
    assert task_state(server, t["id"])["gpu_hours"] == ended["gpu_hours"]  # closed: stable


def test_a_filter_beyond_ones_rights_is_refused_not_empty(server: Server, who) -> None:
    status, body = server.call("GET", "/v1/tasks?user=alice", token=who.bob)
    assert status == 403 and body["error"]["message"].startswith("bob may not see alice's tasks"), (
        body
    )
    status, body = server.call("GET", "/v1/tasks?group=team-b", token=who.bob)
    assert status == 403 and "bob may not see group team-b's tasks" in body["error"]["message"]
    status, body = server.call("GET", "/v1/tasks?user=nobody", token=who.bob)
    assert status == 403
    for token, query in (
        (who.alice, "user=bob"),
        (who.walter, "user=bob"),
        (who.bob, "user=bob"),
        (who.bob, "group=team-a"),
        (who.admin, "user=alice"),
    ):
        assert server.call("GET", f"/v1/tasks?{query}", token=token)[0] == 200, query


def test_why_a_task_ended_and_who_ended_it(tmp_path) -> None:
    """A failure's exit code and the worker's message, a cancellation's author and reason,
    shown to the owner in the task itself, the same after a restart (bug 5)."""
    s = FleetServer(tmp_path).start()
    try:
        erin, bob = s.token({"user": "erin"}), s.token({"user": "bob"})
        w = HttpWorker(s, s.token({"worker": True, "pool": "bare"}), "w-1")
        w.register()
        failed = s.submit(bob, "team-b/one", ["python", "train.py"])
        wait_for(lambda: s.task(failed)["state"] == "placed")
        assert [x["task"] for x in w.lease()] == [failed]
        assert w.report(failed, 1, "started")[0] == 200
        assert w.report(failed, 1, "failed", 3, message="CUDA out of memory")[0] == 200
        cancelled = s.submit(bob, "team-b/one", ["sleep", "1"])
        st, t = s.call("POST", f"/v1/tasks/{cancelled}/cancel", {"reason": "wrong data set"}, erin)
        assert st == 200, t
        queued = s.submit(bob, "team-b/one", ["true"])
        s.ok("POST", f"/v1/tasks/{queued}/cancel", token=bob)
        for _ in range(2):
            t = s.ok("GET", f"/v1/tasks/{failed}", token=bob)
            assert (t["end_reason"], t["exit_code"]) == ("failed", 3)
            assert t["end"] == {
                "text": "failed: exit code 3: CUDA out of memory",
                "by": None,
                "message": "CUDA out of memory",
            }
            t = s.ok("GET", f"/v1/tasks/{cancelled}", token=bob)
            assert t["end"] == {
                "text": "cancelled by user:erin: wrong data set",
                "by": "user:erin",
                "message": None,
            }
            t = s.ok("GET", f"/v1/tasks/{queued}", token=bob)
            assert t["end"]["text"] == "cancelled by user:bob" and t["end"]["by"] == "user:bob"
            assert s.ok("GET", f"/v1/tasks/{queued}", token=bob)["end_reason"] == "cancelled"
            s.stop()
            s.start()
        st, body = s.call("POST", f"/v1/tasks/{queued}/cancel", {"reason": 7}, bob)
        assert st == 400 and "reason" in body["error"]["message"]
    finally:
        s.stop()
