"""A worker that crashes and comes back gets its work back without waiting for the start
timeout (issue 26, item 5), on a real ``kliqued serve`` with a real ``klique-worker``.

The fault: a profile's pools are ``[bare, burst]``; ``bare``'s only worker is killed (SIGKILL)
while a task runs there. Once the worker is declared lost the task is requeued and placed on
``burst``, the autoscaled pool that takes work while its autoscaler heartbeats, though no node
has come yet. The worker then restarts. Before the fix the task stayed placed on ``burst``
until its start timeout (60 s here, 10 min by default) while the returned worker sat idle;
now a pool that becomes live again sends back the unstarted work placed on a later pool of a
profile that lists it, and the next pass places it on the returned pool."""

from __future__ import annotations

from pathlib import Path


from .fleet import ESTATE, FleetServer, RealWorker, kill_pids_in, trap, wait_for, write_estate


FILES = {
    **ESTATE,
    "settings.yaml": """\
version: 1
settings:
  pass_interval: 1s
  low_watermark: 15m
  currency: EUR
  start_timeout: 60s
""",
    "pools.yaml": """\
pools:
  - name: bare
    kind: baremetal
    capacity: 1
    gpu_type: l40s-48gb
  - name: burst
    kind: cloud
    gpu_type: l40s-48gb
    autoscale:
      max: 1
      idle_timeout: 60s
    settings:
      node_gpus: "1"
""",
    "profiles.yaml": """\
profiles:
  - name: one
    gpus: 1
    pools: [bare, burst]
    policies: [team-a, team-b]
""",
}


def _heartbeat_autoscaler(fs: FleetServer) -> None:
    """An autoscaler that runs (a heartbeat naming a long round, so it stays live for the
    whole test) and launches no node: the pool takes work nobody starts yet."""
    fs.ok("POST", "/v1/pools/burst/autoscaler", {"interval_s": 120})


def test_a_returning_worker_takes_back_work_placed_on_a_later_pool(tmp_path: Path) -> None:
    fs = FleetServer(tmp_path, estate=write_estate(tmp_path / "estate", FILES)).start()
    w: RealWorker | None = None
    try:
        erin = fs.token({"user": "erin"})
        w = RealWorker(
            fs, fs.token({"worker": True, "pool": "bare"}), tmp_path / "w1", gpus="0"
        ).start()
        _heartbeat_autoscaler(fs)
        wait_for(lambda: fs.ok("GET", "/v1/workers")["workers"], 15, "the worker registered")
        tid = fs.submit(erin, "team-b/one", trap(tmp_path, "s1"))
        wait_for(lambda: fs.task(tid)["state"] == "running", 15, "running on bare")
        assert fs.task(tid)["pool"] == "bare"

        w.kill9()  # lost after the TTL (1.5 s): requeued, then placed on burst
        wait_for(
            lambda: fs.task(tid)["pool"] == "burst" and fs.task(tid)["state"] == "placed",
            15,
            "placed on burst once bare's worker is lost",
        )

        w.start()  # the same worker comes back: bare is live again
        wait_for(
            lambda: (fs.task(tid)["state"], fs.task(tid)["pool"]) == ("running", "bare"),
            20,
            "running on bare again, well before burst's 60 s start timeout",
        )
        ev = [e["data"] for e in fs.events(tid, "preempted")]
        assert [(e["kind"], e["pool"]) for e in ev][-1] == ("unstarted", "burst")
        assert ev[-1]["text"] == "requeued: bare has a live worker again"
        rows = fs.sql(f"SELECT pool, end_reason FROM ledger WHERE task = '{tid}' ORDER BY start_at")
        assert [r[0] for r in rows] == ["bare", "burst", "bare"]
        assert rows[0][1] == "worker lost"
        assert rows[1][1] == "requeued: bare has a live worker again"
        assert rows[2][1] is None  # the running interval, still open
        fs.ok("POST", f"/v1/tasks/{tid}/cancel", {"reason": "test over"})
        wait_for(lambda: fs.task(tid)["state"] == "ended", 15, "cancelled")
    finally:
        if w is not None:
            w.stop()
        kill_pids_in(list(tmp_path.glob("*.pid")))
        log = fs.log()
        assert fs.stop() == 0, log
    assert "Traceback" not in log, log
