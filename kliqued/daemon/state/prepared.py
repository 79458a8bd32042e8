"""A request's change, prepared before its commit and applied after it (``Prepared``), and what
earlier requests of the same batch will change (``Overlay``): the sequencer's unit of work
(loop.py), made by every room's ``prepare_*`` functions.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from kliqued.daemon.events import Event
from kliqued.daemon.storage.store import DbOp


@dataclass
class Prepared:
    """A request's change, validated, waiting for its commit."""

    events: list[Event] = field(default_factory=list)
    ops: list[DbOp] = field(default_factory=list)
    apply: Callable[[], Any] = lambda: None
    """Runs after the commit; its return value answers the request."""
    wants_pass: bool = False
    closes: list[tuple[str, int, str]] = field(default_factory=list)
    """Ledger intervals to close (id, end ms, reason): a batch's closes are one write."""
    frees: bool = False
    """It frees capacity (a worker's report ended or requeued a task): the pass that fills
    it runs almost at once (loop.REPORT_SETTLE_S) rather than after a burst's delay."""


def merged(parts: list[Prepared]) -> Prepared:
    """Several changes as one: their events and writes in order, one commit, applied in
    the same order (a schedule's run and the task it sends; a pipeline's step and its
    task): after a crash all of them are in the log, or none."""
    out = Prepared()
    applies = []
    for p in parts:
        out.events.extend(p.events)
        out.ops.extend(p.ops)
        out.closes.extend(p.closes)
        out.wants_pass = out.wants_pass or p.wants_pass
        out.frees = out.frees or p.frees
        applies.append(p.apply)

    def apply() -> Any:
        result = None
        for a in applies:
            result = a()
        return result

    out.apply = apply
    return out


@dataclass
class Overlay:
    """What earlier requests of the same batch will change once applied: later ones are
    prepared against it (a retried key, a task cancelled twice, ...)."""

    keys: dict[tuple[str, str], str] = field(default_factory=dict)
    ended: set[str] = field(default_factory=set)
    enabled: bool | None = None
    revoked: set[str] = field(default_factory=set)
    leased: set[str] = field(default_factory=set)
    """Tasks leased by an earlier request of the batch."""
    leases: dict[tuple[str, int], str] = field(default_factory=dict)
    """Lease statuses an earlier request of the batch changes."""
    requeued: set[str] = field(default_factory=set)
    """Placed tasks an earlier request of the batch puts back in their queue (lost)."""
    lost: set[str] = field(default_factory=set)
    """Workers an earlier request of the batch declares lost."""
    stored: Counter[str] = field(default_factory=Counter)
    """Task data bytes earlier submissions of the batch add, per user."""
    made: Counter[tuple[str, str]] = field(default_factory=Counter)
    """Schedules and running pipelines earlier requests of the batch make, per (kind,
    owner)."""
