"""Calls a task makes about itself, inside its own command: ``checkpoint()`` and
``preempt_notice()`` (docs/lending.md, "Checkpoints and the preemption notice").

They need no URL, token or network: the worker that runs the task names two files in its
environment (klique_util/taskfiles.py) and relays what happens to them, fenced by the
task's lease, so a task can only speak for itself.

    from kliqued.sdk import checkpoint, preempt_notice
    save(model, "ckpt.pt")
    checkpoint()          # a preemption from now on loses only the work after this line
"""

from __future__ import annotations

from datetime import datetime, timezone

from klique_util.taskfiles import Notice, NotInTask, checkpoint as _touch, read_notice

from .errors import KliqueError


def checkpoint() -> datetime:
    """Says "my work up to now is saved": call it right after your checkpoint is written
    (and flushed). Returns the time marked. Raises ``KliqueError`` (code ``not-in-task``)
    outside a Klique task, or when the worker's file cannot be written."""
    try:
        at = _touch()
    except NotInTask as exc:
        raise KliqueError(None, "not-in-task", str(exc)) from None
    except OSError as exc:
        raise KliqueError(
            None,
            "checkpoint-failed",
            f"cannot mark the checkpoint in {exc.filename}: {exc.strerror}",
        ) from None
    return datetime.fromtimestamp(at, timezone.utc)


def preempt_notice() -> Notice | None:
    """The stop the worker announced before its SIGTERM (reason, text, grace, deadline),
    or None: read it in a SIGTERM handler to tell a preemption from other ends."""
    return read_notice()


__all__ = ["Notice", "checkpoint", "preempt_notice"]
