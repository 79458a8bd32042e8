"""The Kubernetes Job of a lease, and the mapping of a Job and its Pod to a task state.

Pure functions on plain data (manifests as dicts; the Job and the Pod as the official client's
models, V1Job and V1Pod), so that they are tested without a cluster: the manifests against
golden files, the mapping against API responses deserialised with the client's ApiClient.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any

from klique_util.poolsettings import PoolSettings
from klique_util.units import DAY_S, gpus_to_milli
from workers.executors.base import klique_env
from workers.gpus import MILLI, Gpu, memory_cap_env

MANAGED_BY = "klique-worker"
GPU_RESOURCE = "nvidia.com/gpu"
# Kubernetes' own signal convention for a container's exit code: 128 + N
SIGNALS = {
    129: "SIGHUP",
    130: "SIGINT",
    131: "SIGQUIT",
    134: "SIGABRT",
    137: "SIGKILL",
    139: "SIGSEGV",
    141: "SIGPIPE",
    142: "SIGALRM",
    143: "SIGTERM",
}


@dataclass(frozen=True)
class K8sSettings:
    """The worker's Kubernetes flags. The pool's settings in each lease (``namespace``,
    ``service_account``, ``runtime_class``, ``label.*``) win over them: ``for_lease``.

    fraction_resource: the extended resource a fraction asks for instead of a whole
      `nvidia.com/gpu`: a MIG profile (`nvidia.com/mig-1g.10gb`: one instance per fraction)
      or a shared-GPU resource (`nvidia.com/gpu.shared` from the device plugin's time-slicing
      with `renameByDefault`). None: a fraction takes a whole `nvidia.com/gpu`.
    fraction_units_per_gpu: how many units of `fraction_resource` make one GPU (the
      time-slicing `replicas`); a fraction asks for ceil(fraction x units), at least 1. 1 for
      MIG (one instance, whatever the fraction).
    """

    namespace: str = "default"
    image: str | None = None
    fraction_resource: str | None = None
    fraction_units_per_gpu: int = 1
    service_account: str | None = None
    ttl_after_finished_s: int = DAY_S


def for_lease(s: K8sSettings, lease: dict) -> K8sSettings:
    """``s`` with the lease's pool settings over it: the namespace and service account of
    the pool, when it names them."""
    ps = PoolSettings.from_lease(lease)
    return replace(
        s,
        namespace=ps.namespace or s.namespace,
        service_account=ps.get("service_account") or s.service_account,
    )


def dns_label(text: str, limit: int = 63) -> str:
    """A DNS-1123 label: lowercase alphanumerics and '-', starting and ending alphanumeric."""
    out = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return out[:limit].rstrip("-") or "x"


def job_name(task: str, epoch: int) -> str:
    suffix = f"-{int(epoch)}"
    return "klique-" + dns_label(str(task), 63 - len("klique-") - len(suffix)) + suffix


def label_value(text: str) -> str:
    out = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(text))[:63]
    return out.strip("_.-") or "x"


def gpu_resources(milli: int, s: K8sSettings) -> dict[str, str]:
    if milli <= 0:
        return {}
    if milli < MILLI and s.fraction_resource:
        units = max(1, math.ceil(milli * max(1, s.fraction_units_per_gpu) / MILLI))
        return {s.fraction_resource: str(units)}
    return {GPU_RESOURCE: str(max(1, math.ceil(milli / MILLI)))}


def task_env(
    lease: dict, gpus: list[Gpu] | None, gpu_indices: list[int], s: K8sSettings | None = None
) -> list[dict]:
    env = klique_env(lease)
    milli = gpus_to_milli(lease.get("gpus"))
    caps = memory_cap_env(gpus, gpu_indices[:1] if 0 < milli < MILLI else gpu_indices, milli)
    if caps and s is not None and (s.fraction_resource or "").startswith("nvidia.com/mig-"):
        # a MIG instance's memory is enforced by the hardware: only the fraction is said
        caps = {k: v for k, v in caps.items() if k == "KLIQUE_GPU_MEMORY_FRACTION"}
    env.update(caps)
    return [{"name": k, "value": v} for k, v in sorted(env.items())]


def lease_nodes(lease: dict) -> int:
    """The nodes a lease spans: a gang's (issue 15), else 1."""
    n = lease.get("nodes")
    return n if isinstance(n, int) and n > 1 else 1


DEFAULT_MASTER_PORT = 29500


def gang_env(lease: dict, name: str, namespace: str) -> list[dict]:
    """The rendezvous names torchrun and DeepSpeed read, for each pod of an indexed Job: the
    pod's index is its rank, index 0's stable name (through the headless Service of the
    same name) the master."""
    nodes = lease_nodes(lease)
    port = str((lease.get("env") or {}).get("MASTER_PORT") or DEFAULT_MASTER_PORT)
    index = {
        "valueFrom": {
            "fieldRef": {
                "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"
            }
        }
    }
    return [
        {"name": "MASTER_ADDR", "value": f"{name}-0.{name}.{namespace}.svc"},
        {"name": "MASTER_PORT", "value": port},
        {"name": "WORLD_SIZE", "value": str(nodes)},
        {"name": "RANK", **index},
        {"name": "NODE_RANK", **index},
        {"name": "LOCAL_RANK", "value": "0"},
        {"name": "LOCAL_WORLD_SIZE", "value": "1"},
    ]


def gang_service_manifest(
    lease: dict, s: K8sSettings, owner_uid: str | None = None
) -> dict[str, Any]:
    """The headless Service that gives an indexed Job's pods stable names
    (``<job>-<index>.<job>``); owned by the Job, so it goes with it."""
    task, epoch = str(lease["task"]), int(lease["epoch"])
    name = job_name(task, epoch)
    s = for_lease(s, lease)
    meta: dict[str, Any] = {
        "name": name,
        "namespace": s.namespace,
        "labels": {
            **PoolSettings.from_lease(lease).labels,
            "app.kubernetes.io/managed-by": MANAGED_BY,
            "klique.io/task": label_value(task),
            "klique.io/epoch": str(epoch),
        },
    }
    if owner_uid:
        meta["ownerReferences"] = [
            {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": owner_uid}
        ]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "clusterIP": "None",
            "selector": {"job-name": name},
            "publishNotReadyAddresses": True,
        },
    }


def job_manifest(
    lease: dict, s: K8sSettings, gpus: list[Gpu] | None = None, gpu_indices: list[int] | None = None
) -> dict[str, Any]:
    """The batch/v1 Job of a lease: one pod, never restarted (the control plane requeues),
    `nvidia.com/gpu: N` (or the pool's fraction resource) as limits. A gang over N nodes
    (issue 15) is an indexed Job of N pods, each with its node's share and its rank, all
    started together (parallelism N) and failed together (one pod's failure fails the Job:
    backoffLimit 0), beside a headless Service (``gang_service_manifest``).

    The pool's settings (the lease's ``settings``): its ``namespace`` and
    ``service_account`` over the worker's flags, its ``runtime_class`` as the pods'
    runtimeClassName, its ``label.NAME: value`` entries as labels of the Job and its pods
    (Klique's own labels, which the worker selects its Jobs by, are kept over them)."""
    task, epoch = str(lease["task"]), int(lease["epoch"])
    pool = PoolSettings.from_lease(lease)
    s = for_lease(s, lease)
    nodes = lease_nodes(lease)
    payload = lease.get("payload")
    image = (
        lease.get("image")
        or (payload.get("image") if isinstance(payload, dict) else None)
        or s.image
    )
    if not image:
        raise ValueError(
            "no image for this task: the lease names none and the worker has no --image"
        )
    labels = {
        **pool.labels,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        "klique.io/task": label_value(task),
        "klique.io/epoch": str(epoch),
    }
    annotations = {
        "klique.io/task": task,
        "klique.io/user": str(lease.get("user") or ""),
        "klique.io/project": str(lease.get("project") or ""),
        "klique.io/resource": str(lease.get("resource") or ""),
        "klique.io/gpus": str(lease.get("gpus", "")),
    }
    env = task_env(lease, gpus, gpu_indices or [], s)
    name = job_name(task, epoch)
    if nodes > 1:
        given = {e["name"] for e in gang_env(lease, name, s.namespace)}
        env = [e for e in env if e["name"] not in given] + gang_env(lease, name, s.namespace)
    container: dict[str, Any] = {"name": "task", "image": image, "env": env}
    if lease.get("command"):
        container["command"] = list(lease["command"])
    resources = gpu_resources(gpus_to_milli(lease.get("gpus")) // nodes, s)
    if resources:
        container["resources"] = {"limits": resources}
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": int(math.ceil(float(lease.get("grace_s", 30)))),
        "containers": [container],
    }
    if s.service_account:
        pod_spec["serviceAccountName"] = s.service_account
    if (runtime_class := pool.get("runtime_class")) is not None:
        pod_spec["runtimeClassName"] = runtime_class
    spec: dict[str, Any] = {"backoffLimit": 0}
    if nodes > 1:
        pod_spec["subdomain"] = name
        spec.update({"completionMode": "Indexed", "completions": nodes, "parallelism": nodes})
    spec.update(
        {
            "ttlSecondsAfterFinished": s.ttl_after_finished_s,
            "template": {
                "metadata": {"labels": labels, "annotations": annotations},
                "spec": pod_spec,
            },
        }
    )
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": s.namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": spec,
    }


def gang_job(job: Any) -> bool:
    """An indexed Job of several pods (a gang): its own conditions say when it ends."""
    spec = getattr(job, "spec", None)
    return (
        spec is not None
        and getattr(spec, "completion_mode", None) == "Indexed"
        and (getattr(spec, "completions", None) or 1) > 1
    )


# state mapping --------------------------------------------------------------------------------
@dataclass(frozen=True)
class PodState:
    """A task's state from its Job and Pod: `starting` (Pending), `running`, `finished`
    (Succeeded), `failed` (Failed: exit code or signal, and the reason: OOMKilled, Error,
    Evicted, DeadlineExceeded, ...)."""

    state: str
    exit_code: int | None = None
    signal: str | None = None
    reason: str | None = None
    message: str | None = None

    @property
    def ended(self) -> bool:
        return self.state in ("finished", "failed")


def _statuses(pod) -> list:
    """The container statuses, the task's container first."""
    if pod is None or pod.status is None:
        return []
    statuses = list(pod.status.container_statuses or [])
    return sorted(statuses, key=lambda cs: cs.name != "task")


def _terminated(pod) -> Any:
    for cs in _statuses(pod):
        for st in (cs.state, cs.last_state):
            if st is not None and st.terminated is not None:
                return st.terminated
    return None


def _waiting(pod) -> Any:
    for cs in _statuses(pod):
        if cs.state is not None and cs.state.waiting is not None:
            return cs.state.waiting
    return None


def _from_exit(code: int | None, reason: str | None, message: str | None, state: str) -> PodState:
    if code is not None and code in SIGNALS:
        return PodState(state, None, SIGNALS[code], reason, message)
    return PodState(state, code, None, reason, message)


def pod_state(job, pod) -> PodState:
    """Maps a V1Job and its (newest) V1Pod, either possibly None, to a task state."""
    phase = pod.status.phase if pod is not None and pod.status is not None else None
    if gang_job(job):
        # a gang's pods end one by one: the Job's conditions decide (Complete when every
        # index succeeded, Failed at the first failure, backoffLimit 0); until then it runs
        ended = [
            c
            for c in (job.status.conditions if job.status is not None else None) or []
            if c.status == "True" and c.type in ("Complete", "Failed")
        ]
        if not ended:
            if phase in ("Succeeded", "Failed"):
                return PodState("running")
        elif ended[0].type == "Complete":
            return PodState("finished", 0, None, "Completed")
        elif phase != "Failed":
            return PodState("failed", None, None, ended[0].reason, ended[0].message)
    if phase == "Succeeded":
        return PodState("finished", 0, None, "Completed")
    if phase == "Failed":
        term = _terminated(pod)
        reason = (term.reason if term is not None else None) or pod.status.reason
        message = (term.message if term is not None else None) or pod.status.message
        code = term.exit_code if term is not None else None
        return _from_exit(code, reason, message, "failed")
    if phase == "Running":
        return PodState("running")
    if phase == "Pending":
        waiting = _waiting(pod)
        if waiting is not None:
            return PodState("starting", reason=waiting.reason, message=waiting.message)
        for cond in pod.status.conditions or []:  # e.g. Unschedulable: no GPU free
            if cond.type == "PodScheduled" and cond.status == "False":
                return PodState("starting", reason=cond.reason, message=cond.message)
        return PodState("starting", reason=pod.status.reason, message=pod.status.message)
    # no pod (not created yet, or deleted): the Job's conditions say the rest
    if job is not None and job.status is not None:
        for cond in job.status.conditions or []:
            if cond.status != "True":
                continue
            if cond.type == "Complete":
                return PodState("finished", 0, None, "Completed")
            if cond.type == "Failed":
                return PodState("failed", None, None, cond.reason, cond.message)
        if job.status.succeeded:
            return PodState("finished", 0, None, "Completed")
        if job.status.failed:
            return PodState("failed", None, None, "Failed", "the job's pod failed")
    if job is None and pod is None:
        return PodState("failed", None, None, "NotFound", "the job and its pod are gone")
    return PodState("starting", reason="NoPodYet")
