"""The worker protocol on a real ``kliqued serve`` (docs/worker-protocol.md): leases by long
poll, idempotent and fenced reports, stop instructions in heartbeats, lost workers, replay;
first spoken by hand over HTTP (a real client), then with real ``klique-worker`` processes:
a preempted process receives SIGTERM while the reclaiming task starts, ``kill -9`` of a
worker requeues its tasks after the TTL and the stale copy is stopped, and a worker restart
loses nothing."""

from __future__ import annotations

import functools

import json
import signal
import threading
import time

import pytest

from .fleet import PY, FleetServer, HttpWorker, pid_alive, real_workers, running_fleet, trap
from tests.harness.wait import wait_for


@pytest.fixture
def fs(request, tmp_path):
    ttl = request.node.get_closest_marker("worker_ttl")
    yield from running_fleet(tmp_path, ("alice", "erin"), **({"ttl": ttl.args[0]} if ttl else {}))


def placed(s: FleetServer, tid: str) -> bool:
    return s.task(tid)["state"] in ("placed", "running")


# ---------------------------------------------------------------------- by hand, over HTTP
def test_a_long_poll_answers_when_work_is_placed_and_reports_are_idempotent(fs) -> None:
    w = HttpWorker(fs, fs.wt, "w-one")
    assert w.register() == {
        "worker_id": "w-one",
        "heartbeat_ttl_s": 1.5,
        "poll_wait_s": 2.0,
        "running": [],
        "settings": {},
    }  # the pool's: none here
    got: list = []
    poll = threading.Thread(target=lambda: got.append((w.lease(wait=2), time.monotonic())))
    poll.start()
    time.sleep(0.3)  # the poll is parked before the submission: its answer is timed from it
    t0 = time.monotonic()
    tid = fs.submit(fs.erin, "team-b/one", ["echo", "hi"], labels={"k": "v"})
    poll.join(5)
    ((leases, answered),) = got
    assert answered - t0 < 1.0, "the held poll answers as soon as the task is placed"
    assert leases == [
        {
            "task": tid,
            "epoch": 1,
            "command": ["echo", "hi"],
            "payload": None,
            "gpus": 1,
            "resource": "team-b/one",
            "user": "erin",
            "project": None,
            "labels": {"k": "v"},
            "grace_s": 2.0,
            "env": {},
            "settings": {},
        }
    ]
    assert fs.task(tid)["state"] == "placed"
    for _ in range(2):
        assert w.report(tid, 1, "started")[0] == 200
    t = fs.task(tid)
    assert (t["state"], t["worker"], t["epoch"]) == ("running", "w-one", 1) and t["started_at"]
    for _ in range(2):  # a retried upload at the same offset writes nothing twice
        assert w.call("POST", f"/v1/tasks/{tid}/log?offset=0&epoch=1", raw=b"hi\n") == (
            200,
            {"size": 3},
        )
    assert w.call("POST", f"/v1/tasks/{tid}/log?offset=9", raw=b"gap") == (200, {"size": 3})
    first = w.report(tid, 1, "finished", 0)
    again = w.report(tid, 1, "finished", 0)
    assert first[0] == again[0] == 200 and first[1]["task"]["state"] == "ended"
    assert w.report(tid, 1, "failed", 1)[0] == 200  # the lease is closed: nothing changes
    t = fs.task(tid)
    assert (t["end_reason"], t["exit_code"], t["signal"]) == ("finished", 0, None)
    assert [e["kind"] for e in fs.events(tid)] == [
        "submitted",
        "placed",
        "leased",
        "started",
        "ended",
    ]
    rows = fs.sql(
        f"SELECT interval_id, end_reason, end_at IS NOT NULL FROM ledger WHERE task = '{tid}'"
    )
    assert rows == [[f"{tid}#1", "finished", True]]
    assert fs.call("GET", f"/v1/tasks/{tid}/log", token=fs.erin)[1] == "hi\n"
    assert w.report(tid, 2, "finished", 0)[0] == 409


def test_worker_tokens_see_only_their_pool_and_logs_only_their_readers(fs) -> None:
    other = fs.token({"worker": True, "pool": "other"})
    w = HttpWorker(fs, fs.wt, "w-bare")
    w.register()
    stranger = HttpWorker(fs, other, "w-bare")
    assert stranger.call("POST", "/v1/workers/w-bare/lease?wait=0", {"free_gpus": []})[0] == 403
    assert stranger.call("POST", "/v1/workers/w-bare/heartbeat", {"running": []})[0] == 403
    st, body = fs.call(
        "POST", "/v1/workers/register", {"worker_id": "w-x", "pool": "bare"}, token=other
    )
    assert st == 403, body
    assert (
        fs.call(
            "POST", "/v1/workers/register", {"worker_id": "w-x", "pool": "bare"}, token=fs.alice
        )[0]
        == 403
    )
    assert fs.call("POST", "/v1/workers/w-bare/lease", {"free_gpus": []})[0] == 403  # admin
    tid = fs.submit(fs.erin, "team-b/one", ["true"])
    wait_for(lambda: placed(fs, tid))
    assert [x["task"] for x in w.lease()] == [tid]
    assert stranger.report(tid, 1, "started")[0] == 403
    assert stranger.call("POST", f"/v1/tasks/{tid}/log?offset=0", raw=b"x")[0] == 403
    assert w.call("POST", f"/v1/tasks/{tid}/log?offset=0", raw=b"out\n")[1] == {"size": 4}
    bob = fs.token({"user": "bob"})  # team-b, not its admin: not his task
    walter = fs.token({"user": "walter"})  # admin of the department above team-b
    for token, status in (
        (fs.erin, 200),
        (fs.admin, 200),
        (walter, 200),
        (bob, 404),
        (fs.alice, 404),
        (fs.wt, 403),
    ):
        assert fs.call("GET", f"/v1/tasks/{tid}/log", token=token)[0] == status, token
    assert fs.ok("GET", "/v1/workers", token=fs.wt)["workers"][0]["id"] == "w-bare"
    assert fs.ok("GET", "/v1/workers", token=other)["workers"] == []
    assert w.report(tid, 1, "finished", 0)[0] == 200


def test_a_lost_worker_is_fenced_and_its_task_requeued_at_the_front(fs) -> None:
    w1, w2 = HttpWorker(fs, fs.wt, "w-1"), HttpWorker(fs, fs.wt, "w-2")
    w1.register()
    tid = fs.submit(fs.erin, "team-b/one", ["sleep", "100"])
    wait_for(lambda: placed(fs, tid))
    assert [x["epoch"] for x in w1.lease()] == [1]
    assert w1.report(tid, 1, "started")[0] == 200
    # w-1 goes silent: after its TTL (1.5 s) it is lost and the task back in its queue.
    wait_for(lambda: fs.task(tid)["preemptions"] == 1, 6, "the worker declared lost")
    t = fs.task(tid)
    assert t["last_preemption"]["kind"] == "lost"
    assert t["last_preemption"]["text"] == "worker lost"
    lost = fs.events(kind="worker_lost")
    assert lost[-1]["data"]["worker"] == "w-1"
    assert lost[-1]["data"]["tasks"] == [{"task": tid, "epoch": 1, "status": "active"}]
    # The pool has no live worker left: the task waits, saying why, until w-2 registers.
    wait_for(
        lambda: (fs.task(tid)["waiting_reason"] or {}).get("text") == "no live worker in bare",
        5,
        "the reason",
    )
    w2.register()
    wait_for(lambda: placed(fs, tid), 5, "placed again")
    assert [x["epoch"] for x in w2.lease()] == [2]
    # The stale copy is refused: report, log; its heartbeats must register again, then say
    # stop at once.
    st, body = w1.report(tid, 1, "finished", 0)
    assert st == 409 and body["error"]["code"] == "stale-epoch"
    assert w1.call("POST", f"/v1/tasks/{tid}/log?offset=0&epoch=1", raw=b"x")[0] == 409
    assert w1.call("POST", "/v1/workers/w-1/heartbeat", {"running": []})[0] == 404
    assert w1.register()["running"] == []
    stop = w1.heartbeat([(tid, 1)])["stop"]
    assert [(s["task"], s["epoch"], s["reason"]) for s in stop] == [(tid, 1, "stale-epoch")]
    assert w2.report(tid, 2, "finished", 0)[0] == 200
    t = fs.task(tid)
    assert (t["state"], t["end_reason"], t["epoch"], t["worker"]) == ("ended", "finished", 2, "w-2")
    rows = fs.sql(f"SELECT interval_id, end_reason FROM ledger WHERE task = '{tid}' ORDER BY 1")
    assert rows == [[f"{tid}#1", "worker lost"], [f"{tid}#2", "finished"]]


def test_a_task_lost_three_times_fails(fs) -> None:
    tid = fs.submit(fs.erin, "team-b/one", ["sleep", "100"])
    for n in range(1, 4):
        w = HttpWorker(fs, fs.wt, f"w-{n}")
        w.register()
        wait_for(lambda: placed(fs, tid), 5, "placed")
        assert [x["epoch"] for x in w.lease()] == [n]
        # a worker that says it lost the task counts like a lost worker
        if n == 2:
            assert w.report(tid, n, "failed", message="worker-lost: no record")[0] == 200
        else:
            wait_for(
                lambda: fs.task(tid)["preemptions"] >= n or fs.task(tid)["state"] == "ended",
                6,
                f"loss {n}",
            )
    t = fs.task(tid)
    assert (t["state"], t["end_reason"]) == ("ended", "worker lost 3 times")
    rows = fs.sql(f"SELECT end_reason FROM ledger WHERE task = '{tid}' ORDER BY 1")
    assert rows == [["worker lost"]] * 3


def test_a_task_lost_three_times_reads_the_same_after_a_restart(fs) -> None:
    """Live and replay apply the same event through the same reducer: the worker's message
    of the third loss is the task's end message before a restart and after it."""
    tid = fs.submit(fs.erin, "team-b/one", ["sleep", "100"])
    for n in range(1, 4):
        w = HttpWorker(fs, fs.wt, f"w-{n}")
        w.register()
        wait_for(lambda: placed(fs, tid), 5, "placed")
        assert [x["epoch"] for x in w.lease()] == [n]
        assert w.report(tid, n, "failed", message=f"worker-lost: gone {n}")[0] == 200
    before = fs.task(tid)
    assert before["state"] == "ended"
    assert "worker-lost: gone 3" in json.dumps(before)
    assert fs.stop() == 0
    fs.start()
    assert fs.task(tid) == before


def test_stops_go_out_in_heartbeats_and_a_stopping_task_is_not_leased_again(fs) -> None:
    w = HttpWorker(fs, fs.wt, "w-s")
    w.register()
    b1 = fs.submit(fs.erin, "team-b/one", ["sleep", "100"])
    b2 = fs.submit(fs.erin, "team-b/one", ["sleep", "100"])
    wait_for(lambda: placed(fs, b1) and placed(fs, b2))
    assert sorted(x["task"] for x in w.lease()) == [b1, b2]
    running = [(b1, 1), (b2, 1)]
    assert w.heartbeat(running)["stop"] == []
    a1 = fs.submit(fs.alice, "team-a/one", ["true"])  # within team-a's reservation: reclaims
    wait_for(lambda: placed(fs, a1), 5, "the reclaim")
    victim = b2 if fs.task(b2)["state"] == "queued" else b1
    keeper = b1 if victim == b2 else b2
    stop = w.heartbeat(running)["stop"]
    assert stop == [
        {
            "task": victim,
            "epoch": 1,
            "reason": "preempted",
            "text": "reclaimed by team-a",
            "grace_s": 2.0,
        }
    ]
    fs.ok("POST", f"/v1/tasks/{keeper}/cancel", token=fs.erin)
    stops = {s["task"]: s["reason"] for s in w.heartbeat(running)["stop"]}
    assert stops == {victim: "preempted", keeper: "cancelled"}
    # The keeper's GPU is free now: the victim is placed again, but not leased while its
    # first attempt is still stopping (two copies never run at once).
    wait_for(lambda: placed(fs, victim), 5, "placed again")
    assert [x["task"] for x in w.lease(free=[0, 1])] == [a1]
    assert w.report(victim, 1, "stopped", None, "SIGTERM")[0] == 200
    assert w.report(victim, 1, "stopped", None, "SIGTERM")[0] == 200  # idempotent
    assert [(x["task"], x["epoch"]) for x in w.lease(free=[1])] == [(victim, 2)]
    assert w.report(keeper, 1, "stopped", 143)[0] == 200
    assert fs.task(keeper)["end_reason"] == "cancelled"
    kinds = [e["kind"] for e in fs.events(victim)]
    assert kinds == ["submitted", "placed", "leased", "preempted", "placed", "stopped", "leased"]
    for tid, e in ((a1, 1), (victim, 2)):
        assert w.report(tid, e, "finished", 0)[0] == 200


def test_a_restart_rebuilds_workers_and_leases(fs) -> None:
    w = HttpWorker(fs, fs.wt, "w-r")
    w.register()
    tid = fs.submit(fs.erin, "team-b/one", ["sleep", "100"])
    wait_for(lambda: placed(fs, tid))
    w.lease()
    w.report(tid, 1, "started")
    before = fs.task(tid)
    assert fs.stop() == 0
    fs.start()
    after = fs.task(tid)
    assert after.pop("gpu_hours") >= before.pop("gpu_hours")  # it runs: they grow
    assert after.pop("lost_work_s") >= before.pop("lost_work_s")  # and so does its lost work
    assert after == before
    workers = fs.ok("GET", "/v1/workers")["workers"]
    assert workers[0]["leases"] == [{"task": tid, "epoch": 1, "status": "active"}]
    assert w.register()["running"] == [{"task": tid, "epoch": 1}]
    assert w.report(tid, 1, "finished", 0)[0] == 200
    assert fs.task(tid)["end_reason"] == "finished"


# ---------------------------------------------------------------------- real workers


@pytest.fixture
def real(fs, tmp_path):
    yield from real_workers(fs, tmp_path)


def test_a_real_worker_runs_a_command_and_its_log_comes_back(fs, real) -> None:
    real()
    tid = fs.submit(fs.erin, "team-b/one", [PY, "-c", "print('hello')"])
    bad = fs.submit(fs.erin, "team-b/one", ["sh", "-c", "echo oops >&2; exit 3"])
    wait_for(lambda: fs.task(tid)["state"] == fs.task(bad)["state"] == "ended", 15)
    t, b = fs.task(tid), fs.task(bad)
    assert (t["end_reason"], t["exit_code"]) == ("finished", 0)
    assert (b["end_reason"], b["exit_code"]) == ("failed", 3)
    assert fs.call("GET", f"/v1/tasks/{tid}/log", token=fs.erin)[1] == "hello\n"
    assert fs.call("GET", f"/v1/tasks/{bad}/log", token=fs.erin)[1] == "oops\n"


def test_a_preempted_process_gets_sigterm_and_the_reclaiming_task_starts(
    fs, real, tmp_path
) -> None:
    real(gpus="0,1")
    b1 = fs.submit(fs.erin, "team-b/one", trap(tmp_path, "b1"))
    b2 = fs.submit(fs.erin, "team-b/one", trap(tmp_path, "b2"))
    wait_for(lambda: fs.task(b1)["state"] == fs.task(b2)["state"] == "running", 15, "b running")
    # "running" is the worker's word that the process started, not that its SIGTERM handler
    # is set: a Python task prints "started" once it is (the stop could come first, and the
    # task then die of the signal without its checkpoint)

    def handlers_set(task_id: str) -> bool:
        log = fs.call("GET", f"/v1/tasks/{task_id}/log", token=fs.erin)[1] or ""
        return str(log).startswith("started")

    for t in (b1, b2):
        wait_for(functools.partial(handlers_set, t), 15, "b's handlers set")
    a1 = fs.submit(fs.alice, "team-a/one", trap(tmp_path, "a1"))
    wait_for(lambda: fs.task(a1)["state"] == "running", 15, "the reclaiming task running")
    victim = b2 if fs.task(b2)["state"] == "queued" else b1
    name = "b2" if victim == b2 else "b1"
    assert (tmp_path / f"{name}.term").read_text() == "TERM"  # it got SIGTERM, checkpointed
    other = "b1" if name == "b2" else "b2"
    assert not (tmp_path / f"{other}.term").exists()
    v = fs.task(victim)
    assert v["last_preemption"]["text"] == "reclaimed by team-a" and v["state"] == "queued"
    stopped = fs.events(victim, "stopped")
    assert stopped and stopped[0]["data"]["reason"] == "preempted"
    wait_for(
        lambda: (fs.call("GET", f"/v1/tasks/{a1}/log", token=fs.alice)[1] or "").startswith(
            "started"
        ),
        5,
        "the reclaiming task's log",
    )


@pytest.mark.worker_ttl("4s")  # the orphan of a killed worker stops 2 s after its last call
def test_kill_9_of_a_worker_requeues_its_tasks_and_fences_the_old_copies(
    fs, real, tmp_path
) -> None:
    w = real(gpus="0,1")
    t1 = fs.submit(fs.erin, "team-b/one", trap(tmp_path, "k1"))
    wait_for(lambda: fs.task(t1)["state"] == "running", 15, "running")
    old_pid = int(
        wait_for(lambda: (tmp_path / "k1.pid").exists() and (tmp_path / "k1.pid").read_text())
    )
    w.kill9()
    assert pid_alive(old_pid)  # a worker's death leaves its tasks running for a while
    wait_for(lambda: fs.task(t1)["preemptions"] == 1, 15, "requeued after the TTL")
    t = fs.task(t1)
    assert t["last_preemption"]["text"] == "worker lost"
    ev = fs.events(t1, "preempted")[-1]["data"]
    assert (ev["kind"], ev["text"], ev["by"]) == ("lost", "worker lost", w.worker_id())
    # The worker comes back: the control plane no longer lists the old copy, which stops
    # (its report answered 409 stale-epoch), and the task runs again at epoch 2.
    w.start()
    wait_for(lambda: not pid_alive(old_pid), 15, "the old copy stopped")
    wait_for(
        lambda: fs.task(t1)["state"] == "running" and fs.task(t1)["epoch"] == 2,
        15,
        "running again at epoch 2",
    )
    wait_for(
        lambda: (tmp_path / "k1.pid").read_text() not in ("", str(old_pid)), 10, "the new copy"
    )


# A restart on a loaded machine can take more than 1.5 s, and an orphan stops at TTL - margin
# after the worker's last contact (workers/liveness.py): 0.75 s with a 1.5 s TTL.
@pytest.mark.worker_ttl("10s")
def test_a_worker_restart_loses_nothing(fs, real, tmp_path) -> None:
    w = real(gpus="0")
    tid = fs.submit(
        fs.erin,
        "team-b/one",
        [PY, "-c", "import time; print('a', flush=True); time.sleep(1.5); print('b')"],
    )
    wait_for(lambda: fs.task(tid)["state"] == "running", 15, "running")
    w.signal(signal.SIGTERM)
    w.proc.wait(10)  # type: ignore[union-attr]
    w.start()  # within the TTL: the control plane does not even notice
    wait_for(lambda: fs.task(tid)["state"] == "ended", 15, "ended")
    t = fs.task(tid)
    assert (t["end_reason"], t["epoch"], t["preemptions"]) == ("finished", 1, 0)
    assert fs.call("GET", f"/v1/tasks/{tid}/log", token=fs.erin)[1] == "a\nb\n"
    assert not fs.events(kind="worker_lost")
