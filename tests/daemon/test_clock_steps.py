"""Steps of the wall clock under a real ``kliqued serve`` with a real ``klique-worker``
(issue 26): the test steps the daemon's wall clock while it runs (``KLIQUED_TEST_CLOCK_FILE``:
an offset in ms the daemon reads at each look). A forward hour with 2 GPUs running charges the
budget the real seconds only, not 2 GPU-hours, and a 30-minute token still works; a backward
hour neither stops the daemon's time (a 5 s task is charged 5 s, a cron schedule of every
minute fires) nor makes the ledger show negative usage. Each step is logged once, counted in
``/metrics`` and recorded as a ``clock_step`` alert."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

import pytest

from kliqued.daemon.state.clockwatch import CLOCK_FILE_ENV
from tests.daemon.fleet import ESTATE, FleetServer, RealWorker, kill_pids_in, write_estate
from tests.harness.wait import wait_for

HOUR_MS = 3_600_000


def mid_month_offset_ms() -> int:
    """From now to the 15th of next month at 12:00 UTC: budgets' months and days are far
    from their ends whatever day the test runs."""
    now = datetime.now(timezone.utc)
    year, month = (now.year + 1, 1) if now.month == 12 else (now.year, now.month + 1)
    return int((datetime(year, month, 15, 12, tzinfo=timezone.utc) - now).total_seconds() * 1000)


class Stepped:
    """A started daemon whose wall clock the test steps, a real worker with 2 GPUs."""

    def __init__(self, tmp: Path, monkeypatch: pytest.MonkeyPatch, offset_ms: int) -> None:
        self.file = tmp / "wall-offset-ms"
        self.offset = offset_ms
        self.file.write_text(str(offset_ms))
        policies = ESTATE["policies.yaml"].replace(
            "    reservation: 2\n    limit: 2\n",
            "    reservation: 2\n    limit: 2\n    budget: {hours: 100, period: month}\n",
        )
        estate = write_estate(tmp / "estate", {**ESTATE, "policies.yaml": policies})
        monkeypatch.setenv(CLOCK_FILE_ENV, str(self.file))
        self.s = FleetServer(tmp, estate=estate, ttl="3s").start()
        self.alice = self.s.token({"user": "alice"})
        self.worker = RealWorker(
            self.s, self.s.token({"worker": True, "pool": "bare"}), tmp / "w1"
        ).start()

    def step(self, ms: int) -> None:
        self.offset += ms
        self.file.write_text(str(self.offset))

    def used_hours(self) -> float:
        budget = self.s.ok("GET", "/v1/policies/team-a")["budget"]
        return float(budget["used_hours"])

    def metrics(self) -> str:
        status, body = self.s.call("GET", "/metrics")
        assert status == 200, body
        return body if isinstance(body, str) else body.decode()


@pytest.fixture
def stepped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Stepped]]:
    made: list[Stepped] = []
    yield made
    for st in made:
        st.worker.stop()
        log = st.s.log()
        assert st.s.stop() == 0, log
        assert "Traceback" not in log, log
        assert "Traceback" not in st.worker.stderr(), st.worker.stderr()
    kill_pids_in(list(tmp_path.glob("*.pid")))


def running(st: Stepped, command: list[str], n: int) -> list[str]:
    tids = [st.s.submit(st.alice, "team-a/one", command) for _ in range(n)]
    for tid in tids:
        wait_for(lambda: st.s.task(tid)["state"] == "running", 30, f"{tid} running")
    return tids


def test_a_forward_hour_charges_the_real_seconds_and_expires_no_token(
    stepped: list[Stepped], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    st = Stepped(tmp_path, monkeypatch, mid_month_offset_ms())
    stepped.append(st)
    tids = running(st, ["sleep", "120"], 2)  # 2 GPUs of team-a's budget
    short = st.s.token({"user": "alice", "expires_in": "30m"})
    u0, t0 = st.used_hours(), time.monotonic()
    st.step(HOUR_MS)
    time.sleep(3)  # several looks and passes after the step
    u1, t1 = st.used_hours(), time.monotonic()
    real = 2 * (t1 - t0) / 3600
    assert u1 - u0 <= real + 0.002, (u0, u1, real)  # not the 2 GPU-hours of the step
    assert u1 - u0 > 0  # still charging
    assert st.s.call("GET", "/v1/whoami", token=short)[0] == 200  # the 30 min token works
    text = st.metrics()
    assert 'klique_clock_steps_total{direction="forward"} 1.0' in text, text
    offset = [
        float(x.split()[1])
        for x in text.splitlines()
        if x.startswith("klique_clock_offset_seconds ")
    ]
    assert offset and 3590 < offset[0] < 3601, offset
    assert "the wall clock stepped forward by 3600.0 s" in st.s.log()
    (ev,) = st.s.events(kind="clock_step")
    assert ev["data"]["direction"] == "forward" and abs(ev["data"]["step_ms"] - HOUR_MS) < 1000
    for tid in tids:
        st.s.ok("POST", f"/v1/tasks/{tid}/cancel", {}, token=st.alice)
    for tid in tids:
        wait_for(lambda: st.s.task(tid)["state"] == "ended", 30, f"{tid} ended")
    # the ledger's intervals ran for real seconds, not an hour
    (hours,) = st.s.sql("SELECT max(hours) FROM usage")[0]
    assert 0 < float(hours) < 120 / 3600, hours
    assert st.s.log().count("the wall clock stepped") == 1  # logged once


def test_a_backward_hour_keeps_time_running_and_the_ledger_positive(
    stepped: list[Stepped], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The machine's clock starts an hour ahead, and lands 25 s before a minute: a cron of
    # every minute is due about 25 s after the start, and after the step back.
    now_ms = time.time_ns() // 1_000_000
    ahead = HOUR_MS + (35_000 - (now_ms + HOUR_MS) % 60_000) % 60_000
    st = Stepped(tmp_path, monkeypatch, ahead)
    stepped.append(st)
    sched = st.s.ok(
        "POST",
        "/v1/schedules",
        {"cron": "* * * * *", "resource": "team-a/one", "command": ["true"]},
        token=st.alice,
        expect=201,
    )
    (long_tid,) = running(st, ["sleep", "120"], 1)  # open across the step
    st.step(-HOUR_MS)
    wait_for(
        lambda: 'klique_clock_steps_total{direction="backward"} 1.0' in st.metrics(),
        10,
        "the step counted",
    )
    assert "the wall clock stepped backward by 3" in st.s.log()  # 3600 s, to the look
    # a 5 s task after the step is charged about 5 s (before: 0, the time stood still)
    tid = st.s.submit(st.alice, "team-a/one", ["sleep", "5"])
    wait_for(lambda: st.s.task(tid)["state"] == "ended", 40, "the 5 s task ended")
    rows = st.s.sql(f"SELECT sum(hours) FROM usage WHERE task = '{tid}'")
    charged_s = float(rows[0][0]) * 3600
    # The worker's clock is an hour behind the daemon's time now, so its report's ``at`` is
    # not trusted: the end charged is the last heartbeat that listed the task running
    # (ends.py), up to a heartbeat or two before the exit on a loaded machine (CI saw 4.3 s).
    # Before the fix the daemon's time stood still and this was 0.
    assert 2.0 <= charged_s <= 9, charged_s
    # the schedule of every minute fired after the step (before: silent for the hour)
    runs = wait_for(
        lambda: st.s.ok("GET", f"/v1/schedules/{sched['id']}", token=st.alice)["last_runs"],
        70,
        "a run of the cron",
    )
    dues = [r["due"] for r in runs]
    assert len(dues) == len(set(dues)), dues  # none repeated
    # finance's views: the open interval started after DuckDB's now(), yet no negative use
    assert st.s.task(long_tid)["state"] == "running"
    neg = st.s.sql("SELECT count(*) FROM usage WHERE hours < 0 OR gpu_hours < 0")
    assert neg[0][0] == 0
    (ev,) = st.s.events(kind="clock_step")
    assert ev["data"]["direction"] == "backward"
    assert abs(ev["data"]["step_ms"] + HOUR_MS) < 1000, ev
    st.s.ok("POST", f"/v1/tasks/{long_tid}/cancel", {}, token=st.alice)
    wait_for(lambda: st.s.task(long_tid)["state"] == "ended", 30, "the long task ended")
