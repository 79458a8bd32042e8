"""Session idle limits (workers/idle.py): the pure decision, the /proc readers on real
processes, and real `klique-worker` processes stopping idle sessions against the protocol's
reference peer (which carries the task's labels in its leases here)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.harness.typed import present
from tests.harness.wait import wait_for
from tests.workers.protocol_peer import ProtocolPeer
from tests.workers.conftest import WorkerProcess
from workers.idle import (
    IdleLimits,
    IdleTracker,
    Sample,
    cpu_seconds,
    group_pids,
    net_bytes,
    parse_limits,
)

PY = sys.executable


# the decision --------------------------------------------------------------------------------
def test_limits_from_labels_and_payload_labels_win():
    lim = parse_limits(
        {"idle.cpu": "30m", "idle.wall": "8h", "other": "x"},
        {"idle": {"cpu": "1h", "network": 90, "cpu_threshold": "10%"}},
    )
    assert (lim.cpu_s, lim.wall_s, lim.network_s, lim.gpu_s) == (1800, 8 * 3600, 90, None)
    assert lim.cpu_threshold == pytest.approx(0.10)
    assert lim.text == {"wall": "8h", "cpu": "30m", "network": "90"}
    assert parse_limits({"team": "a"}, None) is None
    assert parse_limits(None, {"idle": {}}) is None
    with pytest.raises(ValueError, match="not a duration"):
        parse_limits({"idle.cpu": "soon"})
    with pytest.raises(ValueError, match="unknown idle"):
        parse_limits({"idle.disk": "1m"})
    with pytest.raises(ValueError, match="positive"):
        parse_limits({"idle.wall": "0s"})


def test_a_network_threshold_that_is_no_number_is_a_value_error() -> None:
    """The lease's payload is JSON: a list or a mapping there was a TypeError, which the
    worker's idle check does not catch (found by mypy)."""
    lim = parse_limits(None, {"idle": {"network": "1h", "network_threshold": "2048"}})
    assert lim is not None and lim.network_threshold == 2048.0
    for bad in ([1], {"a": 1}, "fast"):
        with pytest.raises(ValueError, match="is not a number of bytes a second"):
            parse_limits(None, {"idle": {"network": "1h", "network_threshold": bad}})


def test_cpu_idle_stops_after_the_limit_only_and_activity_resets_the_clock():
    t = IdleTracker(IdleLimits(cpu_s=10, text={"cpu": "10s"}), started_at=0)
    assert t.observe(Sample(0, cpu_s=0.0)) is None
    assert t.observe(Sample(5, cpu_s=0.01)) is None  # 0.2% of a core: idle
    assert t.observe(Sample(9.9, cpu_s=0.02)) is None
    assert t.observe(Sample(10, cpu_s=0.02)) == "cpu 10s"
    t = IdleTracker(IdleLimits(cpu_s=10), started_at=0)
    t.observe(Sample(0, cpu_s=0.0))
    t.observe(Sample(8, cpu_s=4.0))  # busy until 8
    assert t.observe(Sample(17, cpu_s=4.0)) is None
    assert t.observe(Sample(18, cpu_s=4.0)) == "cpu 10s"


def test_wall_gpu_network_and_unmeasurable_samples():
    t = IdleTracker(IdleLimits(wall_s=60, text={"wall": "1m"}), started_at=100)
    assert t.observe(Sample(159)) is None
    assert t.observe(Sample(160)) == "wall 1m"
    t = IdleTracker(IdleLimits(gpu_s=5), started_at=0)
    assert t.observe(Sample(1, gpu_util=40)) is None
    assert t.observe(Sample(5.9, gpu_util=0)) is None
    assert t.observe(Sample(6, gpu_util=0)) == "gpu 5s"
    # no nvidia-smi: never stopped for lack of data
    t = IdleTracker(IdleLimits(gpu_s=5), started_at=0)
    assert all(t.observe(Sample(s)) is None for s in range(0, 100, 5))
    t = IdleTracker(IdleLimits(network_s=5, network_threshold=100), started_at=0)
    t.observe(Sample(0, net_bytes=0))
    assert t.observe(Sample(4, net_bytes=4000)) is None  # 1000 B/s: active
    assert t.observe(Sample(8, net_bytes=4100)) is None
    assert t.observe(Sample(9, net_bytes=4100)) == "network 5s"


# the readers, on real processes ----------------------------------------------------------
def _group(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, start_new_session=True)


def test_cpu_of_a_process_group_sleeping_and_busy():
    sleeper = _group(["sleep", "30"])
    busy = _group([PY, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        a = (cpu_seconds(group_pids(sleeper.pid)), cpu_seconds(group_pids(busy.pid)))

        # On a loaded machine the busy loop gets less than a core: wait for its CPU time to
        # grow rather than for a fixed wall time (bounded), then compare with the sleeper.
        def grown() -> tuple[float, float] | None:
            b = (
                present(cpu_seconds(group_pids(sleeper.pid))),
                present(cpu_seconds(group_pids(busy.pid))),
            )
            return b if b[1] - a[1] > 0.3 else None

        b = wait_for(grown, 15, "the busy loop's CPU time to grow", every=0.2)
        assert b[0] - a[0] < 0.05
        assert net_bytes(sleeper.pid) is not None
        assert group_pids(sleeper.pid) == [sleeper.pid]
    finally:
        for p in (sleeper, busy):
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert cpu_seconds(group_pids(sleeper.pid)) is None


# real workers --------------------------------------------------------------------------------
class LabelledPeer(ProtocolPeer):
    """The reference peer, with labels per task in its leases."""

    def __init__(self):
        super().__init__()
        self.labels: dict[str, dict] = {}

    def submit_labelled(self, command, labels, **kw) -> str:
        tid = f"t-{self._n + 1:04d}"
        self.labels[tid] = labels  # before the lease can be taken
        assert self.submit(command, **kw) == tid
        return tid

    def _take(self, wid, body):
        leases = super()._take(wid, body)
        for lease in leases:
            lease["labels"] = dict(self.labels.get(lease["task"], {}))
        return leases


@pytest.fixture
def lpeer():
    p = LabelledPeer()
    yield p
    p.close()


@pytest.fixture
def lworker(lpeer, tmp_path):
    w = WorkerProcess(lpeer, tmp_path / "state", "0,1").start()
    yield w
    w.stop()
    if any(True for _ in (tmp_path / "state" / "tasks").glob("*.json")):
        sys.stderr.write(w.stderr())


@pytest.mark.slow  # long on its own: make test, not make check
def test_idle_sleep_is_stopped_busy_is_not_wall_stops_it(lpeer, lworker):
    t0 = time.monotonic()
    idle = lpeer.submit_labelled(["sleep", "60"], {"idle.cpu": "2s"}, grace_s=0.5)
    busy = lpeer.submit_labelled(
        [PY, "-c", "import time\nt=time.time()\nwhile time.time()-t < 60: pass"],
        {"idle.cpu": "2s", "idle.wall": "5s"},
        grace_s=0.5,
    )
    end = lpeer.wait_for(lambda: lpeer.end(idle), 15, "the idle task stopped")
    took = time.monotonic() - t0
    assert end["event"] == "stopped" and end["message"] == "idle: cpu 2s"
    assert end["signal"] == "SIGTERM" or end["exit_code"] is not None
    assert 2.0 <= took < 8.0
    assert lpeer.end(busy) is None  # busy: still running after the cpu limit
    end = lpeer.wait_for(lambda: lpeer.end(busy), 15, "the busy task stopped by wall")
    assert end["event"] == "stopped" and end["message"] == "idle: wall 5s"
    assert time.monotonic() - t0 >= 5.0
    assert lpeer.events(idle) == ["started", "stopped"]
    log = lpeer.log(idle).decode()
    assert "idle limits: cpu 2s" in log and "stop (idle: cpu 2s)" in log


@pytest.mark.slow  # long on its own: make test, not make check
def test_a_task_without_limits_or_with_bad_ones_runs_on(lpeer, lworker):
    plain = lpeer.submit_labelled(["sleep", "3"], {}, grace_s=0.5)
    bad = lpeer.submit_labelled(["sleep", "3"], {"idle.cpu": "whenever"}, grace_s=0.5)
    for t in (plain, bad):
        end = lpeer.wait_for(lambda t=t: lpeer.end(t), 15, "finished")
        assert end["event"] == "finished"
    assert "idle limits ignored" in lpeer.log(bad).decode()
