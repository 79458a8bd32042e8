"""lending.md "Least lost work first": the lost work of a placed task, and the order reclaim
and rebalance choose their victims in.

The **lost work** of a placed task at ``now`` is the placed time since its last checkpoint
in its current placement, else since it was placed. A task checkpoints when its worker says
so (``State.checkpoint``), or, when it declares a period ``C`` (the simulator's
``checkpoint: C``), at ``placed_at + C``, ``+ 2C``, ...; a checkpoint at the very moment of
a preemption counts (lost 0). With ``victims: newest`` (the default) victims go newest
placement first (engine.md); with ``least_lost_work``, least lost work first, ties to the
newest placement (the later ``place_seq``), then the task id.
"""

from __future__ import annotations

from typing import Iterable

from .task import Task


def lost_work(t: Task, now: int) -> int:
    """Milliseconds of ``t``'s work a preemption at ``now`` would lose (0 when not placed)."""
    placed = t.placed_at
    if placed is None or now <= placed:
        return 0
    since = placed
    at = t.checkpoint_at
    if at is not None and since < at <= now:
        since = at
    every = t.checkpoint_every
    if every > 0:
        last = placed + ((now - placed) // every) * every
        if last > since:
            since = last
    return now - since


def victim_key(t: Task, now: int, least_lost_work: bool) -> tuple[int, int, str]:
    """The victims order: (lost work or 0, newest placement first, task id)."""
    return (lost_work(t, now) if least_lost_work else 0, -t.place_seq, t.id)


def in_victim_order(tasks: Iterable[Task], now: int, least_lost_work: bool) -> list[Task]:
    """``tasks`` in the order victims are chosen (``newest``: newest placement first)."""
    return sorted(tasks, key=lambda t: victim_key(t, now, least_lost_work))
