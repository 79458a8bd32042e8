"""What the API shows about a task beyond the engine's ``Task``.

The engine keeps what its rules need (size, weight, queue order) and may forget ended tasks;
the daemon keeps, per task, what people ask about: the command or payload, labels, who sent
it, under which revision, when it was placed and ended, its last preemption. Records are
updated by the same code on the live path and during replay (``core.DaemonState.on_*``).
"""

from __future__ import annotations

from typing import Any


class TaskRecord:
    __slots__ = (
        "id",
        "resource",
        "policy",
        "profile",
        "group",
        "user",
        "actor",
        "project",
        "labels",
        "command",
        "payload",
        "gpus_milli",
        "submitted_at",
        "revision",
        "idempotency_key",
        "state",
        "pool",
        "placed_at",
        "ended_at",
        "end_reason",
        "preemptions",
        "last_preemption",
        "intervals",
        "submitted_pass",
        "leases",
        "worker",
        "started_at",
        "exit_code",
        "signal",
        "lost",
        "gpu_ms",
        "size",
        "data_bytes",
        "end_note",
        "ended_by",
        "end_message",
        "unleased_at",
        "outputs",
        "channel",
        "lost_units",
        "checkpoint_at",
    )

    def __init__(
        self,
        id: str,
        resource: str,
        policy: str,
        profile: str,
        group: str,
        user: str,
        actor: str,
        project: str | None,
        labels: dict[str, str],
        command: list[str] | None,
        payload: Any,
        gpus_milli: int | None,
        submitted_at: int,
        revision: str,
        idempotency_key: str | None,
        channel: str = "api",
    ) -> None:
        self.id = id
        self.resource = resource
        self.policy = policy
        self.profile = profile
        self.group = group
        self.user = user
        self.actor = actor
        self.project = project
        self.labels = labels
        self.command = command
        self.payload = payload
        self.gpus_milli = gpus_milli
        self.submitted_at = submitted_at
        self.revision = revision
        self.idempotency_key = idempotency_key
        self.channel = channel
        """How it was sent (channels.py): ``cli``, ``sdk``, ``api``, ``mcp``, ``schedule``,
        ``pipeline`` or ``session``; recorded beside its user in the ledger."""
        self.state = "queued"
        self.pool: str | None = None
        self.placed_at: int | None = None
        self.checkpoint_at: int | None = None
        """Its last checkpoint its worker relayed in its current placement (``task_checkpointed``);
        a preemption's lost work counts from it."""
        self.ended_at: int | None = None
        self.end_reason: str | None = None
        self.preemptions = 0
        self.last_preemption: tuple[str, str, int] | None = None
        self.intervals = 0
        """How many times it was placed: the ledger's interval id is ``<id>#<intervals>``."""
        self.submitted_pass = 0
        """How many passes had run when it was submitted: until another runs, its reason is
        "waits for the next pass", without asking the engine."""
        self.leases: list[Any] | None = None
        """Its leases to workers, oldest first: ``leases[e - 1]`` has epoch ``e``."""
        self.worker: str | None = None
        """The worker of its latest lease."""
        self.started_at: int | None = None
        """When its latest lease's process started (the worker's report)."""
        self.exit_code: int | None = None
        self.signal: str | None = None
        self.lost = 0
        """How many times a worker running it was lost (the third time it fails)."""
        self.unleased_at: int | None = None
        """When a lease of its current placement was withdrawn (it waits for a worker again
        since then)."""
        self.outputs: dict[str, str] | None = None
        """What a finished task wrote to $KLIQUE_OUTPUTS (KEY=VALUE lines): a pipeline's
        later steps read it."""
        self.gpu_ms = 0
        """Milli-GPU x ms of its closed placement intervals (the open one is added live)."""
        self.lost_units = 0
        """Milli-GPU x ms of work its preemptions lost so far (lending.md's lost work x its
        size at each one): the status's ``lost_gpu_hours_so_far``."""
        self.size: int | None = None
        """Its size in milli-GPUs at its latest placement."""
        self.data_bytes = 0
        """Its command and payload's bytes (limits.task_bytes): counted against its user's
        stored bytes until it ends, and against a listing page's size."""
        self.end_note: str | None = None
        """Why it ended, beyond its kind: a cancellation's ``cancelled by user:x: reason`` or
        the estate's text, ``worker lost 3 times``, an idle stop."""
        self.ended_by: str | None = None
        """Who cancelled it: a principal, or ``estate`` (its compute resource was removed)."""
        self.end_message: str | None = None
        """The message of the worker's report that ended it (an executor's error)."""

    @property
    def interval_id(self) -> str:
        return f"{self.id}#{self.intervals}"

    @property
    def epoch(self) -> int:
        """The latest lease's fencing epoch (0: never leased)."""
        return len(self.leases) if self.leases else 0

    def lease(self, epoch: int) -> Any:
        if self.leases and 1 <= epoch <= len(self.leases):
            return self.leases[epoch - 1]
        return None

    @property
    def current_lease(self) -> Any:
        return self.leases[-1] if self.leases else None

    def attempt(self) -> list[Any]:
        """The leases of its latest attempt: one, or a gang's members (rank order)."""
        if not self.leases:
            return []
        return list(self.leases[self.leases[-1].base_epoch - 1 :])


# ---------------------------------------------------------------------- how it reads
# (here, not in api/views.py, since the state room's pipelines and schedules read them too)
def state(rec: TaskRecord) -> str:
    """``running`` is a sub-state of ``placed``: placed, and its worker reported it
    started."""
    if rec.state == "placed" and rec.started_at is not None:
        return "running"
    return rec.state


def end_text(rec: TaskRecord) -> str:
    """Why it ended, as its owner reads it: ``failed: exit code 3: CUDA out of memory``,
    ``failed: killed by SIGKILL``, ``cancelled by user:erin: wrong data set``, ``cancelled:
    compute resource a/b was removed from the estate``, ``failed: worker lost 3 times``."""
    reason = rec.end_reason or "ended"
    if reason == "cancelled":
        note = rec.end_note or reason
        return note if note.startswith("cancelled") else f"cancelled: {note}"
    if rec.end_note and reason == rec.end_note and not reason.startswith("stopped"):
        reason = f"failed: {reason}"  # worker lost 3 times
    parts = [reason]
    if rec.signal:
        parts.append(f"killed by {rec.signal}")
    elif rec.exit_code is not None and (rec.exit_code != 0 or reason != "finished"):
        parts.append(f"exit code {rec.exit_code}")
    if rec.end_message:
        parts.append(rec.end_message)
    return ": ".join(parts)
