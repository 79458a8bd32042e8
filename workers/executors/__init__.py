"""Executors: how a worker runs a leased task (docs/executors.md).

process      a child process group on the worker's machine (workers/executors/process.py)
slurm        an sbatch job on the pool's partition (slurm.py)
pbs          a qsub job (PBS Professional / OpenPBS; pbs.py, batch.py)
lsf          a bsub job (IBM Spectrum LSF; lsf.py, batch.py)
docker       a container through the docker CLI (container.py)
podman       the same through Podman's docker-compatible CLI (container.py)
kubernetes   a batch/v1 Job through the official Python client (kubernetes.py)
"""

from __future__ import annotations

import inspect

from workers.errors import ConfigError
from workers.executors.base import RUNNING, Executor, Exited, Running, StartError

__all__ = ["EXECUTORS", "RUNNING", "Executor", "Exited", "Running", "StartError", "make_executor"]

EXECUTORS = ("process", "slurm", "pbs", "lsf", "docker", "podman", "kubernetes")


def _executor_class(name: str) -> type[Executor]:
    if name == "process":
        from workers.executors.process import ProcessExecutor

        return ProcessExecutor
    if name == "slurm":
        from workers.executors.slurm import SlurmExecutor

        return SlurmExecutor
    if name == "pbs":
        from workers.executors.pbs import PbsExecutor

        return PbsExecutor
    if name == "lsf":
        from workers.executors.lsf import LsfExecutor

        return LsfExecutor
    if name in ("docker", "podman"):
        from workers.executors.container import ContainerExecutor

        return ContainerExecutor
    if name == "kubernetes":
        from workers.executors.kubernetes import KubernetesExecutor

        return KubernetesExecutor
    raise ConfigError(f"unknown executor {name!r}: the choices are: {', '.join(EXECUTORS)}")


def make_executor(name: str, **kwargs) -> Executor:
    """The executor `name`, given the options it understands among `kwargs` (the worker
    passes every executor's options; each takes its own)."""
    cls = _executor_class(name)
    if name in ("docker", "podman"):
        kwargs["runtime"] = name
    params = inspect.signature(cls.__init__).parameters
    return cls(**{k: v for k, v in kwargs.items() if k in params and v is not None})
