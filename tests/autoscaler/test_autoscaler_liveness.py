"""An autoscaled pool takes work with no worker only while its autoscaler runs (issue 25,
item 8; docs/decisions.md N7), against a real `kliqued serve` that requires workers and the
`local` provider's real `klique-worker` processes.

Before: the pool "took work" because it autoscales, with no autoscaler anywhere, so a task
sat there not started, its ledger interval open and charged, until its start timeout."""

from __future__ import annotations

from pathlib import Path

from kliqued.sdk import Client
from tests.harness.daemon import ADMIN, Server
from tests.harness.wait import wait_for
from workers.autoscaler import Autoscaler, LocalProvider, ScalePolicy

ESTATE = Path(__file__).resolve().parent / "estate"
WORKER_ARGS = ["--grace", "1s", "--retry-max", "0.5s", "--log-interval", "0.2s"]


def _ledger_rows(api: Client, task: str) -> list[list]:
    return api.ledger_sql(
        f"SELECT interval_id, end_reason FROM ledger WHERE task = '{task}' ORDER BY start_at"
    )["rows"]


def test_no_autoscaler_no_placement_then_the_local_autoscaler_runs_it(tmp_path):
    srv = Server(tmp_path, estate=ESTATE, workers=True).start()
    try:
        api = Client(srv.url, ADMIN)
        task = api.submit("team-a/one", ["true"], user="alice")["id"]
        # a few passes (pass_interval 1s): it stays queued, and says why
        wait_for(
            lambda: (
                (api.task(task).get("waiting_reason") or {}).get("text")
                == "no autoscaler running for burst"
            ),
            10,
            "the reason naming the autoscaler",
        )
        assert api.task(task)["state"] == "queued"
        (burst,) = [p for p in api.pools() if p["name"] == "burst"]
        assert (burst["takes_work"], burst["autoscaler"]) == (False, {"live": False})
        assert _ledger_rows(api, task) == []  # nothing held, nothing charged

        token = tmp_path / "burst.token"
        token.write_text(api.create_token(worker=True, pool="burst")["token"] + "\n")
        token.chmod(0o600)
        provider = LocalProvider(
            tmp_path / "nodes", srv.url, token, spot_capacity=0, worker_args=WORKER_ARGS
        )
        scaler = Autoscaler(
            api, provider, "burst", ScalePolicy(max_milli=2000, idle_timeout_s=60, node_gpus=1)
        )
        try:
            scaler.step()  # its heartbeat: the pool takes the task
            wait_for(lambda: api.task(task)["state"] != "queued", 10, "placement")
            assert api.task(task)["pool"] == "burst"
            wait_for(lambda: scaler.step().launched or provider.list("burst"), 10, "a node")
            wait_for(lambda: api.task(task)["state"] == "ended", 30, "the task's end")
            assert api.task(task)["end_reason"] == "finished"
            assert [r[1] for r in _ledger_rows(api, task)] == ["finished"]
        finally:
            for n in provider.list("burst"):
                provider.terminate(n)
    finally:
        srv.stop()


def test_a_silent_autoscaler_sends_the_unstarted_work_back_at_once(tmp_path):
    srv = Server(tmp_path, estate=ESTATE, workers=True, extra=["--worker-ttl", "1s"]).start()
    try:
        api = Client(srv.url, ADMIN)
        answer = api.autoscaler_heartbeat("burst", 0.2)  # then it dies: no node launched
        assert answer["live"] is True and answer["timeout_s"] == 1.0
        task = api.submit("team-a/one", ["true"], user="alice")["id"]
        wait_for(lambda: api.task(task)["state"] == "placed", 10, "placement on burst")
        # the start timeout is 10m; the lost autoscaler (1 s) sends it back long before
        wait_for(lambda: api.task(task)["state"] == "queued", 10, "the requeue")
        assert (api.task(task).get("waiting_reason") or {}).get(
            "text"
        ) == "no autoscaler running for burst"
        # its interval closes then (the ledger is written just after the event)
        wait_for(
            lambda: (
                [r[1] for r in _ledger_rows(api, task)]
                == ["requeued: no autoscaler running for burst"]
            ),
            10,
            "the interval's close",
        )
        assert "autoscaler of pool burst lost" in srv.log()
    finally:
        srv.stop()
