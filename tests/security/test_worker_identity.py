"""A worker token stands for a pool, not a worker (issue 9 finding 7): every worker proves
which worker it is with the key it keeps in its state dir, so another worker of the same pool
cannot take over its id, its leases or its reports; and a revoked worker token's open long
poll ends at once, with no lease (finding 13). Real ``kliqued serve``, real HTTP."""

from __future__ import annotations

import signal
import stat
import threading
import time

import pytest

from tests.daemon.fleet import PY, HttpWorker, RealWorker, running_fleet
from tests.harness.wait import wait_for


@pytest.fixture
def fs(tmp_path):
    yield from running_fleet(tmp_path, ttl="10s")  # a restart on a loaded machine is slow


def _leased(fs, w: HttpWorker) -> tuple[str, int]:
    tid = fs.submit(fs.erin, "team-b/one", ["sleep", "60"])
    wait_for(lambda: fs.task(tid)["state"] == "placed", 10, "placed")
    (lease,) = w.lease(wait=2)
    assert w.report(tid, lease["epoch"], "started")[0] == 200
    return tid, lease["epoch"]


def test_another_worker_of_the_pool_cannot_take_over_an_id_or_its_leases(fs) -> None:
    real = HttpWorker(fs, fs.wt, "w-real")
    real.register()
    tid, epoch = _leased(fs, real)
    thief = HttpWorker(fs, fs.wt, "w-real")  # same pool token, same id, its own key
    st, body = thief.call("POST", "/v1/workers/register", {"worker_id": "w-real", "pool": "bare"})
    assert st == 409 and body["error"]["code"] == "worker-id-taken", body
    assert thief.call("POST", "/v1/workers/w-real/heartbeat", {"running": []})[0] == 403
    assert thief.call("POST", "/v1/workers/w-real/lease?wait=0", {"free_gpus": [0]})[0] == 403
    assert thief.call("DELETE", "/v1/workers/w-real")[0] == 403
    st, body = thief.report(tid, epoch, "finished", 0)
    assert st == 403 and body["error"]["code"] == "not-lease-holder", body
    assert "w-real" in body["error"]["message"]
    assert (
        thief.call("POST", f"/v1/tasks/{tid}/log?offset=0&epoch={epoch}", raw=b"forged")[0] == 403
    )
    # a worker of its own (registered) cannot report on another's lease in a batch either
    other = HttpWorker(fs, fs.wt, "w-other")
    other.register()
    st, body = other.call(
        "POST",
        "/v1/workers/w-other/reports",
        {"reports": [{"task": tid, "epoch": epoch, "event": "finished", "exit_code": 0}]},
    )
    assert st == 200 and body["results"][0]["status"] == 403, body
    t = fs.task(tid)
    assert (t["state"], t["worker"], t["epoch"]) == ("running", "w-real", 1)
    assert [w["id"] for w in fs.ok("GET", "/v1/workers?pool=bare")["workers"]] == [
        "w-other",
        "w-real",
    ]
    refused = fs.events(kind="worker_refused")
    assert {e["data"]["call"] for e in refused} >= {
        "register",
        "heartbeat",
        "lease",
        "deregister",
        "report",
        "log",
    }
    assert all(e["actor"] == "worker:bare" for e in refused)
    assert any(e["data"].get("holder") == "w-real" and e["task"] == tid for e in refused)
    # the real holder is unaffected: it reports, and its registration is still its own
    assert real.report(tid, epoch, "finished", 0)[0] == 200
    assert fs.task(tid)["end_reason"] == "finished"
    assert real.register()["worker_id"] == "w-real"


def test_a_worker_call_without_its_key_is_refused_naming_the_header(fs) -> None:
    st, body = fs.call(
        "POST", "/v1/workers/register", {"worker_id": "w-x", "pool": "bare"}, token=fs.wt
    )
    assert st == 400 and "X-Klique-Worker-Key" in body["error"]["message"], body
    st, body = fs.call(
        "POST",
        "/v1/workers/register",
        {"worker_id": "w-x", "pool": "bare"},
        token=fs.wt,
        headers={"X-Klique-Worker-Key": "short"},
    )
    assert st == 400 and "malformed" in body["error"]["message"], body


def test_the_worker_key_is_never_shown(fs) -> None:
    w = HttpWorker(fs, fs.wt, "w-k")
    w.register()
    (ev,) = fs.events(kind="worker_registered")
    assert "key_hash" not in ev["data"] and w.key not in str(ev)
    assert w.key not in str(fs.ok("GET", "/v1/workers"))


def test_a_binding_survives_a_control_plane_restart(fs) -> None:
    real = HttpWorker(fs, fs.wt, "w-real")
    real.register()
    assert fs.stop() == 0
    fs.start()
    thief = HttpWorker(fs, fs.wt, "w-real")
    st, body = thief.call("POST", "/v1/workers/register", {"worker_id": "w-real", "pool": "bare"})
    assert st == 409, body
    assert real.register()["worker_id"] == "w-real"


def test_revoking_a_worker_token_ends_its_open_long_poll_without_a_lease(fs) -> None:
    token = fs.ok("POST", "/v1/tokens", {"worker": True, "pool": "bare"}, expect=201)
    w = HttpWorker(fs, token["token"], "w-rev")
    w.register()
    got: list = []

    def poll() -> None:
        got.append(w.call("POST", "/v1/workers/w-rev/lease?wait=2", {"free_gpus": [0, 1]}))

    t = threading.Thread(target=poll)
    t.start()
    time.sleep(0.5)  # the poll is parked
    t0 = time.monotonic()
    fs.ok("DELETE", f"/v1/tokens/{token['id']}", expect=204)
    tid = fs.submit(fs.erin, "team-b/one", ["true"])  # work arrives right after
    t.join(10)
    ((st, body),) = got
    assert st == 401 and "revoked" in body["error"]["message"], body
    assert time.monotonic() - t0 < 1.5, "the poll ended at the revocation, not at its wait"
    time.sleep(0.5)
    assert fs.task(tid)["epoch"] == 0  # nobody was handed the task
    assert fs.events(task=tid, kind="leased") == []


def test_a_real_worker_keeps_its_key_across_a_restart_and_adopts_its_task(fs, tmp_path) -> None:
    w = RealWorker(fs, fs.wt, tmp_path / "w1", gpus="0")
    try:
        w.start()
        tid = fs.submit(fs.erin, "team-b/one", [PY, "-c", "import time; time.sleep(3)"])
        wait_for(lambda: fs.task(tid)["state"] == "running", 20, "running")
        key_file = tmp_path / "w1" / "worker-key"
        key = key_file.read_text()
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        w.signal(signal.SIGTERM)  # a plain stop: the task keeps running
        w.proc.wait(10)  # type: ignore[union-attr]
        w.start()
        wait_for(lambda: fs.task(tid)["state"] == "ended", 30, "ended")
        t = fs.task(tid)
        assert (t["end_reason"], t["epoch"]) == ("finished", 1), (t, w.stderr())
        assert key_file.read_text() == key
        assert fs.events(kind="worker_refused") == []
    finally:
        w.stop()
