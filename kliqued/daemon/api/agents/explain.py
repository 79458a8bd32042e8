"""A task's reason in plain words: what it means and what the user can do about it.

The engine words each reason exactly (``engine/reasons.py``: "group at limit (10/10 GPUs)");
an agent explaining it to a person also needs what the kind means and the ways out. Those are
fixed per kind, so they live here as text, not as rules: nothing here decides anything.
"""

from __future__ import annotations

from typing import Any

from klique_util.excerpt import excerpt

MEANING: dict[str, tuple[str, str]] = {
    "order": (
        "The task waits its turn: its compute resource's queue is strict (first in, first "
        "out), and the tasks ahead of it must start first.",
        "Nothing to fix: it starts after the tasks ahead of it. Cancelling it and sending it "
        "again puts it at the back of the line.",
    ),
    "user_limit": (
        "The user already holds as many GPUs in this group as the group's per-user limit "
        "allows (the number after the slash), counting this task's size: the limit keeps "
        "one person from taking the whole group.",
        "It starts when some of the user's own running tasks end; cancelling one of them "
        "makes room. The group's admins set the per-user limit.",
    ),
    "limit": (
        "The task's group already uses as many GPUs as its policy's limit allows (the "
        "number after the slash), counting this task's size.",
        "It starts when the group's running work ends or is preempted. A smaller task (fewer "
        "GPUs) may fit sooner; the group's admins can ask IT for a higher limit.",
    ),
    "budget": (
        "The group's GPU-hour budget for this period is used up, or would be before this "
        "task could run at the group's current burn rate (the budget start check).",
        "It starts when the budget resets (the time given) or when the group's running work "
        "ends and the burn rate drops; the group's admins can ask for a larger budget.",
    ),
    "capacity": (
        "The task's group has room under its limit and budget, but the pools that serve the "
        "compute resource have no free GPUs of the size it needs right now (or no live "
        "worker to run it).",
        "It starts as soon as GPUs free up or a worker comes back; nothing is wrong with the "
        "task. A compute resource on other pools may have room: list the resources.",
    ),
    "pending": (
        "The engine has not decided about the task yet: it was just submitted and waits for "
        "the next pass (every few seconds), or the engine is switched off by IT.",
        "Wait a few seconds and look again; if the engine is disabled, IT must enable it.",
    ),
    "worker": (
        "The task has its GPUs (it is placed on a pool), but no worker of that pool has "
        "started it yet.",
        "It starts when a worker of the pool takes it; if none comes before the pool's start "
        "timeout, it goes back to the queue with its place. IT looks after the workers.",
    ),
}
"""Each reason kind (engine.md "Reasons", and ``worker`` for a placed task not yet started):
what it means, and what the user can do."""

ENDED = (
    "The task has ended; it holds no GPUs and waits for nothing.",
    "Read its log to see what it did; send it again to run it again.",
)
RUNNING = (
    "The task is placed on a pool and its worker started it: it is running.",
    "Read its log to follow it; cancel it to stop it.",
)


def explain(task: dict[str, Any]) -> dict[str, Any]:
    """``task`` (its API view) with its reason explained: ``state``, ``reason`` (the
    engine's words), ``kind``, ``meaning`` and ``what_you_can_do``."""
    r = task.get("waiting_reason")
    out: dict[str, Any] = {
        "task": task["id"],
        "state": task["state"],
        "resource": task["resource"],
        "pool": task["pool"],
    }
    if r is not None and r.get("kind") in MEANING:
        meaning, todo = MEANING[r["kind"]]
        out.update(kind=r["kind"], reason=r["text"], position=task.get("position"))
    elif task["state"] == "ended":
        meaning, todo = ENDED
        end = task.get("end") or {}
        out.update(kind="ended", reason=end.get("text") or task.get("end_reason"))
    else:
        meaning, todo = RUNNING
        out.update(kind="running", reason=None)
    out.update(meaning=meaning, what_you_can_do=todo)
    return out


def explain_kind(kind: str) -> dict[str, Any]:
    """A reason kind alone explained (an agent holding a reason, not a task); a kind that
    does not exist is a ``ValueError`` naming the kinds that do."""
    if kind not in MEANING:
        raise ValueError(f"no reason kind {excerpt(kind)}; the kinds are {', '.join(MEANING)}")
    meaning, todo = MEANING[kind]
    return {"kind": kind, "meaning": meaning, "what_you_can_do": todo}
