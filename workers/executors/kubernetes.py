"""The Kubernetes executor: one batch/v1 Job per task, through the official Python client
(`pip install 'klique[kubernetes]'`).

- Start: creates the Job of ``k8s_manifest.job_manifest`` (one pod, restartPolicy Never,
  backoffLimit 0, `nvidia.com/gpu: N` or the pool's fraction resource as limits,
  terminationGracePeriodSeconds = the lease's grace) in the pool's namespace (its settings),
  else the worker's ``--namespace``.
- State: one list of the worker's Jobs and one of their Pods (label
  app.kubernetes.io/managed-by=klique-worker) at most every ``poll_interval_s``, mapped by
  ``k8s_manifest.pod_state``: Pending → starting, Running → running, Succeeded → finished,
  Failed → failed with the container's exit code (128+N as signal N) and reason (OOMKilled...).
- Stop: deletes the Job with ``grace_period_seconds`` = the grace and propagation Foreground
  (the kubelet sends SIGTERM, then SIGKILL after the grace), then waits for the pod to go.
- Logs: the pod's log is appended to the task's log file (``read_namespaced_pod_log`` with
  ``since_seconds`` windows is not exact, so the whole log is fetched at the end of the task,
  and during it every ``log_interval_s``, appending only the new bytes).
- Adopt: by the Job's name and namespace.

No cluster runs in this project's tests: the manifests are tested against golden files and
the state mapping against API responses deserialised with the client's ApiClient
(tests/workers/test_kubernetes.py, docs/executors.md).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers.executors.base import RUNNING, Executor, Exited, Handle, Running, StartError
from workers.executors.k8s_manifest import (
    MANAGED_BY,
    K8sSettings,
    PodState,
    gang_service_manifest,
    job_manifest,
    lease_nodes,
    pod_state,
)
from workers.errors import ConfigError
from workers.gpus import Gpu

log = logging.getLogger(__name__)

SELECTOR = f"app.kubernetes.io/managed-by={MANAGED_BY}"


def load_client(kubeconfig: str | None = None, context: str | None = None):
    """(BatchV1Api, CoreV1Api) from a kubeconfig, or the in-cluster service account."""
    try:
        from kubernetes import client, config
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigError(
            "the Kubernetes executor needs the kubernetes package: pip install 'klique[kubernetes]'"
        ) from exc
    try:
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, context=context)
        else:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config(context=context)
    except Exception as exc:
        raise ConfigError(f"no Kubernetes credentials: {exc}") from exc
    return client.BatchV1Api(), client.CoreV1Api()


@dataclass
class K8sHandle(Handle):
    name: str
    namespace: str
    log_path: str = ""
    log_offset: int = 0  # bytes of the pod's log already in the file
    last: PodState | None = field(default=None, repr=False)
    stopped_with: str | None = None
    result: Exited | None = field(default=None, repr=False)

    def to_record(self) -> dict[str, Any]:
        return {"name": self.name, "namespace": self.namespace, "log_path": self.log_path}


def to_exited(h: K8sHandle, st: PodState) -> Exited:
    parts = [f"job {h.namespace}/{h.name}"]
    if st.reason:
        parts.append(st.reason)
    if st.message:
        parts.append(st.message.strip()[:300])
    if st.state == "finished":
        return Exited(0, None, ": ".join(parts))
    sig = st.signal
    if st.exit_code is None and sig is None and h.stopped_with:
        sig = h.stopped_with
    return Exited(st.exit_code, sig, ": ".join(parts))


class KubernetesExecutor(Executor[K8sHandle]):
    name = "kubernetes"

    def __init__(
        self,
        state_dir: str | Path,
        settings: K8sSettings | None = None,
        gpus: list[Gpu] | None = None,
        api: tuple[Any, Any] | None = None,
        kubeconfig: str | None = None,
        context: str | None = None,
        poll_interval_s: float = 2.0,
        log_interval_s: float = 5.0,
    ):
        self.settings = settings or K8sSettings()
        self.gpus = list(gpus or [])
        self.batch, self.core = api if api is not None else load_client(kubeconfig, context)
        self.poll_interval_s = poll_interval_s
        self.log_interval_s = log_interval_s
        self._jobs: dict[str, Any] = {}
        self._pods: dict[str, Any] = {}
        self._snap_at = -1.0
        self._snap_ok = True
        self._warned_at = 0.0
        self._log_at: dict[str, float] = {}
        self._namespaces: set[str] = {self.settings.namespace}
        """Where its Jobs are: the flag's namespace and every pool namespace a lease or an
        adopted task named (a pool's settings may move its Jobs)."""

    # Executor ----------------------------------------------------------------------------
    def start(self, lease: dict, gpu_indices: list[int], log_path: Path) -> K8sHandle:
        # the pool's namespace and service account win (k8s_manifest.for_lease); a flag
        # given that says otherwise is named once (the default namespace is no choice)
        if self.settings.namespace != "default":
            self.setting(lease, "namespace", "--namespace", self.settings.namespace)
        self.setting(lease, "service_account", "--service-account", self.settings.service_account)
        try:
            manifest = job_manifest(lease, self.settings, self.gpus, gpu_indices)
        except ValueError as exc:
            raise StartError(str(exc)) from exc
        command = lease.get("command")
        if command is not None and (
            not isinstance(command, list) or not all(isinstance(a, str) for a in command)
        ):
            raise StartError(f"the task's command must be a list of strings, not {command!r}")
        ns, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        self._namespaces.add(ns)
        created = None
        try:
            created = self.batch.create_namespaced_job(ns, manifest, _request_timeout=30)
        except Exception as exc:
            status = getattr(exc, "status", None)
            if status != 409:  # 409: it exists (a retried start): take it as it is
                raise StartError(f"cannot create job {ns}/{name}: {_api_error(exc)}") from exc
        if lease_nodes(lease) > 1:  # a gang: the pods' stable names for the rendezvous
            uid = getattr(getattr(created, "metadata", None), "uid", None)
            try:
                self.core.create_namespaced_service(
                    ns, gang_service_manifest(lease, self.settings, uid), _request_timeout=30
                )
            except Exception as exc:
                if getattr(exc, "status", None) != 409:
                    raise StartError(
                        f"cannot create service {ns}/{name} for the gang's "
                        f"rendezvous: {_api_error(exc)}"
                    ) from exc
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        return K8sHandle(name=name, namespace=ns, log_path=str(log_path))

    def adopt(self, record: dict[str, Any]) -> K8sHandle:
        h = K8sHandle(
            name=str(record["name"]),
            namespace=str(record["namespace"]),
            log_path=str(record.get("log_path") or ""),
        )
        self._namespaces.add(h.namespace)
        try:
            h.log_offset = Path(h.log_path).stat().st_size if h.log_path else 0
        except OSError:
            h.log_offset = 0
        return h

    # state -------------------------------------------------------------------------------
    def _refresh(self) -> None:
        jobs: list[Any] = []
        pods: list[Any] = []
        try:
            for ns in sorted(self._namespaces):
                jobs += (
                    self.batch.list_namespaced_job(
                        ns, label_selector=SELECTOR, _request_timeout=10
                    ).items
                    or []
                )
                pods += (
                    self.core.list_namespaced_pod(
                        ns, label_selector=SELECTOR, _request_timeout=10
                    ).items
                    or []
                )
        except Exception as exc:
            now = time.monotonic()
            if now - self._warned_at > 60:
                self._warned_at = now
                log.warning(
                    "the Kubernetes API failed (%s): its jobs are taken as running", _api_error(exc)
                )
            self._snap_ok = False
            self._snap_at = time.monotonic()
            return
        self._jobs = {j.metadata.name: j for j in jobs}
        newest: dict[str, Any] = {}
        for p in pods:
            owner = (p.metadata.labels or {}).get("job-name") or (p.metadata.labels or {}).get(
                "batch.kubernetes.io/job-name"
            )
            if not owner:
                continue
            if owner not in newest or _created(p) > _created(newest[owner]):
                newest[owner] = p
        self._pods = newest
        self._snap_ok = True
        self._snap_at = time.monotonic()

    def state(self, h: K8sHandle, fresh: bool = False) -> PodState | None:
        if fresh or time.monotonic() - self._snap_at >= self.poll_interval_s:
            self._refresh()
        if not self._snap_ok:
            return None
        job, pod = self._jobs.get(h.name), self._pods.get(h.name)
        if job is None and pod is None and h.last is None and not fresh:
            # created after the last list: look again before calling it gone
            self._refresh()
            job, pod = self._jobs.get(h.name), self._pods.get(h.name)
        return pod_state(job, pod)

    def poll(self, h: K8sHandle, fresh: bool = False) -> Running | Exited:
        if h.result is not None:
            return h.result
        st = self.state(h, fresh)
        if st is None:
            return RUNNING
        h.last = st
        if not st.ended:
            if st.state == "running":
                self._copy_log(h)
            return RUNNING
        self._copy_log(h, final=True)
        h.result = to_exited(h, st)
        return h.result

    def _copy_log(self, h: K8sHandle, final: bool = False) -> None:
        now = time.monotonic()
        if not h.log_path or (
            not final and now - self._log_at.get(h.name, 0) < self.log_interval_s
        ):
            return
        self._log_at[h.name] = now
        pod = self._pods.get(h.name)
        if pod is None:
            return
        try:
            text = self.core.read_namespaced_pod_log(
                pod.metadata.name, h.namespace, container="task", _request_timeout=30
            )
        except Exception as exc:
            log.debug("log of %s: %s", h.name, _api_error(exc))
            return
        data = text.encode() if isinstance(text, str) else bytes(text or b"")
        if len(data) > h.log_offset:
            with open(h.log_path, "ab") as fh:
                fh.write(data[h.log_offset :])
            h.log_offset = len(data)

    async def stop(self, h: K8sHandle, grace_s: float) -> Exited:
        result = self.poll(h, fresh=True)
        if isinstance(result, Exited):
            return result
        grace = int(math.ceil(grace_s)) if grace_s > 0 else 0
        h.stopped_with = "SIGTERM" if grace else "SIGKILL"
        self._copy_log(h, final=True)
        body: Any
        try:
            from kubernetes.client import V1DeleteOptions

            body = V1DeleteOptions(grace_period_seconds=grace, propagation_policy="Foreground")
        except ImportError:  # pragma: no cover
            body = {"gracePeriodSeconds": grace, "propagationPolicy": "Foreground"}
        try:
            self.batch.delete_namespaced_job(
                h.name,
                h.namespace,
                grace_period_seconds=grace,
                propagation_policy="Foreground",
                body=body,
                _request_timeout=30,
            )
        except Exception as exc:
            if getattr(exc, "status", None) != 404:
                log.warning("deleting job %s/%s failed: %s", h.namespace, h.name, _api_error(exc))
        deadline = time.monotonic() + grace + 30
        while time.monotonic() < deadline:
            self._refresh()
            job, pod = self._jobs.get(h.name), self._pods.get(h.name)
            if pod is not None:
                st = pod_state(job, pod)
                h.last = st
                if st.ended:
                    break
            elif self._snap_ok:
                break
            await asyncio.sleep(0.5)
        last = (
            h.last
            if h.last is not None and h.last.ended
            else PodState(
                "failed",
                None,
                h.stopped_with,
                "Deleted",
                f"the job was deleted with a grace of {grace}s",
            )
        )
        h.result = to_exited(h, last)
        return h.result


def _created(obj) -> float:
    ts = obj.metadata.creation_timestamp
    return ts.timestamp() if hasattr(ts, "timestamp") else 0.0


def _api_error(exc: Exception) -> str:
    status, reason = getattr(exc, "status", None), getattr(exc, "reason", None)
    if status:
        return f"HTTP {status} {reason or ''}".strip()
    return str(exc) or type(exc).__name__
