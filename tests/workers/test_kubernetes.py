"""The Kubernetes executor without a cluster (none can run here: docs/executors.md).

- The Jobs it builds are compared with golden files (tests/workers/golden/k8s-*.json;
  `KLIQUE_UPDATE_GOLDEN=1` rewrites them) and must round-trip through the official client's
  V1Job model, so that every field name is one the API knows.
- Its state mapping is checked against API responses (tests/workers/recorded/*.json) that the
  client's ApiClient.deserialize turns into V1Job / V1Pod as it does with a server's answer.
- start/poll/stop/adopt run against a stand-in for BatchV1Api/CoreV1Api that serves those
  recorded objects and records the calls (create with the manifest, delete with the grace
  and propagation Foreground).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

kubernetes = pytest.importorskip("kubernetes", reason="pip install 'klique[kubernetes]'")
from kubernetes.client import ApiClient  # noqa: E402

from workers.executors.base import Exited, Running, StartError  # noqa: E402
from workers.executors.k8s_manifest import (  # noqa: E402
    K8sSettings,
    PodState,
    gang_service_manifest,
    job_manifest,
    job_name,
    pod_state,
)
from workers.executors.kubernetes import KubernetesExecutor  # noqa: E402
from workers.gpus import Gpu  # noqa: E402

HERE = Path(__file__).parent
GOLDEN, RECORDED = HERE / "golden", HERE / "recorded"
GPUS = [Gpu(i, f"GPU-{i}", 40960) for i in range(4)]


def deserialize(name: str, kind: str):
    """A recorded response as the client deserialises a server's answer."""
    text = (RECORDED / f"{name}.json").read_text()
    client = ApiClient()
    try:
        return client.deserialize(text, kind, "application/json")  # client >= 31
    except TypeError:  # older clients
        # an older client's signature: a response object, no content type
        return client.deserialize(SimpleNamespace(data=text), kind)  # type: ignore[call-arg, arg-type]


def lease(**extra) -> dict:
    return {
        "task": "t-0042",
        "epoch": 1,
        "command": ["python", "train.py", "--lr", "3e-4"],
        "gpus": 2.0,
        "grace_s": 30,
        "user": "alice",
        "project": "vision",
        "resource": "research/standard",
        "env": {"WANDB_MODE": "offline"},
        **extra,
    }


CASES = {
    "k8s-job-whole": (lease(), K8sSettings(namespace="ml-batch", image="train:1"), [0, 1]),
    "k8s-job-mig-fraction": (
        lease(gpus=0.5, grace_s=45.5),
        K8sSettings(
            namespace="ml-batch", image="train:1", fraction_resource="nvidia.com/mig-1g.10gb"
        ),
        [2],
    ),
    "k8s-job-shared-fraction": (
        lease(gpus=0.25, image="registry.example.com/ml/eval:7"),
        K8sSettings(
            namespace="ml-batch",
            image="train:1",
            fraction_resource="nvidia.com/gpu.shared",
            fraction_units_per_gpu=4,
            service_account="klique-tasks",
        ),
        [3],
    ),
    "k8s-job-fraction-whole-gpu": (
        lease(gpus=0.5, command=None),
        K8sSettings(namespace="default", image="train:1"),
        [0],
    ),
    # issue 15: a gang over 2 nodes, 4 GPUs on each
    "k8s-job-gang": (
        lease(gpus=8.0, nodes=2, env={"WANDB_MODE": "offline", "MASTER_PORT": "29400"}),
        K8sSettings(namespace="ml-batch", image="train:1"),
        [0, 1, 2, 3],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_job_manifests_match_the_golden_files(case):
    lease_, settings, indices = CASES[case]
    manifest = job_manifest(lease_, settings, GPUS, indices)
    path = GOLDEN / f"{case}.json"
    text = json.dumps(manifest, indent=2) + "\n"
    if os.environ.get("KLIQUE_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{path} differs (KLIQUE_UPDATE_GOLDEN=1 rewrites it)"
    # every field is one the API knows: it round-trips through the client's V1Job
    client = ApiClient()
    try:
        job = client.deserialize(text, "V1Job", "application/json")
    except TypeError:
        job = client.deserialize(SimpleNamespace(data=text), "V1Job")
    assert client.sanitize_for_serialization(job) == manifest


def test_what_the_manifests_ask_for():
    whole = job_manifest(*CASES["k8s-job-whole"][:2], GPUS, [0, 1])
    c = whole["spec"]["template"]["spec"]["containers"][0]
    assert c["resources"] == {"limits": {"nvidia.com/gpu": "2"}}
    assert whole["spec"]["backoffLimit"] == 0
    assert whole["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    assert whole["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 30
    mig = job_manifest(*CASES["k8s-job-mig-fraction"][:2], GPUS, [2])
    c = mig["spec"]["template"]["spec"]["containers"][0]
    assert c["resources"] == {"limits": {"nvidia.com/mig-1g.10gb": "1"}}
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["KLIQUE_GPU_MEMORY_FRACTION"] == "0.5" and "CUDA_VISIBLE_DEVICES" not in env
    assert "KLIQUE_GPU_MEMORY_MB" not in env  # MIG enforces the instance's memory
    shared_env = {
        e["name"]: e["value"]
        for e in job_manifest(*CASES["k8s-job-shared-fraction"][:2], GPUS, [3])["spec"]["template"][
            "spec"
        ]["containers"][0]["env"]
    }
    assert shared_env["KLIQUE_GPU_MEMORY_MB"] == "10240"
    shared = job_manifest(*CASES["k8s-job-shared-fraction"][:2], GPUS, [3])
    assert shared["spec"]["template"]["spec"]["containers"][0]["resources"] == {
        "limits": {"nvidia.com/gpu.shared": "1"}
    }
    three_quarters = job_manifest(lease(gpus=0.75), CASES["k8s-job-shared-fraction"][1], GPUS, [3])
    assert three_quarters["spec"]["template"]["spec"]["containers"][0]["resources"] == {
        "limits": {"nvidia.com/gpu.shared": "3"}
    }
    assert job_name("Team/Run_1" * 10, 12).endswith("-12")
    assert len(job_name("x" * 200, 123456)) <= 63
    with pytest.raises(ValueError, match="no image"):
        job_manifest(lease(), K8sSettings())


RECORDED_STATES = [
    ("job-active", "pod-pending-unschedulable", PodState("starting", reason="Unschedulable")),
    ("job-active", "pod-pending-imagepullbackoff", PodState("starting", reason="ImagePullBackOff")),
    ("job-active", "pod-running", PodState("running")),
    ("job-complete", "pod-succeeded", PodState("finished", 0, None, "Completed")),
    ("job-failed-backofflimit", "pod-failed-error", PodState("failed", 3, None, "Error")),
    (
        "job-failed-backofflimit",
        "pod-failed-oomkilled",
        PodState("failed", None, "SIGKILL", "OOMKilled"),
    ),
    (
        "job-failed-backofflimit",
        "pod-failed-evicted",
        PodState("failed", None, "SIGKILL", "ContainerStatusUnknown"),
    ),
    ("job-deleting", "pod-deleted-sigterm", PodState("failed", None, "SIGTERM", "Error")),
    ("job-complete", None, PodState("finished", 0, None, "Completed")),
    ("job-failed-backofflimit", None, PodState("failed", None, None, "BackoffLimitExceeded")),
    ("job-active", None, PodState("starting", reason="NoPodYet")),
    (None, None, PodState("failed", reason="NotFound")),
]


@pytest.mark.parametrize(
    "job_file,pod_file,expected", RECORDED_STATES, ids=[f"{j}+{p}" for j, p, _ in RECORDED_STATES]
)
def test_pod_phases_map_to_task_states(job_file, pod_file, expected):
    job = deserialize(job_file, "V1Job") if job_file else None
    pod = deserialize(pod_file, "V1Pod") if pod_file else None
    got = pod_state(job, pod)
    assert (got.state, got.exit_code, got.signal, got.reason) == (
        expected.state,
        expected.exit_code,
        expected.signal,
        expected.reason,
    )
    if pod_file == "pod-failed-error":
        assert got.message.startswith("loss is NaN")
    if pod_file == "pod-pending-unschedulable":
        assert "Insufficient nvidia.com/gpu" in got.message


# the executor against a stand-in API ----------------------------------------------------------
class FakeApi:
    """BatchV1Api + CoreV1Api serving recorded objects; records the calls."""

    def __init__(self):
        self.job, self.pod = None, None
        self.calls: list[tuple] = []
        self.fail_create: Exception | None = None
        self.on_delete = None

    def create_namespaced_job(self, namespace, body, **kw):
        self.calls.append(("create", namespace, body))
        if self.fail_create:
            raise self.fail_create
        self.job = deserialize("job-active", "V1Job")
        return self.job

    def list_namespaced_job(self, namespace, label_selector=None, **kw):
        self.calls.append(("list_jobs", namespace, label_selector))
        return SimpleNamespace(items=[self.job] if self.job else [])

    def list_namespaced_pod(self, namespace, label_selector=None, **kw):
        self.calls.append(("list_pods", namespace, label_selector))
        return SimpleNamespace(items=[self.pod] if self.pod else [])

    def read_namespaced_pod_log(self, name, namespace, container=None, **kw):
        self.calls.append(("log", name, namespace))
        return "epoch 1 loss 0.9\nepoch 2 loss 0.7\n"

    def delete_namespaced_job(self, name, namespace, **kw):
        self.calls.append(
            (
                "delete",
                name,
                namespace,
                kw.get("grace_period_seconds"),
                kw.get("propagation_policy"),
            )
        )
        if self.on_delete:
            self.on_delete()


@pytest.fixture
def api():
    return FakeApi()


def make(api, tmp_path, **settings):
    s = K8sSettings(namespace="ml-batch", image="registry.example.com/ml/train:2024.05", **settings)
    return KubernetesExecutor(
        tmp_path / "state",
        settings=s,
        gpus=GPUS,
        api=(api, api),
        poll_interval_s=0.0,
        log_interval_s=0.0,
    )


def test_start_poll_and_finish_with_the_pod_log(api, tmp_path):
    ex = make(api, tmp_path)
    log = tmp_path / "t.log"
    h = ex.start(lease(), [0, 1], log)
    ((_, ns, body),) = [c for c in api.calls if c[0] == "create"]
    assert ns == "ml-batch" and body["metadata"]["name"] == "klique-t-0042-1"
    assert h.to_record() == {
        "name": "klique-t-0042-1",
        "namespace": "ml-batch",
        "log_path": str(log),
    }
    api.pod = deserialize("pod-pending-unschedulable", "V1Pod")
    assert isinstance(ex.poll(h), Running) and h.last.state == "starting"
    api.pod = deserialize("pod-running", "V1Pod")
    assert isinstance(ex.poll(h), Running) and h.last.state == "running"
    api.job, api.pod = deserialize("job-complete", "V1Job"), deserialize("pod-succeeded", "V1Pod")
    r = ex.poll(h)
    assert r.exit_code == 0 and r.signal is None and "Completed" in r.message
    assert log.read_text() == "epoch 1 loss 0.9\nepoch 2 loss 0.7\n"  # copied once
    assert ex.poll(h) is r


def test_oomkilled_is_a_failure_with_its_reason(api, tmp_path):
    ex = make(api, tmp_path)
    h = ex.start(lease(), [0, 1], tmp_path / "t.log")
    api.job = deserialize("job-failed-backofflimit", "V1Job")
    api.pod = deserialize("pod-failed-oomkilled", "V1Pod")
    r = ex.poll(h)
    assert (r.exit_code, r.signal) == (None, "SIGKILL") and "OOMKilled" in r.message


def test_stop_deletes_the_job_with_the_grace_and_foreground_propagation(api, tmp_path):
    ex = make(api, tmp_path)
    h = ex.start(lease(), [0, 1], tmp_path / "t.log")
    api.pod = deserialize("pod-running", "V1Pod")
    assert isinstance(ex.poll(h), Running)

    def deleted():
        api.job = deserialize("job-deleting", "V1Job")
        api.pod = deserialize("pod-deleted-sigterm", "V1Pod")

    api.on_delete = deleted
    r = asyncio.run(ex.stop(h, 12.5))
    ((_, name, ns, grace, policy),) = [c for c in api.calls if c[0] == "delete"]
    assert (name, ns, grace, policy) == ("klique-t-0042-1", "ml-batch", 13, "Foreground")
    assert (r.exit_code, r.signal) == (None, "SIGTERM")


def test_stop_of_a_job_whose_pod_is_already_gone(api, tmp_path):
    ex = make(api, tmp_path)
    h = ex.start(lease(), [0, 1], tmp_path / "t.log")
    api.pod = deserialize("pod-running", "V1Pod")
    ex.poll(h)

    def gone():
        api.job, api.pod = None, None

    api.on_delete = gone
    r = asyncio.run(ex.stop(h, 0))
    assert [c[3] for c in api.calls if c[0] == "delete"] == [0]
    assert r.signal == "SIGKILL" and "deleted" in r.message


def test_adopt_and_start_errors(api, tmp_path):
    ex = make(api, tmp_path)
    h = ex.adopt({"name": "klique-t-0042-1", "namespace": "ml-batch", "log_path": ""})
    api.job, api.pod = deserialize("job-active", "V1Job"), deserialize("pod-running", "V1Pod")
    assert isinstance(ex.poll(h), Running)
    api.job = deserialize("job-failed-backofflimit", "V1Job")
    api.pod = deserialize("pod-failed-error", "V1Pod")
    assert ex.poll(h).exit_code == 3
    api.fail_create = kubernetes.client.exceptions.ApiException(status=403, reason="Forbidden")
    with pytest.raises(StartError, match="403 Forbidden"):
        ex.start(lease(task="t-2"), [0], tmp_path / "2.log")
    api.fail_create = kubernetes.client.exceptions.ApiException(status=409, reason="Conflict")
    assert ex.start(lease(task="t-3"), [0], tmp_path / "3.log").name == "klique-t-3-1"
    no_image = KubernetesExecutor(tmp_path, settings=K8sSettings(), api=(api, api))
    with pytest.raises(StartError, match="no image"):
        no_image.start(lease(), [0], tmp_path / "4.log")
    assert isinstance(Exited(0), Exited)


def test_a_gang_is_an_indexed_job_with_a_headless_service_for_its_rendezvous():
    """Issue 15: N pods started and failed together, each with its rank from its completion
    index and the master at index 0's stable name (golden manifests)."""
    manifest = job_manifest(*CASES["k8s-job-gang"][:2], GPUS, [0, 1, 2, 3])
    spec = manifest["spec"]
    assert (
        spec["completionMode"],
        spec["completions"],
        spec["parallelism"],
        spec["backoffLimit"],
    ) == ("Indexed", 2, 2, 0)
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == "klique-t-0042-1"
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["MASTER_ADDR"]["value"] == "klique-t-0042-1-0.klique-t-0042-1.ml-batch.svc"
    assert env["MASTER_PORT"]["value"] == "29400" and env["WORLD_SIZE"]["value"] == "2"
    assert "job-completion-index" in env["RANK"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert pod["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": "4"}}
    service = gang_service_manifest(CASES["k8s-job-gang"][0], CASES["k8s-job-gang"][1], "uid-1")
    path = GOLDEN / "k8s-service-gang.json"
    text = json.dumps(service, indent=2) + "\n"
    if os.environ.get("KLIQUE_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()
    assert service["spec"]["clusterIP"] == "None"
    assert service["metadata"]["ownerReferences"][0]["uid"] == "uid-1"


def test_one_pod_of_a_gang_ending_is_not_the_gang_ending():
    job = deserialize("job-active", "V1Job")
    job.spec.completion_mode, job.spec.completions = "Indexed", 2
    assert pod_state(job, deserialize("pod-succeeded", "V1Pod")).state == "running"
    done = deserialize("job-complete", "V1Job")
    done.spec.completion_mode, done.spec.completions = "Indexed", 2
    assert pod_state(done, deserialize("pod-succeeded", "V1Pod")).state == "finished"
    failed = deserialize("job-failed-backofflimit", "V1Job")
    failed.spec.completion_mode, failed.spec.completions = "Indexed", 2
    st = pod_state(failed, deserialize("pod-failed-oomkilled", "V1Pod"))
    assert st.state == "failed" and st.reason == "OOMKilled"
    assert pod_state(failed, deserialize("pod-running", "V1Pod")).state == "failed"
