"""Gangs on a process pool (issue 15 part 2): a placed task over N nodes is leased to N
distinct workers at once, each with its node's share and the rendezvous environment
torchrun and DeepSpeed read; none starts before all N are taken; one member failing or lost
requeues the whole gang; a gang that does not find its members in time goes back to its
queue with the reason. Real ``kliqued serve``, real workers (and the protocol by hand where
a test needs to hold a worker still)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from .fleet import (
    ESTATE,
    PY,
    HttpWorker,
    pid_alive,
    read_json,
    real_workers,
    running_fleet,
    write_estate,
)
from tests.harness.wait import wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gang_estate(tmp: Path, port: int) -> Path:
    files = dict(ESTATE)
    files["pools.yaml"] = f"""\
pools:
  - name: bare
    kind: baremetal
    capacity: 4
    gpu_type: l40s-48gb
    nodes: {{count: 2, gpus: 2}}
    settings: {{master_port: "{port}"}}
  - name: other
    kind: baremetal
    capacity: 2
    gpu_type: l40s-48gb
"""
    files["policies.yaml"] = """\
policies:
  - name: team-a
    group: team-a
    reservation: 4
    limit: 4
  - name: team-b
    group: team-b
    reservation: 0
    limit: 4
"""
    files["profiles.yaml"] = """\
profiles:
  - name: one
    gpus: 1
    pools: [bare]
    policies: [team-a, team-b]
  - name: pair
    gpus: 4
    nodes: 2
    pools: [bare]
    policies: [team-b]
"""
    return write_estate(tmp / "estate", files)


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def fs(tmp_path, port):
    yield from running_fleet(
        tmp_path, estate=gang_estate(tmp_path, port), extra=["--gang-timeout", "3s"]
    )


@pytest.fixture
def real(fs, tmp_path):
    yield from real_workers(fs, tmp_path)


def rendezvous(tmp: Path) -> list[str]:
    """Each rank writes its environment; rank 0 listens on MASTER_PORT and waits for the
    others to say hello; the others connect to MASTER_ADDR:MASTER_PORT (no torch)."""
    return [
        PY,
        "-c",
        f"""
import json, os, socket, time
env = {{k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK",
       "NODE_RANK", "LOCAL_WORLD_SIZE", "CUDA_VISIBLE_DEVICES")}}
rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
addr, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
heard = []
if rank == 0:
    srv = socket.create_server(("0.0.0.0", port))
    srv.settimeout(30)
    for _ in range(world - 1):
        conn, _a = srv.accept()
        heard.append(int(conn.recv(16).decode()))
        conn.sendall(b"ok")
        conn.close()
else:
    deadline = time.time() + 30
    while True:
        try:
            c = socket.create_connection((addr, port), timeout=2)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)
    c.sendall(str(rank).encode())
    assert c.recv(16) == b"ok"
    c.close()
json.dump({{**env, "heard": heard}}, open({str(tmp)!r} + f"/rank{{rank}}.json", "w"))
""",
    ]


def live_workers(fs) -> int:
    return sum(w["lost_at"] is None for w in fs.ok("GET", "/v1/workers")["workers"])


def test_a_gang_runs_on_two_real_workers_with_the_rendezvous_environment(
    fs, real, tmp_path, port
) -> None:
    real("w1", "0,1")
    real("w2", "0,1")
    # (the engine wakes a waiting gang when GPUs free on its pool, not yet when the pool
    # gets its first worker: see the report of issue 15 part 2)
    wait_for(lambda: live_workers(fs) == 2, 20, "two workers")
    tid = fs.submit(fs.erin, "team-b/pair", rendezvous(tmp_path))
    wait_for(lambda: fs.task(tid)["state"] == "ended", 60, lambda: fs.task(tid))
    task = fs.task(tid)
    assert task["end_reason"] == "finished", task
    ranks = [read_json(tmp_path / f"rank{r}.json") for r in (0, 1)]
    assert all(ranks), ranks
    assert ranks[0]["heard"] == [1]
    for r, env in enumerate(ranks):
        assert env["RANK"] == env["NODE_RANK"] == str(r)
        assert env["WORLD_SIZE"] == "2" and env["LOCAL_WORLD_SIZE"] == "1"
        assert env["MASTER_PORT"] == str(port)
        assert env["CUDA_VISIBLE_DEVICES"] == "0,1"  # each node's share: 2 GPUs
    assert ranks[0]["MASTER_ADDR"] == ranks[1]["MASTER_ADDR"]
    leased = fs.events(tid, "leased")
    assert sorted(e["data"]["rank"] for e in leased) == [0, 1]
    assert len({e["data"]["worker"] for e in leased}) == 2  # two distinct workers


def test_no_member_starts_before_all_are_taken_and_a_late_gang_goes_back_with_the_reason(
    fs,
) -> None:
    w1 = HttpWorker(fs, fs.wt, "w1")
    w1.register()
    tid = fs.submit(fs.erin, "team-b/pair", ["true"])
    wait_for(lambda: fs.task(tid)["state"] == "placed", 10, lambda: fs.task(tid))
    assert w1.lease(wait=1) == []  # one worker alone gets no member
    assert fs.events(tid, "leased") == []
    w2 = HttpWorker(fs, fs.wt, "w2")
    w2.register()
    got2 = w2.lease(wait=0)
    got1 = w1.lease(wait=0)
    assert [(g["rank"], g["gpus"], g["world"]) for g in got1 + got2] == [(0, 2.0, 2), (1, 2.0, 2)]
    env1, env2 = got1[0]["env"], got2[0]["env"]
    assert (env1["RANK"], env2["RANK"], env1["WORLD_SIZE"]) == ("0", "1", "2")
    assert env1["MASTER_ADDR"] == env2["MASTER_ADDR"] == "test"  # rank 0's worker host


def test_a_gang_not_taken_in_time_goes_back_to_its_queue_with_the_reason(fs) -> None:
    w1 = HttpWorker(fs, fs.wt, "w1")
    w1.register()
    tid = fs.submit(fs.erin, "team-b/pair", ["true"])
    wait_for(lambda: fs.task(tid)["state"] == "placed", 10, lambda: fs.task(tid))
    assert w1.lease(wait=0) == []

    def requeued() -> list:
        w1.heartbeat([])  # w1 stays live (its TTL is 1.5 s): one of two members offered
        return fs.events(tid, "preempted")

    wait_for(requeued, 15, "the gang requeued")
    ev = fs.events(tid, "preempted")[0]["data"]
    assert ev["kind"] == "gang"
    assert "only 1 of 2 workers of pool bare" in ev["text"], ev
    assert "within 3s" in ev["text"]
    assert fs.events(tid, "leased") == []


def test_one_member_failing_stops_the_gang_and_requeues_it_whole(fs) -> None:
    w1, w2 = HttpWorker(fs, fs.wt, "w1"), HttpWorker(fs, fs.wt, "w2")
    w1.register()
    w2.register()
    tid = fs.submit(fs.erin, "team-b/pair", ["true"])
    wait_for(lambda: fs.task(tid)["state"] == "placed", 10, lambda: fs.task(tid))
    w1.lease(wait=0)
    (m2,) = w2.lease(wait=0)
    (m1,) = w1.lease(wait=0)
    for w, m in ((w1, m1), (w2, m2)):
        assert w.report(tid, m["epoch"], "started")[0] == 200
    st, _ = w2.report(tid, m2["epoch"], "failed", exit_code=3)
    assert st == 200
    pre = fs.events(tid, "preempted")[-1]["data"]
    assert pre["kind"] == "lost"
    assert pre["text"] == f"gang member rank {m2['rank']} (worker w2) failed: exit 3"
    stops = w1.heartbeat([(tid, m1["epoch"])])["stop"]
    assert [(s["task"], s["epoch"], s["reason"]) for s in stops] == [
        (tid, m1["epoch"], "preempted")
    ]
    assert w1.report(tid, m1["epoch"], "stopped")[0] == 200
    # the whole gang again, at new epochs, once both members are back
    wait_for(lambda: fs.task(tid)["state"] == "placed", 10, lambda: fs.task(tid))
    w1.lease(wait=0)
    again = w2.lease(wait=0) + w1.lease(wait=0)
    assert sorted(g["epoch"] for g in again) == [3, 4]


def test_a_member_that_finishes_waits_for_the_others_and_the_last_ends_the_task(fs) -> None:
    w1, w2 = HttpWorker(fs, fs.wt, "w1"), HttpWorker(fs, fs.wt, "w2")
    w1.register()
    w2.register()
    tid = fs.submit(fs.erin, "team-b/pair", ["true"])
    wait_for(lambda: fs.task(tid)["state"] == "placed", 10, lambda: fs.task(tid))
    w1.lease(wait=0)
    (m2,) = w2.lease(wait=0)
    (m1,) = w1.lease(wait=0)
    assert w1.report(tid, m1["epoch"], "finished", exit_code=0)[0] == 200
    assert fs.task(tid)["state"] == "placed"
    assert w2.report(tid, m2["epoch"], "finished", exit_code=0)[0] == 200
    assert fs.task(tid)["state"] == "ended"
    assert fs.task(tid)["end_reason"] == "finished"


def test_a_lost_member_requeues_the_gang_and_the_other_member_stops(fs, real, tmp_path) -> None:
    real("w1", "0,1")
    w2 = real("w2", "0,1")
    wait_for(lambda: live_workers(fs) == 2, 20, "two workers")
    marks = [tmp_path / f"m{r}.pid" for r in (0, 1)]
    cmd = [
        PY,
        "-c",
        "import os, time\n"
        f"open({str(tmp_path)!r} + '/m' + os.environ['RANK'] + '.pid', 'w')"
        ".write(str(os.getpid()))\n"
        "time.sleep(60)\n",
    ]
    tid = fs.submit(fs.erin, "team-b/pair", cmd)
    wait_for(lambda: all(m.exists() for m in marks), 30, lambda: fs.task(tid))
    leased = fs.events(tid, "leased")
    by_worker = {e["data"]["worker"]: e["data"]["rank"] for e in leased}
    wid2 = w2.worker_id()
    w2.kill9()  # its task keeps running, its worker is gone: lost after the TTL
    wait_for(lambda: fs.events(tid, "preempted"), 20, lambda: fs.task(tid))
    pre = fs.events(tid, "preempted")[0]["data"]
    assert pre["kind"] == "lost"
    assert pre["text"] == f"gang member rank {by_worker[wid2]} (worker {wid2}): worker lost"
    # the member on the live worker is told to stop, and its process is gone
    other = tmp_path / f"m{1 - by_worker[wid2]}.pid"
    pid = int(other.read_text())
    wait_for(lambda: not pid_alive(pid), 20, lambda: fs.events(tid))


def test_a_restart_rebuilds_the_gang_from_its_log(fs) -> None:
    """The members' ranks, shares and rendezvous are in the ``leased`` events: after a
    restart each worker holds its member, one finishing does not end the task, and a member
    failing afterwards still requeues the whole gang."""
    w1, w2 = HttpWorker(fs, fs.wt, "w1"), HttpWorker(fs, fs.wt, "w2")
    w1.register()
    w2.register()
    tid = fs.submit(fs.erin, "team-b/pair", ["true"])
    wait_for(lambda: fs.task(tid)["state"] == "placed", 10, lambda: fs.task(tid))
    w1.lease(wait=0)
    (m2,) = w2.lease(wait=0)
    (m1,) = w1.lease(wait=0)
    assert fs.stop() == 0
    fs.start()
    assert w1.register()["running"] == [{"task": tid, "epoch": m1["epoch"]}]
    assert w2.register()["running"] == [{"task": tid, "epoch": m2["epoch"]}]
    assert w1.report(tid, m1["epoch"], "finished", exit_code=0)[0] == 200
    assert fs.task(tid)["state"] == "placed"
    assert w2.report(tid, m2["epoch"], "failed", exit_code=1)[0] == 200
    t = fs.task(tid)
    assert (
        t["last_preemption"]["text"] == f"gang member rank {m2['rank']} (worker w2) failed: exit 1"
    )
