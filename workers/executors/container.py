"""The container executors: a task is one container, run by Docker or by Podman's
docker-compatible CLI.

    docker run --rm --name klique-<task>-<epoch> --label klique.task=<task> ... \\
        --gpus '"device=0,1"' [--memory M] -e KLIQUE_TASK_ID -e ... IMAGE CMD...

- The client (`docker run`/`podman run`, attached) runs under the worker's exit wrapper like
  a process task (workers/executors/process.py): its output is the task's log, its exit code
  is the container's (what `docker wait` returns) and is recorded in the state dir, so a
  worker restart loses nothing; the task is taken back by the client's pid.
- GPUs: real GPUs (found by nvidia-smi) go to Docker as `--gpus '"device=0,1"'` and to Podman
  as CDI devices (`--device nvidia.com/gpu=0`); declared (fake) GPUs only set
  CUDA_VISIBLE_DEVICES in the container.
- Fractions: `--memory` = the fraction x `memory_per_gpu_mb` (host memory: Docker cannot cap
  GPU memory) plus the memory-cap variables of workers/gpus.py for the GPU's memory.
- Variables go in as `-e NAME` (names only: values come from the client's environment, so
  that they never show in `ps`).
- The task's files (workers/checkpoints.py): its own directory is mounted writable at
  `/klique/task` (the checkpoint mark, the outputs), the notice's read-only at
  `/klique/notice`; `KLIQUE_CHECKPOINT_FILE`, `KLIQUE_OUTPUTS` and `KLIQUE_PREEMPT_FILE` name
  the paths inside. The worker sees the mark's time and writes the notice on its side of the
  mounts, as for a process; nothing else of the state directory is mounted.
- Stop: `docker stop -t GRACE NAME` (SIGTERM to the container's PID 1, SIGKILL after the
  grace); an exit code 128+N is reported as signal N.
- Orphans (the worker gone longer than the control plane waits, workers/liveness.py): the
  wrapper's SIGTERM reaches the container through the attached client (`--sig-proxy`, the
  default), and before the SIGKILL the wrapper runs `docker kill NAME`.
- Image: the lease's `image` (or `payload.image`), else the worker's `--image`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import re
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from klique_util.taskfiles import CHECKPOINT_ENV, PREEMPT_ENV
from klique_util.units import gpus_to_milli
from workers import outputs
from workers.checkpoints import notice_dir, task_dir
from workers.errors import ConfigError
from workers.executors.base import Exited, Running, Started, StartError, klique_env
from workers.executors.process import ProcessExecutor, ProcessHandle, _signal_name
from workers.gpus import MILLI, Gpu, memory_cap_env

log = logging.getLogger(__name__)

RUNTIMES = ("docker", "podman")
# exit codes 128+N the container runtimes use for "killed by signal N"
SIGNAL_EXITS = {128 + s: _signal_name(s) for s in (1, 2, 3, 6, 9, 11, 13, 14, 15)}
RUNTIME_ERRORS = {
    125: "the container runtime failed to run the container",
    126: "the container's command cannot be invoked",
    127: "the container's command was not found",
}


TASK_MOUNT = "/klique/task"  # the task's own directory, writable
NOTICE_MOUNT = "/klique/notice"  # the worker's notice, read-only


@dataclass(frozen=True)
class Mount:
    """A host directory in the container."""

    source: str
    target: str
    read_only: bool

    def args(self) -> list[str]:
        if ":" in self.source:
            raise StartError(f"cannot mount {self.source!r} in a container: a ':' in the path")
        return ["-v", f"{self.source}:{self.target}" + (":ro" if self.read_only else "")]


def task_file_mounts(env: Mapping[str, str], log_path: str) -> tuple[list[Mount], dict[str, str]]:
    """(the mounts, the variables' values inside) for the task's files that ``env`` names
    (the worker names them, workers/checkpoints.py): the task's directory writable, the
    notice's read-only. A variable naming a file elsewhere is left as it is (not mounted)."""
    mounts: list[Mount] = []
    inside: dict[str, str] = {}
    for target, host_dir, read_only, names in (
        (TASK_MOUNT, task_dir(log_path), False, (CHECKPOINT_ENV, outputs.ENV)),
        (NOTICE_MOUNT, notice_dir(log_path), True, (PREEMPT_ENV,)),
    ):
        ours = [n for n in names if n in env and os.path.dirname(env[n]) == host_dir]
        if ours:
            mounts.append(Mount(host_dir, target, read_only))
            inside.update({n: f"{target}/{os.path.basename(env[n])}" for n in ours})
    return mounts, inside


def container_name(task: str, epoch: int) -> str:
    return f"klique-{re.sub(r'[^A-Za-z0-9_.-]', '_', str(task))[:100]}-{int(epoch)}"


def task_image(lease: dict, default: str | None) -> str | None:
    payload = lease.get("payload")
    image = lease.get("image") or (payload.get("image") if isinstance(payload, dict) else None)
    return image or default


def task_variables(
    lease: dict, gpu_indices: list[int], gpus: list[Gpu], fake_gpus: bool
) -> dict[str, str]:
    """The variables a containerised task sees: the lease's env, then the KLIQUE_* ones (which
    it cannot override), CUDA_VISIBLE_DEVICES for declared GPUs, the fraction's memory cap."""
    env = klique_env(lease)
    if fake_gpus and gpu_indices:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in gpu_indices)
    env.update(memory_cap_env(gpus, gpu_indices, gpus_to_milli(lease.get("gpus"))))
    return env


def run_command(
    runtime: str,
    lease: dict,
    gpu_indices: list[int],
    *,
    image: str,
    variables: list[str],
    fake_gpus: bool,
    memory_per_gpu_mb: int | None,
    extra: list[str] | None = None,
    cli: str | None = None,
    mounts: list[Mount] | None = None,
) -> list[str]:
    """The `docker run` / `podman run` command line of a lease."""
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown container runtime {runtime!r}")
    task, epoch = str(lease["task"]), int(lease["epoch"])
    cmd = [
        cli or runtime,
        "run",
        "--rm",
        "--name",
        container_name(task, epoch),
        "--label",
        f"klique.task={task}",
        "--label",
        f"klique.epoch={epoch}",
    ]
    if gpu_indices and not fake_gpus:
        if runtime == "docker":
            cmd += ["--gpus", '"device=' + ",".join(str(i) for i in gpu_indices) + '"']
        else:
            for i in gpu_indices:
                cmd += ["--device", f"nvidia.com/gpu={i}"]
    milli = gpus_to_milli(lease.get("gpus"))
    if 0 < milli < MILLI and memory_per_gpu_mb:
        cmd += ["--memory", f"{max(6, memory_per_gpu_mb * milli // MILLI)}m"]
    for m in mounts or []:
        cmd += m.args()
    for name in variables:
        cmd += ["-e", name]
    cmd += list(extra or [])
    cmd.append(image)
    cmd += list(lease.get("command") or [])
    return cmd


def host_memory_mb() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    except (ValueError, OSError):  # pragma: no cover
        return None


@dataclass
class ContainerHandle(ProcessHandle):
    name: str = ""
    stopped: bool = False

    def to_record(self) -> dict[str, Any]:
        return {**super().to_record(), "name": self.name}


def _own(h: ProcessHandle) -> ContainerHandle:
    """A container executor's handles are all ``ContainerHandle``s (its ``start`` and
    ``adopt`` make them); the process executor's interface names the base class."""
    if not isinstance(h, ContainerHandle):
        raise TypeError(f"not a container's handle: {h!r}")
    return h


class ContainerExecutor(ProcessExecutor):
    """`--executor docker` or `--executor podman`."""

    def __init__(
        self,
        state_dir: str | Path,
        runtime: str = "docker",
        image: str | None = None,
        container_args: list[str] | None = None,
        cli: str | None = None,
        memory_per_gpu_mb: int | None = None,
        gpus: list[Gpu] | None = None,
        base_env: dict[str, str] | None = None,
        venv: str | Path | None = None,
        workdir: str | Path | None = None,
    ):
        if runtime not in RUNTIMES:
            raise ConfigError(f"unknown container runtime {runtime!r}: docker or podman")
        # the client runs in the worker's own environment (no --venv: that is the image's job)
        super().__init__(state_dir, venv=None, workdir=workdir, base_env=base_env, gpus=gpus)
        self.name = runtime
        self.runtime = runtime
        self.cli = cli or runtime
        self.image = image
        self.container_args = list(container_args or [])
        self.fake_gpus = bool(gpus) and all(g.uuid.startswith("declared-") for g in gpus or [])
        if memory_per_gpu_mb is None and gpus:
            host = host_memory_mb()
            memory_per_gpu_mb = host // len(gpus) if host else None
        self.memory_per_gpu_mb = memory_per_gpu_mb

    def command_for(
        self, lease: dict, gpu_indices: list[int], log_path: str | Path | None = None
    ) -> tuple[list[str], dict]:
        """(the run command line, the client's environment); with the task's log, its files
        mounted (``task_file_mounts``)."""
        image = task_image(lease, self.image)
        if not image:
            raise StartError(
                f"no image for this task: the lease names none and the worker "
                f"has no --image ({self.runtime} executor)"
            )
        if not lease.get("command") and lease.get("command") is not None:
            raise StartError("the task's command is empty")
        command = lease.get("command") or []
        if not isinstance(command, list) or not all(isinstance(a, str) for a in command):
            raise StartError(f"the task's command must be a list of strings, not {command!r}")
        variables = task_variables(lease, gpu_indices, self.gpus, self.fake_gpus)
        mounts: list[Mount] = []
        if log_path is not None:
            mounts, inside = task_file_mounts(variables, str(log_path))
            variables.update(inside)
        cmd = run_command(
            self.runtime,
            lease,
            gpu_indices,
            image=image,
            variables=sorted(variables),
            fake_gpus=self.fake_gpus,
            memory_per_gpu_mb=self.memory_per_gpu_mb,
            extra=self.container_args,
            cli=self.cli,
            mounts=mounts,
        )
        env = dict(self.base_env)
        env.update(variables)
        return cmd, env

    def start(
        self, lease: dict, gpu_indices: list[int], log_path: Path, mark: dict | None = None
    ) -> ContainerHandle:
        cmd, env = self.command_for(lease, gpu_indices, log_path)
        for d in (task_dir(str(log_path)), notice_dir(str(log_path))):
            os.makedirs(d, mode=0o700, exist_ok=True)  # a mount's source must exist
        name = container_name(str(lease["task"]), int(lease["epoch"]))
        self._client_env = env
        try:
            h = super().start({**lease, "command": cmd}, gpu_indices, log_path, mark)
        finally:
            self._client_env = None
        return ContainerHandle(
            pid=h.pid,
            pgid=h.pgid,
            start_ticks=h.start_ticks,
            exit_path=h.exit_path,
            popen=h.popen,
            seen_alive=True,
            name=name,
            forked=h.forked,
        )

    _client_env: dict | None = None

    def orphan_kill(self, lease: dict) -> list[str] | None:
        """The container is not in the wrapper's process group (the daemon runs it): an
        orphan's wrapper kills it by name (``--rm`` then removes it)."""
        return [self.cli, "kill", container_name(str(lease["task"]), int(lease["epoch"]))]

    def environment(self, lease: dict, gpu_indices: list[int]) -> dict[str, str]:
        if self._client_env is not None:
            return self._client_env
        return super().environment(lease, gpu_indices)

    def started(self, key: str) -> Started | None:
        """As the process executor's, with the container's name (from the task's record
        in the marker)."""
        found = super().started(key)
        if found is None or found.mark is None:
            return found
        name = container_name(str(found.mark.get("task")), int(found.mark.get("epoch") or 0))
        return Started({**found.handle, "name": name}, found.started_at, found.mark)

    def adopt(self, record: dict[str, Any]) -> ContainerHandle:
        h = super().adopt(record)
        return ContainerHandle(
            pid=h.pid,
            pgid=h.pgid,
            start_ticks=h.start_ticks,
            exit_path=h.exit_path,
            name=str(record.get("name") or ""),
        )

    def poll(self, h: ProcessHandle) -> Running | Exited:
        result = super().poll(h)
        if isinstance(result, Exited):
            return self._translate(_own(h), result)
        return result

    def _translate(self, h: ContainerHandle, r: Exited) -> Exited:
        code = r.exit_code
        if (r.message or "").startswith("worker-lost"):
            # stopped as an orphan (workers/liveness.py): the message says so, whatever the
            # exit code, so that the task is requeued rather than failed
            return (
                Exited(None, SIGNAL_EXITS[code], r.message)
                if code in SIGNAL_EXITS and r.signal is None
                else r
            )
        if code in SIGNAL_EXITS and r.signal is None:
            hint = ""
            if code == 137 and not h.stopped:
                hint = " (out of memory, if it had a --memory cap, or docker kill)"
            return Exited(
                None,
                SIGNAL_EXITS[code],
                f"container {h.name} exited with {code}: {SIGNAL_EXITS[code]}{hint}",
            )
        if code in RUNTIME_ERRORS:
            return Exited(
                code,
                None,
                r.message or f"{RUNTIME_ERRORS[code]} ({self.runtime} exit {code}; see the log)",
            )
        return r

    def _cli(self, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess | None:
        try:
            return subprocess.run(
                [self.cli, *args],
                capture_output=True,
                text=True,
                timeout=timeout,
                env=self.base_env,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("%s %s failed: %s", self.cli, " ".join(args), exc)
            return None

    async def stop(self, handle: ProcessHandle, grace_s: float) -> Exited:
        h = _own(handle)
        if not self._alive(h):
            return self._ended(h)
        h.stopped = True
        grace = math.ceil(grace_s) if grace_s > 0 else 0  # whole seconds for -t
        if h.name:
            # SIGTERM to the container, SIGKILL after `grace` seconds; returns when it is gone
            p = await asyncio.to_thread(
                self._cli, "stop", "-t", str(grace), h.name, timeout=grace + 30.0
            )
            if p is not None and p.returncode != 0:
                log.debug("%s stop %s: %s", self.cli, h.name, p.stderr.strip())
        # the client exits with the container; give it a moment, then end it too
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self._alive(h):
            await asyncio.sleep(0.05)
        if self._alive(h):
            if h.name:
                await asyncio.to_thread(self._cli, "kill", h.name)
            h.killed_by = "SIGKILL"
            self._signal_group(h, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and self._alive(h):
                await asyncio.sleep(0.05)
        return self._ended(h)
