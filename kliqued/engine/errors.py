"""What the engine raises, and who catches it.

The engine is pure, so every exception here means the caller asked for something the engine
cannot do; none of them is a failure of the engine itself. Each also derives from the
built-in exception it was before this module existed (``ValueError``, ``KeyError``,
``RuntimeError``), so code that caught those keeps working.

- :class:`EngineError`: the base; catch it to handle any refusal of the engine.
- :class:`SubmissionError`: a task the estate does not allow (unknown compute resource, user
  not in the group, a size outside the profile). Its message is shown to users: the daemon
  answers it as a 4xx (``handlers/tasks.py``, ``core.py``), the simulator reports it with the
  line of the trace or scenario (``sim/trace.py``, ``sim/scenario.py``).
- :class:`DuplicateTask`: ``State.submit`` with a task id already used. The daemon makes ids
  itself; the simulator's loaders reject duplicates before submitting, so this is a bug.
- :class:`UnknownTask`: a change (end, ...) to a task id the state does not hold.
- :class:`TimeWentBackwards`: a time before the state's clock. Engine times never go
  backwards (engine.md); the daemon and the simulator guarantee it, so this is a bug.
- :class:`StaleResult`: a lazy question (waiting reasons, budgets) to a ``PassResult`` whose
  state has changed since: run a newer pass.
"""

from __future__ import annotations


class EngineError(Exception):
    """The engine refused a request of its caller."""


class SubmissionError(EngineError, ValueError):
    """A submission the estate does not allow (unknown resource, user not in group, ...).

    ``field`` names the submission's field at fault (``resource``, ``user``, ``project`` or
    ``gpus``) so that callers point at it (the daemon's 422 ``details``, a scenario's or a
    trace's line) without parsing the message."""

    FIELDS = ("resource", "user", "project", "gpus")

    def __init__(self, field: str, message: str) -> None:
        if field not in self.FIELDS:
            raise ValueError(f"SubmissionError: unknown field {field!r}")
        super().__init__(message)
        self.field = field


class DuplicateTask(EngineError, ValueError):
    """A task id already used in this state."""


class UnknownTask(EngineError, KeyError):
    """A task id the state does not hold."""


class TimeWentBackwards(EngineError, ValueError):
    """A time before the state's clock (or a meter's last settlement)."""


class StaleResult(EngineError, RuntimeError):
    """The state changed after the pass: ask a newer pass."""
