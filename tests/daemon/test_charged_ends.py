"""The ledger charges what ran (issue 26): a task that ends while its worker is down is
charged until its real end, not until the restarted worker's report arrives, and the
engine's budget meter agrees with the ledger. A real ``kliqued serve``, a real
``klique-worker`` killed with SIGKILL, the task's process ended by its pid."""

from __future__ import annotations

import os
import signal
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from kliqued.daemon.fleet.ends import ran_until

from .fleet import ESTATE, FleetServer, RealWorker, kill_pids_in, trap, wait_for, write_estate

DOWN_S = 15
"""How long the worker stays down after its task ended (the old code charged it)."""


def _month() -> tuple[int, int]:
    now = datetime.now(timezone.utc)
    return now.year, now.month


@pytest.fixture
def fs(tmp_path: Path):
    policies = ESTATE["policies.yaml"].replace(
        "    reservation: 0\n    limit: 2\n",
        "    reservation: 0\n    limit: 2\n    budget: {hours: 100, period: month}\n",
    )
    estate = write_estate(tmp_path / "estate", {**ESTATE, "policies.yaml": policies})
    # a TTL longer than the worker's absence: it is not declared lost, its task not requeued
    s = FleetServer(tmp_path, estate=estate, ttl="60s").start()
    s.erin = s.token({"user": "erin"})  # type: ignore[attr-defined]
    s.wt = s.token({"worker": True, "pool": "bare"})  # type: ignore[attr-defined]
    yield s
    log = s.log()
    assert s.stop() == 0, log
    assert "Traceback" not in log, log


def test_a_task_that_ends_while_its_worker_is_down_is_charged_until_its_end(
    fs: FleetServer, tmp_path: Path
) -> None:
    month = _month()
    w = RealWorker(fs, fs.wt, tmp_path / "w1", gpus="0")  # type: ignore[attr-defined]
    try:
        w.start()
        tid = fs.submit(fs.erin, "team-b/one", trap(tmp_path, "t", 300))  # type: ignore[attr-defined]
        wait_for(lambda: fs.task(tid)["state"] == "running", 30, "running")
        pid = int(
            wait_for(
                lambda: (tmp_path / "t.pid").read_text() if (tmp_path / "t.pid").exists() else None
            )
        )
        time.sleep(2)  # a few seconds of real work
        w.kill9()
        os.kill(pid, signal.SIGTERM)  # the task ends (exit 0) while its worker is down
        ended_ms = time.time_ns() // 1_000_000
        wait_for(lambda: (tmp_path / "t.term").exists(), 10, "the task ended")
        time.sleep(DOWN_S)
        w.start()  # takes the task back, finds its exit, reports it
        wait_for(lambda: fs.task(tid)["state"] == "ended", 30, "reported ended")
    finally:
        w.stop()
        kill_pids_in(list(tmp_path.glob("*.pid")))
    assert "Traceback" not in w.stderr(), w.stderr()
    t = fs.task(tid)
    assert (t["end_reason"], t["epoch"], t["preemptions"]) == ("finished", 1, 0)
    (ev,) = fs.events(tid, "ended")
    reported_ms = int(datetime.fromisoformat(ev["at"].replace("Z", "+00:00")).timestamp() * 1000)
    assert reported_ms - ended_ms >= DOWN_S * 1000  # the report came after the absence
    ((start_ms, end_ms, hours),) = fs.sql(
        f"SELECT epoch_ms(start_at), epoch_ms(end_at), "
        f"date_diff('millisecond', start_at, end_at) / 3600000.0 "
        f"FROM ledger WHERE task = '{tid}'"
    )
    # the interval ends at the task's end (the wrapper's record), not at the report
    assert abs(int(end_ms) - ended_ms) < 2000, (end_ms, ended_ms, reported_ms)
    assert int(end_ms) < reported_ms - (DOWN_S - 2) * 1000
    # the task's own figures and the budget meter agree with the ledger
    assert abs(float(t["gpu_hours"]) - float(hours)) < 1e-3, (t["gpu_hours"], hours)
    if _month() != month:
        pytest.skip("the budget's month changed during the test: its meter started again")
    used = float(fs.ok("GET", "/v1/policies/team-b")["budget"]["used_hours"])
    assert abs(used - float(hours)) < 5 / 3600, (used, hours)  # not the 15 s more


def test_the_charged_end_is_the_reported_one_within_what_the_control_plane_knows() -> None:
    placed, seen, now = 1_000_000, 1_050_000, 1_100_000
    iso = "1970-01-01T00:17:50Z"  # 1_070_000 ms
    assert ran_until(iso, placed, seen, now) == 1_070_000
    assert ran_until("1970-01-01T00:16:00Z", placed, seen, now) == seen  # a clock behind
    assert ran_until("1970-01-01T00:10:00Z", placed, None, now) == placed
    assert ran_until("2999-01-01T00:00:00Z", placed, seen, now) == now  # a clock ahead
    assert ran_until(None, placed, seen, now) == now
    assert ran_until("yesterday", placed, seen, now) == now
    assert ran_until("1970-01-01T01:17:50+01:00", placed, seen, now) == 1_070_000
