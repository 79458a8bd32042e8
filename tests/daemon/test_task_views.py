"""What a task's owner reads about it (issue 10): GPU-hours while it holds GPUs (bug 8), why
it ended and who ended it (bug 5), a refusal that is not an empty answer (bug 11)."""

from __future__ import annotations

import time

from .server import Server
from .test_endpoints import submit, task_state, wait_for


def test_gpu_hours_count_the_current_placement(server: Server, who) -> None:
    t = submit(server, who.bob, {"resource": "team-a/sized", "gpus": 2, "command": ["x"]})
    try:
        wait_for(lambda: task_state(server, t["id"])["state"] == "placed")
        time.sleep(0.4)
        first = task_state(server, t["id"], who.bob)["gpu_hours"]
        assert first >= 2 * 0.4 / 3600, first
        time.sleep(0.2)
        assert task_state(server, t["id"], who.bob)["gpu_hours"] > first
    finally:
        ended = server.ok("POST", f"/v1/tasks/{t['id']}/cancel", token=who.bob)
    assert ended["gpu_hours"] >= first
    assert task_state(server, t["id"])["gpu_hours"] == ended["gpu_hours"]  # closed: stable


def test_a_filter_beyond_ones_rights_is_refused_not_empty(server: Server, who) -> None:
    status, body = server.call("GET", "/v1/tasks?user=alice", token=who.bob)
    assert status == 403 and body["error"]["message"].startswith(
        "bob may not see alice's tasks"), body
    status, body = server.call("GET", "/v1/tasks?group=team-b", token=who.bob)
    assert status == 403 and "bob may not see group team-b's tasks" in body["error"]["message"]
    status, body = server.call("GET", "/v1/tasks?user=nobody", token=who.bob)
    assert status == 403
    for token, query in ((who.alice, "user=bob"), (who.walter, "user=bob"),
                         (who.bob, "user=bob"), (who.bob, "group=team-a"),
                         (who.admin, "user=alice")):
        assert server.call("GET", f"/v1/tasks?{query}", token=token)[0] == 200, query
