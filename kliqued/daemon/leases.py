"""Workers and leases: which worker runs which placed task, under which fencing epoch.

The engine decides *which pool* a task runs on; the control plane then hands it to one worker
of that pool (a **lease**, docs/worker-protocol.md). Each lease of a task has the next epoch
(1, 2, ...). A lease is

- ``active``: the lease of the task's current placement (its worker may report
  started/finished/failed);
- ``stopping``: the task was preempted or cancelled while leased; its worker gets a stop
  instruction in every heartbeat until it reports the process gone (``stopped``);
- ``closed``: its worker reported its end (a retry of that report changes nothing);
- ``fenced``: taken away without the worker's word (the worker was lost, or the lease never
  reached it): any report or log upload for it is ``409 stale-epoch``.

A task is leased again only once no older lease of it is ``stopping``: two attempts of one
task never run at the same time (a preempted training job writes its checkpoint before the
next attempt reads it).

All of this is rebuilt by replay from the ``worker_registered``, ``leased``, ``started``,
``stopped``, ``unleased``, ``worker_lost``, ``preempted``, ``cancelled`` and ``ended``
events, through the same ``Daemon.on_*`` methods as the live path. Liveness (the last
heartbeat) is not logged: after a restart every known worker gets a full TTL to show up.
"""

from __future__ import annotations

from typing import Any

from klique_util.gpufit import choose_gpus, per_gpu

ACTIVE, STOPPING, CLOSED, FENCED = "active", "stopping", "closed", "fenced"

STOP_REASON = {"reclaimed": "preempted", "budget": "budget", "cancelled": "cancelled"}
"""Engine preemption kinds (and cancellation) to the protocol's stop reasons."""

LOST_TEXT = "worker lost"
RETURNED = "returned"
"""Preemption kind of a task its worker handed back on a clean shutdown (not a loss)."""
RETURNED_TEXT = "worker shut down"
LOST_FAIL_TEXT = "worker lost 3 times"
GANG_MEMBER_DONE = "gang-member-finished"
"""The ``stopped`` event's reason for a gang member that finished before the others: its
lease closes (outcome finished); the task ends when the last member finishes."""
MAX_LOSSES = 3


class Lease:
    __slots__ = (
        "task",
        "epoch",
        "worker",
        "pool",
        "size",
        "leased_at",
        "leased_mono",
        "started_at",
        "seen_running_at",
        "status",
        "stop_reason",
        "stop_text",
        "outcome",
        "rank",
        "world",
        "master_addr",
        "master_port",
        "nodes",
    )

    def __init__(
        self, task: str, epoch: int, worker: str, pool: str, size: int, at: int, mono: float
    ) -> None:
        self.task = task
        self.epoch = epoch
        self.worker = worker
        self.pool = pool
        self.size = size
        self.leased_at = at
        self.leased_mono = mono
        """Monotonic time it was leased (live only): a heartbeat that still does not list
        it well after this means the lease's answer never reached the worker."""
        self.started_at: int | None = None
        self.seen_running_at: int | None = None
        """The control plane's time of the last heartbeat that listed it ``running`` (live
        only, like ``last_seen``): it surely ran until then, so its end is charged no earlier
        (ends.py)."""
        self.status = ACTIVE
        self.stop_reason: str | None = None
        self.stop_text: str | None = None
        self.outcome: str | None = None
        """The report that closed it: finished, failed, stopped."""
        self.rank = 0
        self.world = 1
        """A gang member (issue 15): its rank among ``world`` leases of one attempt, leased
        together (consecutive epochs) to distinct workers; 1 for every other lease."""
        self.master_addr: str | None = None
        self.master_port: int | None = None
        """A gang's rendezvous: rank 0's worker host and the port it listens on."""
        self.nodes = 1
        """A gang leased whole to one worker whose executor spreads it (Slurm, Kubernetes)."""

    @property
    def key(self) -> tuple[str, int]:
        return (self.task, self.epoch)

    @property
    def base_epoch(self) -> int:
        """The first epoch of its attempt (a gang's rank 0; itself otherwise)."""
        return self.epoch - self.rank

    def __repr__(self) -> str:
        return f"Lease({self.task}#{self.epoch} on {self.worker}, {self.status})"


class WorkerInfo:
    __slots__ = (
        "id",
        "pool",
        "hostname",
        "executor",
        "gpus",
        "version",
        "registered_at",
        "last_seen",
        "lost_at",
        "leases",
        "key_hash",
        "cannot_work",
        "apps",
    )

    def __init__(self, id: str, pool: str) -> None:
        self.id = id
        self.pool = pool
        self.hostname: str | None = None
        self.executor: str | None = None
        self.gpus: list[dict[str, Any]] = []
        self.version: str | None = None
        self.registered_at: int | None = None
        self.last_seen = 0.0
        """Monotonic time of its last register, lease or heartbeat call."""
        self.lost_at: int | None = None
        self.leases: dict[tuple[str, int], Lease] = {}
        """Its active and stopping leases."""
        self.apps: list[str] | None = None
        """The session apps it said at registration it can start; None: it did not say (a
        worker older than the field), so it is sent any session."""
        self.cannot_work: str | None = None
        """Why the worker says it takes no work now (its last heartbeat's ``cannot_work``:
        its state dir is full), or None. Volatile like ``last_seen``: not an event; the
        next heartbeat says it again."""
        self.key_hash: str | None = None
        """Keyed hash of the key it registered with: every call of this worker, and every
        report for its leases, must carry that key (one pool token is shared by the pool's
        workers; the key tells them apart). None only for workers registered before keys."""

    @property
    def lost(self) -> bool:
        return self.lost_at is not None

    def json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "pool": self.pool,
            "hostname": self.hostname,
            "executor": self.executor,
            "gpus": len(self.gpus),
            "version": self.version,
            "lost": self.lost,
            "running": sorted(f"{t}#{e}" for (t, e) in self.leases),
        }


def gpu_fits(size: int, free: dict[int, int]) -> bool:
    """Whether a task of ``size`` milli-GPUs fits a worker with ``free`` room (milli-GPUs on
    each GPU), chosen as the worker places it (klique_util.gpufit); when it fits, its share
    is taken from ``free`` so the next task sees the room left."""
    chosen = choose_gpus(free, size)
    if chosen is None:
        return False
    per = per_gpu(size)
    for i in chosen:
        free[i] -= per
    return True
