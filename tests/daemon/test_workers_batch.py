"""Additions to the worker protocol on a real ``kliqued serve``: batched reports (one
transaction, one result each), a worker's own stops (idle limit: the task ends; a drain
hands it back without a loss), ``DELETE /workers/{id}``, the ``pool=`` filters, and the
replay of all of it."""

from __future__ import annotations

import pytest

from .fleet import FleetServer, HttpWorker, running_fleet
from tests.harness.wait import wait_for


@pytest.fixture
def fs(tmp_path):
    yield from running_fleet(tmp_path)


def _placed(fs: FleetServer, n: int) -> list[str]:
    ids = [fs.submit(fs.erin, "team-b/one", ["true"]) for _ in range(n)]
    wait_for(lambda: all(fs.task(t)["state"] == "placed" for t in ids), 5, "placed")
    return ids


def reports(w: HttpWorker, items: list[dict]) -> tuple[int, dict]:
    return w.call(
        "POST",
        f"/v1/workers/{w.id}/reports",
        {
            "reports": [
                {"exit_code": None, "signal": None, "at": None, "message": None, **i} for i in items
            ]
        },
    )


def test_batched_reports_one_result_each(fs) -> None:
    w = HttpWorker(fs, fs.wt, "w-b")
    w.register()
    a, b = _placed(fs, 2)
    leases = w.lease(wait=1)
    assert sorted(x["task"] for x in leases) == sorted([a, b])
    st, body = reports(
        w,
        [
            {"task": a, "epoch": 1, "event": "started"},
            {"task": a, "epoch": 1, "event": "finished", "exit_code": 0},
            {"task": b, "epoch": 7, "event": "finished", "exit_code": 0},
            {"task": b, "epoch": 1, "event": "failed", "exit_code": 3},
        ],
    )
    assert st == 200, body
    assert [(r["task"], r["status"]) for r in body["results"]] == [
        (a, 200),
        (a, 200),
        (b, 409),
        (b, 200),
    ]
    assert body["results"][2]["error"]["code"] == "stale-epoch"
    ta, tb = fs.task(a), fs.task(b)
    assert (ta["end_reason"], ta["exit_code"]) == ("finished", 0)
    assert (tb["end_reason"], tb["exit_code"]) == ("failed", 3)
    # a retry of the whole batch changes nothing
    st, again = reports(w, [{"task": a, "epoch": 1, "event": "finished", "exit_code": 0}])
    assert st == 200 and again["results"][0]["status"] == 200
    assert [e["kind"] for e in fs.events(a)] == [
        "submitted",
        "placed",
        "leased",
        "started",
        "ended",
    ]
    # another pool's worker token cannot report for this worker
    other = fs.token({"worker": True, "pool": "other"})
    assert (
        fs.call(
            "POST",
            f"/v1/workers/{w.id}/reports",
            {"reports": [{"task": a, "epoch": 1, "event": "finished"}]},
            other,
        )[0]
        == 403
    )


def test_idle_stop_ends_the_task_and_a_drain_hands_it_back_without_a_loss(fs) -> None:
    w = HttpWorker(fs, fs.wt, "w-i")
    w.register()
    a, b = _placed(fs, 2)
    w.lease(wait=1)
    assert (
        reports(
            w,
            [
                {"task": a, "epoch": 1, "event": "started"},
                {"task": b, "epoch": 1, "event": "started"},
            ],
        )[0]
        == 200
    )
    st, body = reports(
        w,
        [
            {
                "task": a,
                "epoch": 1,
                "event": "stopped",
                "reason": "idle",
                "exit_code": 0,
                "message": "idle: cpu 30m",
            },
            {
                "task": b,
                "epoch": 1,
                "event": "stopped",
                "reason": "shutdown",
                "signal": "SIGKILL",
                "message": "shutdown: the worker is shutting down (--drain)",
            },
        ],
    )
    assert st == 200 and [r["status"] for r in body["results"]] == [200, 200], body
    ta = fs.task(a)
    assert (ta["state"], ta["end_reason"]) == ("ended", "stopped: idle (cpu 30m)")
    assert fs.sql(f"SELECT end_reason FROM ledger WHERE task = '{a}'") == [
        ["stopped: idle (cpu 30m)"]
    ]
    tb = fs.task(b)
    assert tb["last_preemption"]["kind"] == "returned"
    # not lost: leased again at the next epoch, at the front
    got = w.lease(wait=2)
    assert [(x["task"], x["epoch"]) for x in got] == [(b, 2)]
    # the single-report endpoint reads an old worker's idle message the same way
    (c,) = _placed(fs, 1)
    w.lease(wait=1)
    assert w.report(c, 1, "started")[0] == 200
    assert w.report(c, 1, "stopped", 0, message="idle: wall 8h")[0] == 200
    assert fs.task(c)["end_reason"] == "stopped: idle (wall 8h)"
    # all of it survives a restart
    assert fs.stop() == 0
    fs.start()
    assert fs.task(a)["end_reason"] == "stopped: idle (cpu 30m)"
    assert fs.task(b)["epoch"] == 2


def test_deregister_requeues_and_pool_filters(fs) -> None:
    w = HttpWorker(fs, fs.wt, "w-d")
    w.register()
    HttpWorker(fs, fs.token({"worker": True, "pool": "other"}), "w-o", pool="other").register()
    assert [x["id"] for x in fs.ok("GET", "/v1/workers?pool=bare")["workers"]] == ["w-d"]
    assert [x["id"] for x in fs.ok("GET", "/v1/workers?pool=other")["workers"]] == ["w-o"]
    (a,) = _placed(fs, 1)
    assert [t["id"] for t in fs.ok("GET", "/v1/tasks?pool=bare")["tasks"]] == [a]
    assert fs.ok("GET", "/v1/tasks?pool=other")["tasks"] == []
    w.lease(wait=1)
    assert w.report(a, 1, "started")[0] == 200
    assert fs.call("DELETE", "/v1/workers/w-d", token=fs.erin)[0] == 403
    st, body = w.call("DELETE", "/v1/workers/w-d")
    assert st == 200 and body == {"worker": "w-d", "pool": "bare", "requeued": [a]}
    t = fs.task(a)
    assert t["last_preemption"]["kind"] == "lost" and t["epoch"] == 1
    assert w.report(a, 1, "finished", 0)[0] == 409  # its copy is fenced
    assert w.call("POST", "/v1/workers/w-d/heartbeat", {"running": []})[0] == 404
    assert [x["id"] for x in fs.ok("GET", "/v1/workers")["workers"]] == ["w-o"]
    assert w.call("DELETE", "/v1/workers/w-d")[0] == 404
    assert fs.stop() == 0
    fs.start()
    assert [x["id"] for x in fs.ok("GET", "/v1/workers")["workers"]] == ["w-o"]
