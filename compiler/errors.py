"""What the compiler raises, and who catches it.

An estate that is wrong is not an exception: the compiler reports it as diagnostics
(``CompileResult.diagnostics``, with ``file:line:col``). Exceptions are kept for inputs that
never reach the rules, and each carries the message to show as it is.

- :class:`CompileError`: the base; catch it for any of the below.
- :class:`EstateReadError`: the estate path cannot be read (missing, not a directory,
  unreadable). Caught by ``compile_dir`` (a diagnostic), the daemon's GitOps directory
  source (keeps the last good estate) and the simulator (a scenario error).
- :class:`GitSourceError`: ``kliqued plan``'s repository or revision problem (not a git
  repository, unknown revision, the estate path missing in it). Caught by the ``plan``
  command (exit 2 with the message) and the daemon's GitOps branch source.
- :class:`LiveStateError`: ``kliqued plan --live`` got an answer that is not a plan state
  this version reads. Caught by the ``plan`` command. Also a ``ValueError``, as before.

Inside the pydantic models (``models.py``, ``units.py``) a bad value stays a ``ValueError``:
that is what pydantic turns into a validation error, and from there into a diagnostic.
"""

from __future__ import annotations


class CompileError(Exception):
    """An input the compiler cannot read at all (as opposed to a wrong estate)."""


class EstateReadError(CompileError):
    """The estate path itself cannot be read (missing, not a directory, unreadable)."""


class GitSourceError(CompileError):
    """A repository or revision problem, with the message to show."""


class LiveStateError(CompileError, ValueError):
    """The answer is not a plan state this version reads."""
