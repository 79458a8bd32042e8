"""The autoscaler's loop for real: the local provider starts and stops real `klique-worker`
processes, which lease and run the work.

Most tests talk to the protocol's reference peer (tests/workers/protocol_peer.py), extended
here with the one read endpoint the autoscaler uses (`GET /v1/tasks?state=placed`, tasks
showing their `pool`), so they need no engine. ``test_with_kliqued_serve`` runs the whole
story against a real `kliqued serve` with a cloud pool (it skips, saying so, on a control
plane without the /v1/workers endpoints)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aiohttp import web

from kliqued.sdk import Client
from tests.harness.wait import wait_for
from tests.workers.protocol_peer import ProtocolPeer
from workers.autoscaler import Autoscaler, LocalProvider, ScalePolicy

ADMIN = "kq_" + "a" * 43
ESTATE = Path(__file__).resolve().parent / "estate"
REPO = Path(__file__).resolve().parents[2]
WORKER_ARGS = ["--grace", "1s", "--retry-max", "0.5s", "--log-interval", "0.2s"]


class CloudPeer(ProtocolPeer):
    """The reference peer for one cloud pool, plus `GET /v1/tasks` for an admin token: a task
    not ended is `placed` on the pool (the engine's part is not simulated)."""

    def routes(self, app: web.Application) -> None:
        super().routes(app)
        app.router.add_get("/v1/tasks", self.list_tasks)

    async def list_tasks(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {ADMIN}":
            return web.json_response({"error": {"code": "forbidden"}}, status=403)
        want = request.query.get("state")
        with self.lock:
            tasks = [
                {
                    "id": t.id,
                    "state": "ended" if t.state == "ended" else "placed",
                    "pool": self.pool,
                    "gpus": t.gpus,
                }
                for t in self.tasks.values()
            ]
        return web.json_response(
            {"tasks": [t for t in tasks if not want or t["state"] == want], "next": None}
        )


@pytest.fixture
def cloud(tmp_path):
    peer = CloudPeer(pool="burst")
    token = tmp_path / "burst.token"
    token.write_text(peer.token + "\n")
    token.chmod(0o600)
    provider = LocalProvider(
        tmp_path / "nodes", peer.url, token, spot_capacity=0, worker_args=WORKER_ARGS
    )
    yield peer, provider, token
    for n in provider.list("burst"):
        provider.terminate(n)
    peer.close()


@pytest.mark.slow  # long on its own: make test, not make check
def test_scale_up_on_demand_fallback_run_and_release_after_idle(cloud):
    peer, provider, _ = cloud
    pol = ScalePolicy(max_milli=2000, idle_timeout_s=2, spot_first=True, node_gpus=1)
    scaler = Autoscaler(Client(peer.url, ADMIN), provider, "burst", pol)
    r = scaler.step()
    assert (r.waiting, r.launched, r.terminated) == (0, [], [])
    tid = peer.submit(["sleep", "1"])
    r = scaler.step()
    assert r.waiting == 1
    assert [n.spot for n in r.launched] == [False]  # spot_capacity 0: on-demand
    assert "no spot capacity" in r.refused[0]
    node = r.launched[0]
    # no flapping: the starting node counts as room, nothing more is launched
    assert scaler.step().launched == []
    end = peer.wait_for(lambda: peer.end(tid), 20, "the task to finish on the new node")
    assert end["event"] == "finished" and peer.events(tid) == ["started", "finished"]
    assert next(iter(peer.workers.values()))["pool"] == "burst"
    wait_for(lambda: not provider.list("burst")[0].running, 5, "the worker to forget the task")
    t_idle = time.monotonic()
    r = scaler.step()  # idle from now on: kept
    assert r.terminated == [] and len(provider.list("burst")) == 1
    r = None
    while time.monotonic() - t_idle < 1.8:
        r = scaler.step()
        assert r.terminated == []  # not before the timeout
        time.sleep(0.2)
    r = wait_for(lambda: (x := scaler.step()).terminated and x, 5, "the idle node's release")
    assert r.terminated[0][0] == node.id and "idle" in r.terminated[0][1]
    assert provider.list("burst") == []
    assert (
        not os.path.exists(f"/proc/{node.meta['pid']}")
        or open(f"/proc/{node.meta['pid']}/stat").read().split(") ")[1][0] in "ZX"
    )


def test_max_is_never_exceeded_and_spot_is_used_when_there(cloud, tmp_path):
    peer, _, token = cloud
    provider = LocalProvider(
        tmp_path / "nodes2", peer.url, token, spot_capacity=8, worker_args=WORKER_ARGS
    )
    try:
        pol = ScalePolicy(max_milli=2000, idle_timeout_s=60, node_gpus=1)
        scaler = Autoscaler(Client(peer.url, ADMIN), provider, "burst", pol)
        tasks = [peer.submit(["sleep", "30"]) for _ in range(3)]
        r = scaler.step()
        assert [n.spot for n in r.launched] == [True, True] and not r.refused
        peer.wait_for(
            lambda: sum("started" in peer.events(t) for t in tasks) == 2, 20, "two tasks running"
        )
        for _ in range(3):
            assert scaler.step().launched == []  # at max: the third waits
        assert sum(n.gpus for n in provider.list("burst")) == 2
        for t in tasks:
            if peer.tasks[t].worker:
                peer.stop(t, grace_s=0.2)
    finally:
        for n in provider.list("burst"):
            provider.terminate(n)


def test_cli_once_reads_the_estate_and_reports_the_round(cloud):
    peer, _, token = cloud
    env = {**os.environ, "KLIQUE_URL": peer.url, "KLIQUE_TOKEN": ADMIN}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "kliqued.cli",
            "autoscale",
            "--pool",
            "burst",
            "--estate",
            str(ESTATE),
            "--worker-token-file",
            str(token),
            "--once",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "max 2 GPU(s), nodes of 1, idle timeout 2s, spot first" in out.stderr
    assert out.stdout.strip() == "0 waiting task(s), 0 node(s)"
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "kliqued.cli",
            "autoscale",
            "--pool",
            "nope",
            "--estate",
            str(ESTATE),
            "--once",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "no pool 'nope'" in bad.stderr


def test_the_cli_gives_its_nodes_every_daemon_s_url(cloud, tmp_path):
    """Several daemons of one control plane (docs/ha.md): the nodes' workers are given all
    of the autoscaler's URLs, as it was, so they follow the leader; not only the one its
    client used at launch."""
    peer, provider, token = cloud
    other = "http://127.0.0.1:9"  # a second daemon, down: the client uses the peer
    config = tmp_path / "local.json"
    config.write_text(
        json.dumps({"root": str(provider.root), "spot_capacity": 0, "worker_args": WORKER_ARGS})
    )
    peer.submit(["sleep", "1"])
    env = {**os.environ, "KLIQUE_URL": f"{peer.url},{other}", "KLIQUE_TOKEN": ADMIN}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "kliqued.cli",
            "autoscale",
            "--pool",
            "burst",
            "--estate",
            str(ESTATE),
            "--worker-token-file",
            str(token),
            "--provider-config",
            str(config),
            "--once",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    (node,) = provider.list("burst")
    argv = Path(f"/proc/{node.meta['pid']}/cmdline").read_bytes().split(b"\0")
    assert argv[argv.index(b"--url") + 1].decode() == f"{peer.url},{other}"


def test_with_kliqued_serve(tmp_path):
    from tests.harness.daemon import ADMIN as SERVE_ADMIN, Server

    srv = Server(tmp_path, estate=ESTATE).start()
    try:
        status, doc = srv.call("GET", "/v1/openapi.json", token=None)
        if "/v1/workers/register" not in (doc.get("paths") or {}):
            pytest.skip(
                "kliqued serve has no /v1/workers/* endpoints yet: the loop is tested "
                "against the protocol's reference peer above"
            )
        api = Client(srv.url, SERVE_ADMIN)
        token = tmp_path / "burst.token"
        token.write_text(api.create_token(worker=True, pool="burst")["token"] + "\n")
        token.chmod(0o600)
        provider = LocalProvider(
            tmp_path / "nodes", srv.url, token, spot_capacity=0, worker_args=WORKER_ARGS
        )
        scaler = Autoscaler(
            api, provider, "burst", ScalePolicy(max_milli=2000, idle_timeout_s=2, node_gpus=1)
        )
        try:
            task = api.submit("team-a/one", ["sleep", "1"], user="alice")
            wait_for(lambda: api.task(task["id"])["state"] == "placed", 10, "placement")
            r = scaler.step()
            assert [n.spot for n in r.launched] == [False]
            wait_for(lambda: api.task(task["id"])["state"] == "ended", 30, "the task's end")
            assert api.task(task["id"])["end_reason"] == "finished"
            wait_for(lambda: scaler.step().terminated, 15, "the idle node's release")
            assert provider.list("burst") == []
            # issue 10 bug 12: the released node's worker said goodbye; it is not "lost"
            assert srv.ok("GET", "/v1/workers?pool=burst")["workers"] == []
            events = srv.ok("GET", "/v1/events?limit=1000")["events"]
            assert "worker_lost" not in [e["kind"] for e in events]
            (gone,) = [e for e in events if e["kind"] == "worker_deregistered"]
            assert gone["actor"] == "worker:burst"  # the worker's own goodbye (--drain)
        finally:
            for n in provider.list("burst"):
                provider.terminate(n)
    finally:
        srv.stop()


def test_a_vanished_node_s_worker_is_deregistered_by_the_autoscaler(tmp_path):
    """A cloud machine can vanish without its worker saying goodbye: the autoscaler removes
    the worker at the control plane itself (issue 10 bug 12), so it is not shown lost."""
    from tests.harness.daemon import ADMIN as SERVE_ADMIN, Server

    class Vanishing(LocalProvider):
        def terminate(self, node):  # the machine is gone at once: no drain, no goodbye
            try:
                os.killpg(node.meta["pid"], 9)
            except ProcessLookupError:
                pass
            super().terminate(node)

    srv = Server(tmp_path, estate=ESTATE).start()
    try:
        api = Client(srv.url, SERVE_ADMIN)
        token = tmp_path / "burst.token"
        token.write_text(api.create_token(worker=True, pool="burst")["token"] + "\n")
        token.chmod(0o600)
        provider = Vanishing(
            tmp_path / "nodes", srv.url, token, spot_capacity=0, worker_args=WORKER_ARGS
        )
        scaler = Autoscaler(
            api, provider, "burst", ScalePolicy(max_milli=2000, idle_timeout_s=1, node_gpus=1)
        )
        try:
            task = api.submit("team-a/one", ["true"], user="alice")
            wait_for(lambda: api.task(task["id"])["state"] == "placed", 10, "placement")
            scaler.step()
            wait_for(lambda: api.task(task["id"])["state"] == "ended", 30, "the task's end")
            wait_for(lambda: scaler.step().terminated, 15, "the idle node's release")
            assert srv.ok("GET", "/v1/workers?pool=burst")["workers"] == []
            events = srv.ok("GET", "/v1/events?limit=1000")["events"]
            (gone,) = [e for e in events if e["kind"] == "worker_deregistered"]
            assert gone["actor"] == "role:admin"
        finally:
            for n in provider.list("burst"):
                provider.terminate(n)
    finally:
        srv.stop()
