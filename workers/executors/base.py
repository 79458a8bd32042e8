"""The Executor interface: what the worker daemon needs from whatever runs a task.

The daemon owns placement (which GPUs), the per-task records, the reports and the log
upload; an executor only starts, watches, stops and takes back processes (or jobs, or
containers). A handle is executor-specific; ``handle.to_record()`` is the JSON the daemon
persists for it, and ``adopt(record)`` rebuilds a handle from that JSON after the worker's
own restart.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from klique_util.poolsettings import PoolSettings
from workers.errors import StartError as StartError  # re-exported: executors import it here


class Running:
    """The task is still running."""

    def __repr__(self) -> str:
        return "RUNNING"


RUNNING = Running()


@dataclass(frozen=True)
class Exited:
    """The task is gone. `exit_code` for a normal exit, `signal` (a name such as "SIGKILL")
    when a signal ended it; both None when its end could not be known (then `message`
    says why). `ended_at` (RFC 3339): when it ended, if the executor recorded it (the
    process wrapper does); a task that ended while the worker was down is then reported
    with its true end, not the time the restarted worker noticed (None: noticed now)."""

    exit_code: int | None
    signal: str | None = None
    message: str | None = None
    ended_at: str | None = field(default=None, compare=False)
    """Not part of the outcome's equality: the same exit, whenever it was read."""
    recorded: bool = field(default=False, compare=False)
    """Read from a record on disk that outlives the worker (the wrapper's exit file): a
    restarted worker reads the same exit there again, so the worker need not record it."""

    def to_json(self) -> dict:
        return {"exit_code": self.exit_code, "signal": self.signal, "message": self.message}


@dataclass(frozen=True)
class Start:
    """One item of ``Executor.start_many``: what ``start`` takes, and ``mark``: what the
    worker wants back from ``started`` if it is killed before it records this start (the
    task's record, JSON)."""

    lease: dict
    gpu_indices: list[int]
    log_path: Path
    mark: dict | None = None


@dataclass(frozen=True)
class Started:
    """A start that an earlier run of the worker made and may not have recorded
    (``Executor.started``): the handle's record (for ``adopt``), when it started, and the
    ``mark`` handed with it."""

    handle: dict[str, Any]
    started_at: str | None
    mark: dict | None


class Handle(ABC):
    @abstractmethod
    def to_record(self) -> dict[str, Any]:
        """JSON-able data from which ``Executor.adopt`` rebuilds the handle."""


H = TypeVar("H", bound=Handle)


class Executor(ABC, Generic[H]):
    """Generic in its handle type: an executor is only ever given back the handles it made
    (the daemon holds them as ``Handle``, so it sees ``Executor[Any]``)."""

    name: str

    def warn_once(self, key: str, text: str) -> None:
        """Logs ``text`` the first time ``key`` comes up in this executor (a pool setting it
        does not read, a flag the pool's settings override): once, not with every lease."""
        warned: set[str] = self.__dict__.setdefault("_warned_once", set())
        if key not in warned:
            warned.add(key)
            logging.getLogger(type(self).__module__).warning("%s", text)

    def setting(self, lease: dict, key: str, flag: str, flag_value: str | None) -> str | None:
        """The value of ``key`` for this lease: the pool's setting, else the worker's flag.
        The estate wins (it is what IT reviews, and what the ledger's account is); a flag
        that says otherwise is named in one warning (docs/decisions.md)."""
        pool_value = PoolSettings.from_lease(lease).get(key)
        if pool_value is not None and flag_value and flag_value != pool_value:
            self.warn_once(
                f"flag:{key}",
                f"{flag} {flag_value} is overridden by the pool's "
                f"settings.{key}: {pool_value} (the estate wins; drop the flag)",
            )
        return pool_value or flag_value or None

    def task_path(self) -> str | None:
        """The PATH this executor's tasks run with on this host, where a session's app is
        looked for (``klique_util.session_apps.detect``); None when this host cannot tell (an
        image's or another node's programs): the worker then advertises no apps unless
        ``--session-apps`` names them."""
        return None

    @abstractmethod
    def start(self, lease: dict, gpu_indices: list[int], log_path: Path) -> H:
        """Starts the lease's command on the given GPUs, its output appended to `log_path`.
        Raises StartError if it cannot."""

    def start_many(self, starts: list[Start]) -> list[H | StartError]:
        """Starts several leases at once (the worker's batch: the GPUs a round of reports
        freed); each item's handle, or the ``StartError`` it could not start with, in order.
        One ``start`` after the other here; the process executor forks them all before it
        waits for any (process.py)."""
        out: list[H | StartError] = []
        for s in starts:
            try:
                out.append(self.start(s.lease, s.gpu_indices, s.log_path))
            except StartError as exc:
                out.append(exc)
        return out

    def settle(self) -> None:
        """Waits until no start made by an earlier run of the worker is still under way
        (called once at the worker's start, before it reads its records). Nothing to wait
        for here."""

    def started(self, key: str) -> Started | None:
        """What this executor knows of a start of the record ``key`` (``<task>.e<epoch>``)
        made by an earlier run of the worker, which that run may have been killed before
        recording: the worker then takes it back instead of starting the task twice. None
        here: only the process executor's wrappers leave a mark (workers/executors/
        wrapper.py); a batch job started in that window runs twice (docs/workers.md)."""
        return None

    def leftovers(self, key: str) -> list[Path]:
        """Files of the record ``key`` the worker removes once it forgot the task."""
        return []

    def started_keys(self) -> list[str]:
        """The keys whose start left a mark that a live start may still hold (``started``
        then says more)."""
        return []

    @abstractmethod
    def poll(self, handle: H) -> Running | Exited:
        """RUNNING, or how the task ended. Never blocks."""

    @abstractmethod
    async def stop(self, handle: H, grace_s: float) -> Exited:
        """Asks the task to end (SIGTERM or the equivalent), waits up to `grace_s` seconds for
        it, then ends it by force; returns how it ended. `grace_s=0` kills at once
        (fencing)."""

    @abstractmethod
    def adopt(self, record: dict[str, Any]) -> H:
        """Takes back a task started by an earlier run of the worker, from
        ``handle.to_record()``; poll() then says whether it still runs."""


def klique_env(lease: dict) -> dict[str, str]:
    """The variables every executor gives a task: the lease's own ``env``, then the
    ``KLIQUE_*`` ones, which a lease cannot override (the task must be able to trust them)."""
    env = {str(k): str(v) for k, v in (lease.get("env") or {}).items()}
    env.update(
        {
            "KLIQUE_TASK_ID": str(lease["task"]),
            "KLIQUE_EPOCH": str(lease["epoch"]),
            "KLIQUE_GPUS": str(lease.get("gpus", "")),
            "KLIQUE_USER": str(lease.get("user") or ""),
            "KLIQUE_PROJECT": str(lease.get("project") or ""),
            "KLIQUE_RESOURCE": str(lease.get("resource") or ""),
        }
    )
    return env
