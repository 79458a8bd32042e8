"""Real `klique-worker` processes against the protocol's reference peer (a real aiohttp
server, tests/workers/protocol_peer.py): leases by long-poll, reports, logs, stops, fencing,
a control plane that is down, and the worker's own restart (kill -9) losing nothing."""

from __future__ import annotations

import pytest

import json
import sys
import time
from pathlib import Path

from tests.harness.wait import wait_for
from tests.workers.conftest import kill_quietly, pid_alive
from workers.daemon import MARK_FIELDS
from workers.executors.base import Start
from workers.executors.process import ProcessExecutor
from workers.state import StateDir, TaskRecord

PY = sys.executable


def test_a_task_runs_end_to_end_with_its_log_and_reports(peer, worker):
    worker("0,1")
    tid = peer.submit(
        [
            PY,
            "-c",
            "import os; print('hello on', os.environ['CUDA_VISIBLE_DEVICES'],"
            " os.environ['KLIQUE_EPOCH'])",
        ]
    )
    bad = peer.submit(["sh", "-c", "echo oops >&2; exit 3"])
    end = peer.wait_for(lambda: peer.end(tid), 10, "finished")
    assert end["event"] == "finished" and end["exit_code"] == 0 and end["signal"] is None
    assert peer.events(tid) == ["started", "finished"]
    peer.wait_for(lambda: peer.end(bad), 10, "failed")
    assert peer.end(bad)["event"] == "failed" and peer.end(bad)["exit_code"] == 3
    assert peer.log(tid) in (b"hello on 0 1\n", b"hello on 1 1\n")  # log before the report
    assert peer.log(bad) == b"oops\n"
    wid = next(iter(peer.workers))
    reg = peer.workers[wid]
    assert reg["pool"] == "bare" and reg["executor"] == "process"
    assert [g["index"] for g in reg["gpus"]] == [0, 1]


@pytest.mark.slow  # long on its own: make test, not make check
def test_long_poll_leases_at_once_and_only_with_free_gpus(peer, worker):
    peer.poll_wait_s = 10.0  # a poll is held up to 10 s
    worker("0", extra=["--cpu-tasks", "0"])  # GPU work only (CPU-only work: the next test)
    peer.wait_for(lambda: peer.lease_calls, 10, "first long-poll")
    time.sleep(1.0)
    assert len(peer.lease_calls) == 1  # one poll held open: no busy polling
    t0 = time.monotonic()
    tid = peer.submit(["sleep", "30"])
    peer.wait_for(lambda: "started" in peer.events(tid), 5, "started")
    assert time.monotonic() - t0 < 2.0  # the held poll answered as soon as work came
    calls = len(peer.lease_calls)
    time.sleep(1.2)
    assert len(peer.lease_calls) == calls  # its only GPU is busy: it does not ask for work
    assert peer.lease_calls[-1][1]["free_gpus"] == [0]
    # heartbeats carry the running task
    peer.wait_for(
        lambda: {"task": tid, "epoch": 1, "state": "running"} in peer.heartbeats[-1][1]["running"],
        5,
        "a heartbeat with the task",
    )
    peer.stop(tid, reason="cancelled", grace_s=0.5)
    peer.wait_for(lambda: peer.end(tid), 5, "stopped")
    assert peer.end(tid)["event"] == "stopped"
    peer.wait_for(lambda: len(peer.lease_calls) > calls, 5, "polling again once free")


@pytest.mark.slow  # long on its own: make test, not make check
def test_cpu_only_tasks_start_while_every_gpu_is_busy_up_to_the_cap(peer, worker, tmp_path):
    """Issue 10, bug 2: a 0-GPU task placed on a full pool started only once a GPU freed."""
    peer.poll_wait_s = 10.0
    worker("0", extra=["--cpu-tasks", "2"])
    gpu_task = peer.submit(["sleep", "30"])
    peer.wait_for(lambda: "started" in peer.events(gpu_task), 10, "the GPU task started")
    out = tmp_path / "cpu"
    out.mkdir()
    script = (
        f"import os, time; open('{out}/' + os.environ['KLIQUE_TASK_ID'], 'w').write("
        "os.environ['CUDA_VISIBLE_DEVICES']); time.sleep(30)"
    )
    cpu = [peer.submit([PY, "-c", script], gpus=0) for _ in range(3)]
    wait_for(lambda: len(list(out.iterdir())) == 2, 10, "two CPU-only tasks running")
    time.sleep(0.5)
    assert sorted(p.name for p in out.iterdir()) == cpu[:2]  # the cap: 2 at a time
    assert all(p.read_text() == "" for p in out.iterdir())  # no GPU for them
    assert peer.tasks[cpu[2]].state == "queued"  # never leased beyond the cap
    # it asked with its GPU busy and its free CPU-only slots, and asks no more while all are
    # taken
    last = peer.lease_calls[-1][1]
    assert last["free_gpus"] == last["gpu_free"] == [] and last["cpu_free"] in (1, 2)
    calls = len(peer.lease_calls)
    time.sleep(0.5)
    assert len(peer.lease_calls) == calls
    peer.stop(cpu[0], grace_s=0.2)
    wait_for(lambda: (out / cpu[2]).exists(), 10, "the third once a CPU slot freed")
    for t in [gpu_task, *cpu[1:]]:
        peer.stop(t, grace_s=0.2)
    peer.wait_for(lambda: all(peer.end(t) for t in [gpu_task, *cpu]), 10, "all stopped")


def test_a_freed_gpu_is_leased_at_once_while_a_cpu_only_poll_is_held(peer, worker):
    """CPU-only slots keep a long poll open while every GPU is busy; it must not delay GPU
    work: the poll for GPU room is a request of its own, sent as soon as a GPU frees."""
    peer.poll_wait_s = 10.0
    worker("0", extra=["--cpu-tasks", "1"])
    first = peer.submit(["sleep", "30"])
    peer.wait_for(lambda: "started" in peer.events(first), 10, "the GPU task started")
    time.sleep(0.5)  # a CPU-only poll is held now (no CPU work queued)
    second = peer.submit(["sleep", "30"])
    peer.stop(first, grace_s=0.2)
    peer.wait_for(lambda: peer.end(first), 5, "the first stopped")
    t0 = time.monotonic()
    peer.wait_for(lambda: "started" in peer.events(second), 5, "the second started")
    assert time.monotonic() - t0 < 2.0  # not after the held poll's 10 s
    gpu_polls = [b for _, b, _ in peer.lease_calls if b["free_gpus"]]
    assert gpu_polls and all(b["cpu_free"] == 0 for b in gpu_polls)
    peer.stop(second, grace_s=0.2)
    peer.wait_for(lambda: peer.end(second), 5, "stopped")


def test_a_worker_without_gpus_runs_cpu_only_tasks(peer, worker):
    worker("none")
    tid = peer.submit(["sh", "-c", "echo cpu only"], gpus=0)
    end = peer.wait_for(lambda: peer.end(tid), 10, "finished")
    assert end["event"] == "finished" and peer.log(tid) == b"cpu only\n"


@pytest.mark.slow  # long on its own: make test, not make check
def test_fractions_share_one_gpu_up_to_one_gpu_worth(peer, worker, tmp_path):
    worker("0")
    out = tmp_path / "cuda"
    out.mkdir()
    script = (
        f"import os, time; open('{out}/' + os.environ['KLIQUE_TASK_ID'], 'w').write("
        "os.environ['CUDA_VISIBLE_DEVICES']); time.sleep(30)"
    )
    tasks = [peer.submit([PY, "-c", script], gpus=g) for g in (0.5, 0.25, 0.5)]
    wait_for(lambda: len(list(out.iterdir())) == 2, 10, "two fractions running")
    time.sleep(0.5)
    assert sorted(p.name for p in out.iterdir()) == tasks[:2]  # 0.5 + 0.25; 0.5 waits
    assert all(p.read_text() == "0" for p in out.iterdir())
    assert peer.tasks[tasks[2]].state == "queued"
    peer.stop(tasks[0], grace_s=0.2)
    wait_for(lambda: (out / tasks[2]).exists(), 10, "third fraction after the first stop")
    for t in tasks[1:]:
        peer.stop(t, grace_s=0.2)
    peer.wait_for(lambda: all(peer.end(t) for t in tasks), 10, "all stopped")


TRAPS = """
import signal, sys, time
def term(*_):
    open(sys.argv[1], 'w').write('checkpoint')
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
print('ready', flush=True)
time.sleep(60)
"""


def test_stop_instruction_sigterm_then_sigkill_after_the_grace(peer, worker, tmp_path):
    worker("0,1")
    marker = tmp_path / "marker"
    polite = peer.submit([PY, "-c", TRAPS, str(marker)], grace_s=5)
    stubborn = peer.submit(
        [
            PY,
            "-c",
            "import signal, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('ready', flush=True); time.sleep(60)",
        ],
        grace_s=0.8,
    )
    for t in (polite, stubborn):
        peer.wait_for(lambda: b"ready" in peer.log(t), 10, "ready")
    peer.stop(polite, reason="preempted", text="reclaimed by team-b")
    peer.stop(stubborn, reason="budget", text="budget used up")
    end = peer.wait_for(lambda: peer.end(polite), 10, "polite stopped")
    assert (end["event"], end["exit_code"], end["signal"]) == ("stopped", 0, None)
    assert "reclaimed by team-b" in end["message"]
    assert marker.read_text() == "checkpoint"
    end = peer.wait_for(lambda: peer.end(stubborn), 10, "stubborn stopped")
    assert (end["event"], end["exit_code"], end["signal"]) == ("stopped", None, "SIGKILL")
    peer.wait_for(lambda: b"SIGKILL after 0.8s" in peer.log(stubborn), 5, "log line")


def test_fencing_a_stale_epoch_kills_the_task_at_once(peer, worker, tmp_path):
    w = worker("0")
    pidfile = tmp_path / "pid"
    tid = peer.submit(
        [
            PY,
            "-c",
            f"import os, time; open('{pidfile}', 'w').write(str(os.getpid())); time.sleep(60)",
        ],
        grace_s=30,
    )
    peer.steal_on_start.add(tid)  # the started report meets a newer epoch: 409 stale-epoch
    pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text(), 10, "pid"))
    wait_for(lambda: not pid_alive(pid), 3, "fenced task killed (not after its 30s grace)")
    time.sleep(0.5)
    statuses = [(body["event"], status) for t, body, status in peer.reports if t == tid]
    assert statuses == [("started", 409)]  # forgotten: nothing more is reported
    wait_for(lambda: not list((w.state_dir / "tasks").glob("*.json")), 5, "record gone")
    # and the worker has its GPU back for new work
    nxt = peer.submit(["true"])
    peer.wait_for(lambda: peer.end(nxt), 10, "next task")


@pytest.mark.slow  # long on its own: make test, not make check
def test_a_control_plane_that_is_down_is_waited_for(peer, worker):
    peer.down()
    w = worker("0")
    wait_for(lambda: "unreachable" in w.log_file.read_text(), 10, "a log line")
    assert w.proc.poll() is None
    peer.up()
    tid = peer.submit(["sh", "-c", "sleep 0.5; echo done"])
    peer.wait_for(lambda: "started" in peer.events(tid), 10, "started")
    peer.down()  # the task ends while the control plane is away
    time.sleep(1.5)
    peer.up()
    end = peer.wait_for(lambda: peer.end(tid), 10, "finished after the outage")
    assert end["event"] == "finished"
    assert peer.log(tid) == b"done\n"
    assert "reachable again" in w.log_file.read_text()


@pytest.mark.slow  # long on its own: make test, not make check
def test_a_restarted_worker_takes_its_task_back_and_reports_its_end(peer, worker, tmp_path):
    # a TTL the restart fits in: past TTL - margin an orphan stops (tests/workers/test_orphans.py)
    peer.ttl_s = 10.0
    w = worker("0,1")
    long = peer.submit(["sh", "-c", "echo before; sleep 2.5; echo after; exit 4"])
    short = peer.submit(["sh", "-c", "sleep 0.8; exit 0"])
    for t in (long, short):
        peer.wait_for(lambda: "started" in peer.events(t), 10, "started")
    records = {
        json.loads(p.read_text())["task"]: json.loads(p.read_text())
        for p in (w.state_dir / "tasks").glob("*.json")
    }
    pid = records[long]["handle"]["pid"]
    w.kill9()
    assert pid_alive(pid)  # the task outlives its worker
    time.sleep(1.0)  # `short` ends while the worker is down
    assert peer.end(short) is None
    wid = (w.state_dir / "worker-id").read_text().strip()
    w.start()
    peer.wait_for(lambda: peer.workers[wid]["registrations"] == 2, 10, "registered again")
    end = peer.wait_for(lambda: peer.end(short), 10, "short reported")
    assert (end["event"], end["exit_code"]) == ("finished", 0)
    end = peer.wait_for(lambda: peer.end(long), 10, "long reported")
    assert (end["event"], end["exit_code"]) == ("failed", 4)  # its real exit code
    assert peer.log(long) == b"before\nafter\n"
    assert len(peer.workers) == 1  # the same worker id
    assert peer.events(long) == ["started", "failed"]
    kill_quietly(pid)


def test_a_task_the_control_plane_no_longer_lists_is_stopped_after_a_restart(peer, worker):
    w = worker("0")
    tid = peer.submit(["sleep", "30"])
    peer.wait_for(lambda: "started" in peer.events(tid), 10, "started")
    rec = json.loads(next((w.state_dir / "tasks").glob("*.json")).read_text())
    w.kill9()
    peer.forget(tid)  # e.g. cancelled while its worker was away
    w.start()
    wait_for(lambda: not pid_alive(rec["handle"]["pid"]), 10, "unlisted task stopped")
    wait_for(lambda: not list((w.state_dir / "tasks").glob("*.json")), 5, "record gone")


def test_a_listed_task_the_worker_has_no_record_of_is_reported(peer, worker):
    w = worker("0")
    peer.wait_for(lambda: peer.workers, 10, "registered")
    w.kill9()
    wid = next(iter(peer.workers))
    tid = peer.submit(["true"])
    with peer.lock:  # leased to this worker, but the answer never reached it
        t = peer.tasks[tid]
        t.state, t.epoch, t.worker = "leased", 1, wid
    w.start()
    end = peer.wait_for(lambda: peer.end(tid), 10, "reported")
    assert end["event"] == "failed" and end["message"].startswith("worker-lost:")


def test_a_waiting_lease_started_just_before_a_kill_9_is_taken_back_not_started_again(
    peer, worker, tmp_path
):
    """Issue 29: a lease that waited for room has a ``starting`` record; the worker started
    it (the fork server forked its wrapper) and was killed before it wrote the record again
    with the pid. Its restart finds the wrapper's start marker and takes the task back: it
    runs once, reported started and finished at its epoch."""
    peer.ttl_s = 10.0  # the restart comes well before the orphan's deadline
    w = worker("0")
    peer.wait_for(lambda: peer.workers, 10, "registered")
    wid = next(iter(peer.workers))
    w.kill9()
    runs = tmp_path / "runs"
    tid = peer.submit(
        [PY, "-c", f"open({str(runs)!r}, 'a').write('ran\\n'); import time; time.sleep(1)"]
    )
    with peer.lock:  # leased to this worker before it was killed
        t = peer.tasks[tid]
        t.state, t.epoch, t.worker = "leased", 1, wid
    # what the killed run left: the record as the lease round wrote it (``starting``, no
    # GPUs yet), and the wrapper its batch start forked with the record's mark
    state = StateDir(w.state_dir)
    lease = {"task": tid, "epoch": 1, "command": t.command, "gpus": 1.0, "grace_s": 1.0}
    rec = TaskRecord(task=tid, epoch=1, lease=lease, milli=1000)
    rec.log_path = str(state.log_path(rec))
    (state.tasks / f"{rec.key}.json").write_text(json.dumps(rec.to_json()))
    rec.gpus = [0]
    ex = ProcessExecutor(w.state_dir)
    (h,) = ex.start_many(
        [Start(lease, [0], Path(rec.log_path), {k: getattr(rec, k) for k in MARK_FIELDS})]
    )
    ex.close()  # the fork server goes with the killed worker's pipe
    w.start()
    end = peer.wait_for(lambda: peer.end(tid), 15, "reported")
    assert (end["event"], end["exit_code"]) == ("finished", 0), end
    assert peer.events(tid) == ["started", "finished"]
    assert runs.read_text() == "ran\n"  # once
    assert "taken back, not started again" in w.log_file.read_text()
