"""One task as the engine sees it, and the three states it can be in.

Its own module because the queue, the victims order and the protection rule all read a
task while the state holds them all: with ``Task`` in ``state.py`` those modules and the
state imported each other (an import cycle, even through ``TYPE_CHECKING``). The state
re-exports it, so callers keep ``from kliqued.engine.state import Task``.
"""

from __future__ import annotations

QUEUED = 0
PLACED = 1
ENDED = 2


class Task:
    """One task as the engine sees it; the caller may read it, never write it."""

    __slots__ = (
        "id",
        "resource",
        "group",
        "user",
        "project",
        "requested",
        "size",
        "weight",
        "seq",
        "submitted_at",
        "status",
        "pool",
        "placed_at",
        "place_seq",
        "ran_before",
        "preemptions",
        "last_preempt_kind",
        "last_preempt_text",
        "end_kind",
        "ended_at",
        "orphan",
        "qtoken",
        "started",
        "start_token",
        "start_deadline",
        "start_timeout",
        "nodes",
        "alloc",
        "checkpoint_every",
        "checkpoint_at",
    )

    def __init__(
        self,
        id: str,
        resource: str,
        group: str,
        user: str,
        project: str | None,
        requested: int | None,
        size: int,
        weight: int,
        seq: int,
        at: int,
    ) -> None:
        self.id = id
        self.resource = resource
        self.group = group
        self.user = user
        self.project = project
        self.requested = requested
        self.size = size
        self.weight = weight
        self.seq = seq
        self.submitted_at = at
        self.status = QUEUED
        self.pool: str | None = None
        self.placed_at: int | None = None
        self.place_seq = 0
        self.ran_before = False
        self.preemptions = 0
        self.last_preempt_kind: str | None = None
        self.last_preempt_text: str | None = None
        self.end_kind: str | None = None
        self.ended_at: int | None = None
        self.orphan = False
        """Its compute resource was removed: it keeps its place to its end, never preempted."""
        self.qtoken = 0
        self.started = False
        """Placed, and a worker took it (the caller says so with ``set_started``)."""
        self.start_token = 0
        """Which entries of ``State.start_deadlines`` are the task's current ones."""
        self.start_deadline: int | None = None
        """Placed and not started: from when it may be requeued if its pool has no live
        worker (None: its pool has no start timeout)."""
        self.start_timeout = 0
        self.nodes = 1
        """A gang over this many machines (its compute resource's profile)."""
        self.alloc: tuple[tuple[int, int], ...] = ()
        """Placed on a pool that declares nodes: (machine index, milli-GPUs) of each part."""
        self.checkpoint_every = 0
        """Milliseconds between its checkpoints in a placement (a scenario's ``checkpoint:
        C``); 0: only those reported (lending.md "Least lost work first")."""
        self.checkpoint_at: int | None = None
        """Its last reported checkpoint in its current placement (``State.checkpoint``)."""

    @property
    def state(self) -> str:
        return ("queued", "placed", "ended")[self.status]

    def __repr__(self) -> str:
        return f"Task({self.id!r}, {self.resource!r}, {self.state}, size={self.size})"
