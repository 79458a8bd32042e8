"""The EC2 provider against a real EC2 API server: moto's server mode on a free port, boto3
pointed at it with ``endpoint_url`` (the provider's calls are the real ones).

What moto does not do, and what these tests do about it:
- moto runs no user-data: the rendered script is checked as text and with ``bash -n``, and
  the provider's ``emulate_workers`` starts, for each instance moto reports, the local
  ``klique-worker`` the script would start (same worker id, ``ec2-<instance id>``).
- moto has no capacity model (every RunInstances succeeds). ``capacity`` below adds one
  inside the emulator: moto's own ``run_instances`` raises moto's ``EC2ClientError`` with
  EC2's code (InsufficientInstanceCapacity, MaxSpotInstanceCountExceeded) for the refused
  (lifecycle, type) pairs, so boto3 receives the error as EC2 sends it (HTTP 400, EC2's XML
  error document) and the provider is not told anything it would not be told by AWS.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time

import pytest
from aiohttp import web

pytest.importorskip("moto.server", reason="moto[server] is in the test extra")

from kliqued.sdk import Client  # noqa: E402
from tests.autoscaler.test_loop import ADMIN, WORKER_ARGS, CloudPeer  # noqa: E402
from tests.harness.daemon import free_port  # noqa: E402
from tests.harness.wait import wait_for  # noqa: E402
from workers.autoscaler import Autoscaler, ScalePolicy, make_provider  # noqa: E402
from workers.autoscaler.ec2 import Ec2Provider, InstanceType  # noqa: E402
from workers.autoscaler.userdata import render  # noqa: E402
from workers.errors import CapacityUnavailable, ProviderError  # noqa: E402

REGION = "eu-west-1"
IMAGE = "ami-12c6146b"  # one of the images moto knows in every region
TYPES = [{"name": "g5.xlarge", "gpus": 1, "max": 2}, {"name": "g5.12xlarge", "gpus": 4}]


class Capacity:
    """Refusals inside the emulator: (lifecycle, instance type) -> EC2 error code."""

    def __init__(self) -> None:
        self.refuse: dict[tuple[str, str], str] = {}
        self.calls: list[tuple[str, str]] = []


@pytest.fixture(scope="module")
def moto_server():
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def ec2(moto_server, monkeypatch):
    """A fresh emulator state, credentials that are not anyone's, and the capacity model."""
    import requests
    from moto.ec2.exceptions import EC2ClientError
    from moto.ec2.models.instances import InstanceBackend

    for k, v in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": REGION,
    }.items():
        monkeypatch.setenv(k, v)
    requests.post(f"{moto_server}/moto-api/reset", timeout=10)
    cap = Capacity()
    original = InstanceBackend.run_instances

    def run_instances(self, image_id, count, user_data, security_group_names, **kwargs):
        life = "spot" if kwargs.get("instance_market_options") else "on-demand"
        cap.calls.append((life, kwargs.get("instance_type")))
        code = cap.refuse.get((life, kwargs.get("instance_type")))
        if code:
            raise EC2ClientError(
                code,
                f"We currently do not have sufficient "
                f"{kwargs.get('instance_type')} capacity ({life}).",
            )
        return original(self, image_id, count, user_data, security_group_names, **kwargs)

    monkeypatch.setattr(InstanceBackend, "run_instances", run_instances)
    yield moto_server, cap


def config(endpoint: str, **more) -> dict:
    return {
        "region": REGION,
        "endpoint_url": endpoint,
        "image_id": IMAGE,
        "instance_types": TYPES,
        "token_ssm_parameter": "/klique/burst/worker-token",
        "url": "http://cp:8080",
        "tags": {"team": "ml"},
        **more,
    }


def instances(url: str) -> list[dict]:
    import boto3

    c = boto3.client("ec2", region_name=REGION, endpoint_url=url)
    return [i for r in c.describe_instances()["Reservations"] for i in r["Instances"]]


def test_user_data_starts_the_pools_worker_and_carries_no_secret(tmp_path):
    text = render(
        pool="burst",
        url="https://klique.example.com",
        region=REGION,
        token_ssm_parameter="/klique/burst/worker-token",
        revision="sha256:abc",
        worker_args=["--grace", "60s"],
    )
    assert text.startswith("#!/bin/bash\n") and "sha256:abc" in text
    assert (
        "aws ssm get-parameter --region eu-west-1 --with-decryption --name "
        "/klique/burst/worker-token"
    ) in text
    assert (
        '[ -s /var/lib/klique-worker/worker-id ] || echo "ec2-$iid" > '
        "/var/lib/klique-worker/worker-id"
    ) in text
    assert (
        "klique-worker --url https://klique.example.com --pool burst --token-file "
        "/etc/klique/worker.token --state-dir /var/lib/klique-worker --gpus auto --drain "
        "--grace 60s"
    ) in text
    assert "kq_" not in text  # the token is fetched, never embedded
    script = tmp_path / "user-data.sh"
    script.write_text(text)
    check = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    # a pool or URL with shell characters stays one word
    odd = render(pool="burst", url="http://x/$(reboot)", region=REGION, token_ssm_parameter="/p")
    assert "'http://x/$(reboot)'" in odd


def test_spot_first_with_tags_user_data_and_lifecycle(ec2):
    url, cap = ec2
    p = make_provider("ec2", config(url), revision="sha256:r1")
    node = p.launch("burst", 1, spot=True)
    assert cap.calls == [("spot", "g5.xlarge")]
    (inst,) = instances(url)
    assert inst["InstanceId"] == node.id and inst["InstanceType"] == "g5.xlarge"
    assert inst.get("InstanceLifecycle") == "spot" and node.spot and node.gpus == 1
    tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
    assert tags == {
        "Name": "klique-burst",
        "klique:pool": "burst",
        "team": "ml",
        "klique:revision": "sha256:r1",
        "klique:managed-by": "klique-autoscaler",
        "klique:lifecycle": "spot",
    }
    import boto3

    c = boto3.client("ec2", region_name=REGION, endpoint_url=url)
    ud = c.describe_instance_attribute(InstanceId=node.id, Attribute="userData")
    assert base64.b64decode(ud["UserData"]["Value"]).decode() == p.user_data("burst")
    assert node.worker_id == f"ec2-{node.id}"
    listed = p.list("burst")
    assert [n.id for n in listed] == [node.id] and listed[0].up and listed[0].spot
    assert p.list("other") == []
    p.terminate(node)
    assert p.list("burst") == []
    p.terminate(node)  # idempotent


def test_capacity_errors_try_the_next_type_then_refuse(ec2):
    url, cap = ec2
    p = make_provider("ec2", config(url))
    cap.refuse[("spot", "g5.xlarge")] = "InsufficientInstanceCapacity"
    node = p.launch("burst", 1, spot=True)  # the next type that fits, still spot
    assert node.spot and node.meta["instance_type"] == "g5.12xlarge"
    cap.refuse[("spot", "g5.12xlarge")] = "MaxSpotInstanceCountExceeded"
    with pytest.raises(CapacityUnavailable) as exc:
        p.launch("burst", 1, spot=True)
    assert str(exc.value) == (
        "ec2: no spot capacity for 1 GPU(s): g5.xlarge: "
        "InsufficientInstanceCapacity; g5.12xlarge: "
        "MaxSpotInstanceCountExceeded"
    )
    with pytest.raises(CapacityUnavailable, match="no instance type has 8 GPU"):
        p.launch("burst", 8, spot=False)


def test_per_type_maximum(ec2):
    url, _ = ec2
    p = make_provider("ec2", config(url))
    a, b = p.launch("burst", 1, False), p.launch("burst", 1, False)
    assert {a.meta["instance_type"], b.meta["instance_type"]} == {"g5.xlarge"}
    c = p.launch("burst", 1, False)  # g5.xlarge at its max 2: the next type
    assert c.meta["instance_type"] == "g5.12xlarge" and c.gpus == 4
    assert p.launch("other", 1, False).meta["instance_type"] == "g5.xlarge"  # per pool
    p.terminate(a)
    assert p.launch("burst", 1, False).meta["instance_type"] == "g5.xlarge"  # room again
    one = make_provider(
        "ec2", config(url, instance_types=[{"name": "g5.xlarge", "gpus": 1, "max": 2}])
    )
    with pytest.raises(CapacityUnavailable, match=r"g5.xlarge at its maximum \(2/2\)"):
        one.launch("burst", 1, True)


def test_other_errors_are_provider_errors_not_capacity(ec2):
    url, cap = ec2
    cap.refuse[("on-demand", "g5.xlarge")] = "UnauthorizedOperation"
    p = make_provider("ec2", config(url))
    with pytest.raises(ProviderError, match="UnauthorizedOperation"):
        p.launch("burst", 1, False)


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"region": None}, "region is required"),
        ({"instance_types": []}, "instance_types is required"),
        ({"instance_types": [{"name": "g5.xlarge", "gpus": 0}]}, r"instance_types\[0\].gpus"),
        (
            {"instance_types": [{"name": "g5", "gpus": 1, "cores": 4}]},
            r"unknown key\(s\) \['cores'\]",
        ),
        ({"zone": "a"}, r"unknown setting\(s\) \['zone'\]"),
        ({"tags": {"a": 1}}, "tags is a mapping of strings"),
    ],
)
def test_config_errors_name_the_setting(bad, message):
    cfg = config("http://127.0.0.1:1", **bad)
    cfg = {k: v for k, v in cfg.items() if v is not None}
    with pytest.raises(ValueError, match=message):
        Ec2Provider.from_config(cfg)
    assert InstanceType.parse({"name": "x", "gpus": 2}, "t") == InstanceType("x", 2, None)


def test_without_boto3_the_provider_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "boto3", None)  # as if it were not installed
    with pytest.raises(ValueError, match=r"needs boto3: pip install 'klique\[ec2\]'"):
        make_provider("ec2", config("http://127.0.0.1:1"))


class TaskWorkerPeer(CloudPeer):
    """The cloud peer showing which worker holds a task, as ``kliqued serve`` does: the EC2
    provider cannot tell what an instance runs, the control plane can."""

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
                    "worker": t.worker,
                }
                for t in self.tasks.values()
            ]
        return web.json_response(
            {"tasks": [t for t in tasks if not want or t["state"] == want], "next": None}
        )


@pytest.mark.slow  # long on its own: make test, not make check
def test_cloud_node_runs_work_as_a_worker_and_is_released(ec2, tmp_path):
    """Spot refused by the emulator -> on-demand in the same round; the instance's worker
    (ec2-<id>) registers, runs the task, and the idle node is terminated in EC2."""
    url, cap = ec2
    cap.refuse.update(
        {
            ("spot", "g5.xlarge"): "InsufficientInstanceCapacity",
            ("spot", "g5.12xlarge"): "InsufficientInstanceCapacity",
        }
    )
    peer = TaskWorkerPeer(pool="burst")
    token = tmp_path / "burst.token"
    token.write_text(peer.token + "\n")
    token.chmod(0o600)
    p = make_provider(
        "ec2",
        config(
            url,
            url=peer.url,
            emulate_workers={
                "root": str(tmp_path / "emu"),
                "token_file": str(token),
                "worker_args": WORKER_ARGS,
            },
        ),
    )
    try:
        pol = ScalePolicy(max_milli=4000, idle_timeout_s=1.5, spot_first=True, node_gpus=1)
        scaler = Autoscaler(Client(peer.url, ADMIN), p, "burst", pol)
        tid = peer.submit(["sleep", "1"])
        r = scaler.step()
        assert [n.spot for n in r.launched] == [False]
        assert "g5.xlarge: InsufficientInstanceCapacity" in r.refused[0]
        (node,) = r.launched
        (inst,) = instances(url)
        assert inst["InstanceId"] == node.id and "InstanceLifecycle" not in inst
        end = peer.wait_for(lambda: peer.end(tid), 30, "the task to finish on the node")
        assert end["event"] == "finished"
        assert list(peer.workers) == [f"ec2-{node.id}"]  # the node is the worker
        assert scaler.step().launched == []
        r = wait_for(lambda: (x := scaler.step()).terminated and x, 15, "the idle release")
        assert r.terminated[0][0] == node.id and "idle" in r.terminated[0][1]
        (inst,) = instances(url)
        assert inst["State"]["Name"] in ("shutting-down", "terminated")
        assert p.list("burst") == []
        assert p.emulation is not None and p.emulation.list("burst") == []
    finally:
        for n in p.list("burst"):
            p.terminate(n)
        peer.close()


def test_everything_refused_waits_with_the_reason(ec2):
    url, cap = ec2
    for t in ("g5.xlarge", "g5.12xlarge"):
        for life in ("spot", "on-demand"):
            cap.refuse[(life, t)] = "InsufficientInstanceCapacity"
    peer = TaskWorkerPeer(pool="burst")
    try:
        p = make_provider("ec2", config(url, url=peer.url))
        scaler = Autoscaler(
            Client(peer.url, ADMIN),
            p,
            "burst",
            ScalePolicy(max_milli=4000, idle_timeout_s=60, node_gpus=1),
        )
        peer.submit(["true"])
        r = scaler.step()
        assert r.launched == [] and r.waiting == 1
        assert [x.split(":")[1].strip() for x in r.refused] == [
            "no spot capacity for 1 GPU(s)",
            "no on-demand capacity for 1 GPU(s)",
        ]
        assert instances(url) == []
        t0 = time.monotonic()
        assert scaler.step().launched == [] and time.monotonic() - t0 < 10
    finally:
        peer.close()


def test_with_kliqued_serve_capacity_wait_nodes_recorded_and_a_reclaimed_instance(ec2, tmp_path):
    """The EC2 provider with a real control plane: a capacity wait shows in the pool's view
    and the events, the node is recorded with its type, lifecycle and price, its worker is
    `ec2-<id>`, and an instance terminated behind the autoscaler's back (a reclaimed spot
    instance, a console click) is released in the next round: its worker deregistered by
    the autoscaler (never `lost`), its interval ended `gone`."""
    from tests.autoscaler.test_loop import ESTATE
    from tests.harness.daemon import ADMIN as SERVE_ADMIN, Server

    url, cap = ec2
    for t in ("g5.xlarge", "g5.12xlarge"):
        for life in ("spot", "on-demand"):
            cap.refuse[(life, t)] = "InsufficientInstanceCapacity"
    srv = Server(tmp_path, estate=ESTATE).start()
    p = None
    try:
        api = Client(srv.url, SERVE_ADMIN)
        token = tmp_path / "burst.token"
        token.write_text(api.create_token(worker=True, pool="burst")["token"] + "\n")
        token.chmod(0o600)
        p = make_provider(
            "ec2",
            config(
                url,
                url=srv.url,
                emulate_workers={
                    "root": str(tmp_path / "emu"),
                    "token_file": str(token),
                    "worker_args": WORKER_ARGS,
                },
            ),
        )
        scaler = Autoscaler(
            api, p, "burst", ScalePolicy(max_milli=1000, idle_timeout_s=60, node_gpus=1)
        )
        task = api.submit("team-a/one", ["sleep", "30"], user="alice")
        wait_for(lambda: api.task(task["id"])["state"] == "placed", 10, "placement")
        r = scaler.step()
        assert r.launched == [] and r.held is not None and r.held[0] == "capacity"
        burst = next(x for x in api.pools() if x["name"] == "burst")["cloud"]
        assert burst["scaling"]["cause"] == "capacity"
        assert "InsufficientInstanceCapacity" in burst["scaling"]["reason"]
        # on-demand comes back: the node is launched, recorded; the wait ends
        del cap.refuse[("on-demand", "g5.xlarge")]
        r = scaler.step()
        (node,) = r.launched
        burst = next(x for x in api.pools() if x["name"] == "burst")["cloud"]
        assert burst["scaling"] is None
        assert [
            (n["node"], n["instance_type"], n["lifecycle"], n["per_hour"], n["provider"])
            for n in burst["nodes"]
        ] == [(node.id, "g5.xlarge", "on-demand", "1", "ec2")]
        assert [e["data"]["cause"] for e in api.events(kind="scaling_waits")] == ["capacity", None]
        wait_for(lambda: api.task(task["id"])["started_at"], 30, "the task's start")
        assert [w["id"] for w in srv.ok("GET", "/v1/workers?pool=burst")["workers"]] == [
            f"ec2-{node.id}"
        ]
        # the instance is terminated behind the autoscaler's back; its worker dies with it
        import boto3

        boto3.client("ec2", region_name=REGION, endpoint_url=url).terminate_instances(
            InstanceIds=[node.id]
        )
        assert p.emulation is not None
        (local,) = p.emulation.list("burst")
        os.killpg(local.meta["pid"], signal.SIGKILL)
        r = scaler.step()
        assert r.terminated == [(node.id, "gone")]
        ended = list(api.events(kind="cloud_node_ended"))
        assert [(e["data"]["node"], e["data"]["reason"]) for e in ended] == [(node.id, "gone")]
        assert srv.ok("GET", "/v1/workers?pool=burst")["workers"] == []
        kinds = [e["kind"] for e in api.events()]
        assert "worker_deregistered" in kinds and "worker_lost" not in kinds
        assert scaler.step().terminated == []  # released once
    finally:
        try:
            if p is not None:
                for n in p.list("burst"):
                    p.terminate(n)
        finally:
            srv.stop()  # even when releasing a node failed: no daemon outlives its test


def test_cli_names_a_bad_ec2_config(tmp_path):
    from tests.autoscaler.test_loop import ESTATE, REPO

    bad = tmp_path / "ec2.yaml"
    bad.write_text("image_id: ami-1\ninstance_types: [{name: g5.xlarge, gpus: 1}]\n")
    env = {**os.environ, "KLIQUE_URL": "http://127.0.0.1:1", "KLIQUE_TOKEN": ADMIN}
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
            "--provider",
            "ec2",
            "--provider-config",
            str(bad),
            "--once",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert "ec2 provider: region is required" in out.stderr and "Traceback" not in out.stderr
