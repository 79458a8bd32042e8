"""Issue 25, item 10: each executor maps the pool's settings that a lease carries onto its
jobs: Slurm ``--partition``/``--account``/``--qos``, PBS ``-q``/``-A``, LSF ``-q``/``-P``, a
Kubernetes namespace, runtime class and labels; the pool's value wins over the worker's
flag (with one warning), and a setting the executor does not read is ignored with one
warning. The real Slurm and a real control plane: tests/slurm/test_pool_settings_slurm.py,
tests/daemon/test_pool_settings.py."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from klique_util.poolsettings import PoolSettings
from workers.executors.k8s_manifest import K8sSettings, gang_service_manifest, job_manifest
from workers.executors.kubernetes import KubernetesExecutor
from workers.executors.lsf import Lsf
from workers.executors.pbs import Pbs
from workers.executors.process import ProcessExecutor
from workers.executors.slurm import SlurmExecutor, sbatch_command

HPC = {"scheduler": "slurm", "partition": "gpu", "account": "northwind-klique", "qos": "high"}


def lease(settings: dict | None = None, **extra) -> dict:
    out = {
        "task": "t-7",
        "epoch": 2,
        "command": ["python", "train.py"],
        "gpus": 1.0,
        "grace_s": 30,
        "user": "alice",
        "project": "p",
        "resource": "r/one",
        "env": {},
        **extra,
    }
    if settings is not None:
        out["settings"] = settings
    return out


def test_sbatch_gets_the_pools_partition_account_and_qos_after_the_workers_own():
    cmd = sbatch_command(
        lease(HPC),
        partition="debug",
        log_path="/l",
        workdir=None,
        extra=["--account=ml", "--time=10"],
    )
    # the worker's --partition is not used; --sbatch-arg stays, the pool's come last and win
    assert "debug" not in cmd and "--partition" not in cmd
    assert cmd[-5:] == [
        "--account=ml",
        "--time=10",
        "--partition=gpu",
        "--account=northwind-klique",
        "--qos=high",
    ]
    # no settings (an older control plane): the worker's flag, as before
    bare = sbatch_command(lease(), partition="debug", log_path="/l", workdir=None)
    assert bare[bare.index("--partition") + 1] == "debug"
    assert not any(a.startswith(("--account", "--qos")) for a in bare)


def test_qsub_and_bsub_get_the_pools_queue_and_account():
    pbs = Pbs().submit(
        lease({"queue": "gpu-long", "account": "nw"}),
        gpus=2,
        queue="workq",
        workdir="/w",
        extra=["-l", "walltime=1:00:00"],
    )
    assert pbs == [
        "qsub",
        "-N",
        "klique-t-7",
        "-V",
        "-j",
        "oe",
        "-o",
        "/dev/null",
        "-l",
        "select=1:ngpus=2",
        "-l",
        "walltime=1:00:00",
        "-q",
        "gpu-long",
        "-A",
        "nw",
    ]
    lsf = Lsf().submit(
        lease({"queue": "gpu-long", "account": "nw"}),
        gpus=1,
        queue="normal",
        workdir="/w",
        extra=[],
    )
    assert lsf == [
        "bsub",
        "-J",
        "klique-t-7",
        "-o",
        "/dev/null",
        "-cwd",
        "/w",
        "-gpu",
        "num=1",
        "-q",
        "gpu-long",
        "-P",
        "nw",
    ]
    # without pool settings the worker's --queue, as before
    assert Pbs().submit(lease(), gpus=0, queue="workq", workdir="/w", extra=[])[-2:] == [
        "-q",
        "workq",
    ]
    assert Lsf().submit(lease(), gpus=0, queue="normal", workdir="/w", extra=[])[-2:] == [
        "-q",
        "normal",
    ]


def test_a_kubernetes_job_goes_to_the_pools_namespace_with_its_labels_and_runtime_class():
    settings = {
        "namespace": "klique-work",
        "runtime_class": "nvidia",
        "service_account": "klique-tasks",
        "label.team": "vision",
        "label.example.com/cost-centre": "cc-42",
        "label.app.kubernetes.io/managed-by": "someone-else",
    }
    flags = K8sSettings(namespace="default", image="train:1", service_account="flag-sa")
    job = job_manifest(lease(settings), flags)
    assert job["metadata"]["namespace"] == "klique-work"
    for labels in (job["metadata"]["labels"], job["spec"]["template"]["metadata"]["labels"]):
        assert labels["team"] == "vision" and labels["example.com/cost-centre"] == "cc-42"
        # Klique's own label (the worker lists its Jobs by it) is not the pool's to change
        assert labels["app.kubernetes.io/managed-by"] == "klique-worker"
    pod = job["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["serviceAccountName"] == "klique-tasks"
    gang = gang_service_manifest(lease(settings, nodes=2), flags)
    assert gang["metadata"]["namespace"] == "klique-work"
    # no settings: the flags, as before
    plain = job_manifest(lease(), flags)
    assert plain["metadata"]["namespace"] == "default"
    assert "runtimeClassName" not in plain["spec"]["template"]["spec"]
    assert "team" not in plain["metadata"]["labels"]


class Api:
    """BatchV1Api + CoreV1Api that only records where it was asked to create and list."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def create_namespaced_job(self, namespace, body, **kw):
        self.calls.append(("create", namespace))
        return SimpleNamespace(metadata=SimpleNamespace(uid="u"))

    def list_namespaced_job(self, namespace, **kw):
        self.calls.append(("list_jobs", namespace))
        return SimpleNamespace(items=[])

    def list_namespaced_pod(self, namespace, **kw):
        self.calls.append(("list_pods", namespace))
        return SimpleNamespace(items=[])


def test_the_kubernetes_executor_watches_the_namespaces_its_pools_settings_name(tmp_path):
    api = Api()
    ex = KubernetesExecutor(
        tmp_path / "s", settings=K8sSettings(image="i:1"), api=(api, api), poll_interval_s=0.0
    )
    h = ex.start(lease({"namespace": "klique-work"}), [0], tmp_path / "t.log")
    assert h.namespace == "klique-work" and ("create", "klique-work") in api.calls
    ex.poll(h)
    listed = {ns for what, ns in api.calls if what == "list_jobs"}
    assert listed == {"default", "klique-work"}


def test_a_flag_the_pool_overrides_and_a_setting_no_executor_reads_warn_once(tmp_path, caplog):
    ex = SlurmExecutor(tmp_path / "s", partition="debug")
    with caplog.at_level(logging.WARNING):
        assert ex.setting(lease(HPC), "partition", "--partition", "debug") == "gpu"
        assert ex.setting(lease(HPC), "partition", "--partition", "debug") == "gpu"
    warned = [r.getMessage() for r in caplog.records]
    assert warned == [
        "--partition debug is overridden by the pool's settings.partition: gpu "
        "(the estate wins; drop the flag)"
    ]
    assert ex.setting(lease(), "partition", "--partition", "debug") == "debug"
    # which keys an executor leaves unread: not the ones describing the pool or the gang's
    ps = PoolSettings({**HPC, "queue": "q", "acount": "x", "master_port": "29500"})
    assert ps.unread_by("slurm") == ["acount", "queue"]
    assert ps.unread_by("pbs") == ["acount", "partition", "qos"]
    assert PoolSettings({"mode": "docker", "label.a": "b"}).unread_by("process") == ["label.a"]
    assert PoolSettings({"label.a": "b"}).unread_by("kubernetes") == []
    assert ProcessExecutor(tmp_path / "p").name == "process"


@pytest.mark.parametrize(
    "raw, expect",
    [
        ({"account": "a", "port": 3}, {"account": "a"}),
        ("not a map", {}),
    ],
)
def test_settings_that_are_not_strings_are_dropped(raw, expect):
    assert dict(PoolSettings.from_lease({"settings": raw}).values) == expect
