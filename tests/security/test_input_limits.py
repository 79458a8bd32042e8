"""Finding 6 (issue 9): a cap on each task's data and on each user's stored task data;
listings in pages bounded in bytes as well as in count, which the SDK follows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kliqued.daemon import limits
from kliqued.sdk.client import Client
from tests.harness.daemon import Server
from tests.harness.inproc import InProcServer
from tests.harness.typed import present

from .edge_client import alive, send

# A command and a payload just under their caps: 128 KiB of data a task.
BIG_ARG = "x" * (limits.MAX_COMMAND_BYTES - 16)
BIG_PAYLOAD = "y" * (limits.MAX_PAYLOAD_BYTES - 16)
PER_TASK = limits.command_bytes(["echo", BIG_ARG]) + limits.payload_bytes(BIG_PAYLOAD)


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory):
    s = InProcServer(tmp_path_factory.mktemp("edge-limits")).start()
    s.alice = s.token({"user": "alice"})  # type: ignore[attr-defined]
    s.bob = s.token({"user": "bob"})  # type: ignore[attr-defined]
    yield s
    code = s.stop()
    assert code == 0, s.log()


def _big(srv: Server, token: str) -> tuple[int, dict]:
    body = {"resource": "team-a/sized", "command": ["echo", BIG_ARG], "payload": BIG_PAYLOAD}
    return send(srv, "POST", "/v1/tasks", json.dumps(body).encode(), token)


def test_payload_and_command_over_their_caps_are_a_413_naming_them(srv: Server) -> None:
    body = {"resource": "team-a/sized", "command": ["x"], "payload": "p" * limits.MAX_PAYLOAD_BYTES}
    status, data = send(srv, "POST", "/v1/tasks", json.dumps(body).encode(), srv.alice)
    assert status == 413 and data["error"]["message"].startswith("/payload"), data
    body = {"resource": "team-a/sized", "command": ["x" * 1000] * 70}
    status, data = send(srv, "POST", "/v1/tasks", json.dumps(body).encode(), srv.alice)
    assert status == 413 and data["error"]["message"].startswith("/command"), data


def test_a_users_stored_task_data_is_capped_and_freed_when_tasks_end(srv: Server) -> None:
    fits = limits.MAX_USER_BYTES // PER_TASK
    ids = []
    for _ in range(fits):
        status, data = _big(srv, srv.alice)
        assert status == 201, data
        ids.append(data["id"])
    status, data = _big(srv, srv.alice)
    assert status == 429 and data["error"]["code"] == "user-quota", data
    assert "alice" in data["error"]["message"]
    # Another user is not affected.
    status, data = _big(srv, srv.bob)
    assert status == 201, data
    srv.ok("POST", f"/v1/tasks/{data['id']}/cancel", token=srv.bob)
    # The cap holds after a restart (rebuilt by replay) ...
    assert srv.stop() == 0
    srv.start()
    status, data = _big(srv, srv.alice)
    assert status == 429, data
    # ... and an ended task frees its room.
    srv.ok("POST", f"/v1/tasks/{ids[0]}/cancel", token=srv.alice)
    status, data = _big(srv, srv.alice)
    assert status == 201, data
    assert alive(srv)


def test_listing_pages_are_bounded_in_bytes_and_the_sdk_follows_them(srv: Server) -> None:
    # The previous test left alice about MAX_USER_BYTES of tasks: more than a page holds.
    status, page = send(srv, "GET", "/v1/tasks?limit=1000", token=srv.alice)
    assert status == 200
    size = len(json.dumps(page))
    assert page["next"] is not None and size < 2 * limits.MAX_PAGE_BYTES, size
    every = list(Client(srv.url, srv.alice).tasks(page_size=1000))
    assert len(every) > len(page["tasks"])
    assert len({t["id"] for t in every}) == len(every)
    status, ev = send(srv, "GET", "/v1/events?limit=1000", token=srv.admin)
    assert status == 200 and ev["next"] is not None
    assert len(json.dumps(ev)) < 2 * limits.MAX_PAGE_BYTES
    events = list(Client(srv.url, present(srv.admin)).events(page_size=1000))
    assert len(events) > len(ev["events"])


def test_the_worker_listing_is_paged(srv: Server) -> None:
    worker = srv.token({"worker": True, "pool": "pool-1"})
    for i in range(5):
        srv.ok(
            "POST",
            "/v1/workers/register",
            {"worker_id": f"w-page-{i}", "pool": "pool-1"},
            token=worker,
            headers={"X-Klique-Worker-Key": "k" * 43},
        )
    seen: list[str] = []
    after = ""
    while True:
        status, page = send(srv, "GET", f"/v1/workers?limit=2&after={after}", token=worker)
        assert status == 200 and len(page["workers"]) <= 2, page
        seen += [w["id"] for w in page["workers"]]
        if page["next"] is None:
            break
        after = page["next"]
    assert seen == [f"w-page-{i}" for i in range(5)]


if __name__ == "__main__":
    pytest.main([__file__, "-q", str(Path(__file__))])
