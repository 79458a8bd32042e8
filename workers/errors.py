"""What the worker raises, and who catches it.

Kept free of imports so that every part of a worker host (and the CLI's ``rollout``) can use
it without loading anything else.

- :class:`WorkerError`: the base of everything below.
- :class:`ConfigError`: the worker cannot start as configured (unknown executor or container
  runtime, ``--venv`` without ``bin/``, no Kubernetes package or credentials, an unreadable
  or empty token file). ``workers/cli.py`` prints the message and exits with 2. Also a
  ``ValueError``, as before.
- :class:`GpuDiscoveryError`: the GPUs cannot be found (``nvidia-smi`` failing, a bad
  ``--gpus``); ``workers/cli.py`` prints it and exits with 2.
- :class:`StateDirBusy`: another worker holds the state directory's lock; the same.
- :class:`SpawnsUnsettled`: a start of an earlier run of the worker still holds
  ``run/spawn.lock`` (workers/executors/spawnlock.py); the same.
- :class:`Unreachable`: no answer from the control plane (connection, TLS, timeout); the
  daemon's loops retry with backoff.
- :class:`ApiError`: the control plane answered with an error (status, code, message); the
  daemon's loops log it and act on the code. :class:`StaleEpoch`: the lease is no longer
  this worker's (fenced); the task's reports stop.
- :class:`StartError`: an executor cannot start a task at all (no command, not runnable by
  this executor); the daemon reports the task failed with this message.
- :class:`PlacementError`: a task taken back after a restart names GPUs this worker cannot
  give it (a changed ``--gpus``); the daemon logs a warning and keeps the task.
- :class:`CapacityUnavailable`: a cloud provider cannot give the capacity now (spot refused,
  no instances of the type); the autoscaler's loop tries again later or another way.
- :class:`ProviderError`: a cloud provider refused for another reason than capacity;
  the autoscaler's loop reports it and retries next round.
- :class:`RolloutError`: ``kliqued workers rollout`` cannot build or run its playbook; the
  command prints it and exits with an error.
"""

from __future__ import annotations


class WorkerError(Exception):
    """Something the worker cannot do, with the message to show."""


class ConfigError(WorkerError, ValueError):
    """The worker cannot start as configured."""


class GpuDiscoveryError(WorkerError):
    """The GPUs of this host cannot be found."""


class StateDirBusy(WorkerError):
    """Another worker holds the state directory."""


class SpawnsUnsettled(WorkerError):
    """A start of an earlier run of the worker may still be under way: the worker cannot
    tell which of its tasks started."""


class Unreachable(WorkerError):
    """No answer from the control plane."""


class ApiError(WorkerError):
    """The control plane answered with an error."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message = status, code, message


class StaleEpoch(ApiError):
    """The lease's epoch is no longer this worker's."""


class StartError(WorkerError):
    """The task cannot be started at all (no command, command not runnable by this executor);
    the daemon reports it as failed with this message."""


class PlacementError(WorkerError):
    """GPUs that cannot be given back to a task taken back after a restart."""


class CapacityUnavailable(WorkerError):
    """The provider cannot give this capacity now (spot refused, no instances of the type)."""


class ProviderError(WorkerError):
    """A cloud provider refused for a reason other than capacity (a bad image, missing
    permissions, an unreachable API): a configuration to fix; the autoscaler logs it and
    tries again next round."""


class RolloutError(WorkerError):
    """The rollout cannot build or run its playbook."""
