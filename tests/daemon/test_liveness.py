"""Pools with no live worker (issue 10) on a real ``kliqued serve`` with real
``klique-worker`` processes: such a pool takes no placement and says why, a worker that
registers gets the work and runs it, and when the pool's last worker goes, its placed work
that no worker took is requeued at the start timeout with the reason."""

from __future__ import annotations

import os
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest

from kliqued.daemon.server import CLOCK_OFFSET_ENV
from tests.harness.typed import present

from .fleet import (
    ESTATE,
    PY,
    FleetServer,
    HttpWorker,
    real_workers,
    running_fleet,
    trap,
    wait_for,
    write_estate,
)
from .server import ROOT

SETTINGS = """\
version: 1
settings:
  pass_interval: 1s
  low_watermark: 15m
  currency: EUR
  start_timeout: 2s
"""


DOWN_MS = 7000
"""How long the daemon is down in the restart test: longer than its 6 s start timeout."""


@pytest.fixture
def fs(tmp_path):
    estate = write_estate(tmp_path / "estate", {**ESTATE, "settings.yaml": SETTINGS})
    yield from running_fleet(tmp_path, estate=estate)


@pytest.fixture
def real(fs, tmp_path):
    yield from real_workers(fs, tmp_path)


def pools(fs: FleetServer) -> dict[str, dict]:
    return {p["name"]: p for p in fs.ok("GET", "/v1/pools")["pools"]}


def reason(fs: FleetServer, tid: str) -> tuple[str, str] | None:
    r = fs.task(tid)["waiting_reason"]
    return None if r is None else (r["kind"], r["text"])


def cli(fs: FleetServer, *argv: str) -> str:
    env = {**os.environ, "KLIQUE_URL": fs.url, "KLIQUE_TOKEN": present(fs.admin)}
    env.pop("KLIQUE_CONFIG", None)
    p = subprocess.run(
        [PY, "-m", "kliqued.cli", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_a_pool_without_a_live_worker_takes_no_work_until_one_registers(fs, real) -> None:
    tid = fs.submit(fs.erin, "team-b/one", [PY, "-c", "print('hello')"])
    wait_for(
        lambda: reason(fs, tid) == ("capacity", "no live worker in bare"),
        5,
        "the reason naming the pool",
    )
    assert fs.task(tid)["state"] == "queued" and not fs.events(tid, "placed")
    bare = pools(fs)["bare"]
    assert (bare["workers"], bare["takes_work"], bare["used"]) == ({"live": 0, "gpus": 0}, False, 0)
    out = cli(fs, "pools")
    assert "no live worker in bare, other" in out
    row = next(line for line in out.splitlines() if line.startswith("bare "))
    assert row.rstrip().endswith("none")

    real(gpus="0")
    wait_for(lambda: fs.task(tid)["state"] == "ended", 15, "placed and run once a worker is in")
    t = fs.task(tid)
    assert (t["end_reason"], t["exit_code"], t["pool"]) == ("finished", 0, "bare")
    bare = pools(fs)["bare"]
    assert (bare["workers"], bare["takes_work"]) == ({"live": 1, "gpus": 1}, True)
    row = next(line for line in cli(fs, "pools").splitlines() if line.startswith("bare "))
    assert row.rstrip().endswith("1 (1 GPU)")


def test_work_no_worker_took_is_requeued_at_the_start_timeout_once_the_worker_is_gone(
    fs, real, tmp_path: Path
) -> None:
    w = real(gpus="0")  # one GPU of the pool's declared two: one task runs, one waits
    wait_for(lambda: pools(fs)["bare"]["takes_work"], 10, "the worker registered")
    t1 = fs.submit(fs.erin, "team-b/one", trap(tmp_path, "s1"))
    t2 = fs.submit(fs.erin, "team-b/one", trap(tmp_path, "s2"))
    wait_for(
        lambda: {fs.task(t1)["state"], fs.task(t2)["state"]} == {"running", "placed"},
        15,
        "one running, one placed",
    )
    waiting = t1 if fs.task(t1)["state"] == "placed" else t2
    running = t2 if waiting == t1 else t1
    kind, text = present(reason(fs, waiting))
    assert kind == "worker" and text.startswith(
        "placed on bare, waiting for a worker to start it since "
    )
    assert "waiting   placed on bare, waiting for a worker" in cli(fs, "status", waiting)
    # Past its start timeout, the waiting task stays while the pool has a live worker.
    time.sleep(2.5)
    assert fs.task(waiting)["state"] == "placed"

    w.kill9()  # the pool's only worker: lost after its TTL
    wait_for(lambda: fs.task(waiting)["state"] == "queued", 10, "requeued")
    t = fs.task(waiting)
    assert t["last_preemption"]["text"] == "requeued: not started within 2s on bare"
    assert t["last_preemption"]["kind"] == "unstarted"
    # The state changes with the pass; its event (and ledger close) with the commit after it.
    ev = wait_for(lambda: fs.events(waiting, "preempted"), 5, "the event")[-1]["data"]
    assert (ev["kind"], ev["pool"]) == ("unstarted", "bare")
    wait_for(lambda: fs.task(running)["state"] == "queued", 10, "the running one, lost")
    assert fs.task(running)["last_preemption"]["text"] == "worker lost"
    # Both are back at the front, in their submission order (as preempted work); the head
    # says why it waits.
    q = fs.ok("GET", "/v1/resources/team-b/one/queue")["queue"]
    assert [x["id"] for x in q] == [t1, t2]
    wait_for(
        lambda: reason(fs, t1) == ("capacity", "no live worker in bare"), 5, "the head's reason"
    )
    rows = fs.sql(f"SELECT end_reason FROM ledger WHERE task = '{waiting}'")
    assert rows == [["requeued: not started within 2s on bare"]]


def test_a_restart_gives_unstarted_work_its_start_timeout_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon was down longer than the start timeout: its known worker gets a full TTL
    to come back, and once it is lost the task no worker took is requeued a full start
    timeout after the restart, not at once. The 7 s down are stepped, not slept: the
    restarted daemon's clock runs ``DOWN_MS`` ahead (``KLIQUED_TEST_CLOCK_OFFSET_MS``), which
    to it is time that passed while it was down."""
    settings = SETTINGS.replace("start_timeout: 2s", "start_timeout: 6s")
    estate = write_estate(tmp_path / "estate", {**ESTATE, "settings.yaml": settings})
    fs = FleetServer(tmp_path, estate=estate).start()
    try:
        erin = fs.token({"user": "erin"})
        w = HttpWorker(fs, fs.token({"worker": True, "pool": "bare"}), "w-gone", gpus=1)
        w.register()
        tid = fs.submit(erin, "team-b/one", ["sleep", "100"])
        wait_for(lambda: fs.task(tid)["state"] == "placed", 10, "placed")  # never leased
        assert fs.stop() == 0
        monkeypatch.setenv(CLOCK_OFFSET_ENV, str(DOWN_MS))  # down longer than the timeout
        restarted = time.time() + DOWN_MS / 1000  # on the restarted daemon's clock
        fs.start()
        assert f"the clock runs {DOWN_MS} ms off" in fs.log()  # the step took
        wait_for(lambda: fs.events(kind="worker_lost"), 10, "the silent worker lost")
        assert fs.task(tid)["state"] == "placed"
        assert reason(fs, tid) == ("worker", "placed on bare, not started: no live worker in bare")
        wait_for(lambda: fs.task(tid)["state"] == "queued", 15, "requeued")
        lp = fs.task(tid)["last_preemption"]
        assert lp["text"] == "requeued: not started within 6s on bare"
        at = datetime.fromisoformat(lp["at"].replace("Z", "+00:00")).timestamp()
        assert at - restarted >= 5.5
    finally:
        log = fs.log()
        assert fs.stop() == 0, log
        assert "Traceback" not in log, log
