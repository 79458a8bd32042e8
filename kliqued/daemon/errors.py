"""The daemon's exceptions, and who catches them.

- :class:`DaemonError`: the base of everything below.
- :class:`ApiError` (and :class:`Unavailable`, 503; :class:`StoreAway`, 503 or 507 with
  ``Retry-After`` while the store is away): the one error type handlers raise; the
  error middleware (``app.py``) renders it as the contract's JSON
  ``{"error": {"code", "message", "details"?}}`` with its status. Never a 5xx for bad input.
- :class:`BadOption`: a ``kliqued serve`` option that cannot be used (``--listen``);
  ``server.serve`` prints it and exits with an error. Also a ``ValueError``, as before.
- :class:`DatabaseLocked`: another process holds the DuckDB file; ``server.serve`` says so
  and exits.
- :class:`UnknownKind`: an event of a kind ``events.KINDS`` does not register; replay
  raises it as the cause of a :class:`ReplayError`.
- :class:`ReplayError`: the event log does not replay (a bug or a damaged file), naming the
  event; ``server.serve`` says so and exits without serving a state it could not rebuild.
- :class:`Busy`, :class:`Expired`: the ledger query pool is full, or a query's deadline
  passed while it waited; ``handlers/ledger.py`` answers 503 and 408-like ``timeout``.

The engine's refusals (``kliqued.engine.errors``) reach handlers as engine exceptions and are
turned into ``ApiError`` there (a ``SubmissionError`` is a 4xx with its message).
"""

from __future__ import annotations

from typing import Any

from klique_util.excerpt import clip


class DaemonError(Exception):
    """Something the daemon refuses or cannot do, with the message to show."""


class BadOption(DaemonError, ValueError):
    """A ``kliqued serve`` option that cannot be used."""


class DatabaseLocked(DaemonError):
    """Another process has the file open (normally another ``kliqued serve``)."""


class StoreMismatch(DaemonError):
    """The local DuckDB file and the PostgreSQL log are not one deployment's (start)."""


class CopyBehind(DaemonError):
    """A batch is durable in PostgreSQL but its local commit (ledger, events' copy) failed:
    fatal, so that the restart's catch-up runs rather than the batch being retried."""


class Deposed(DaemonError):
    """This daemon's lease epoch is no longer the leader's (kliqued/daemon/ha/lease.py): another
    daemon leads. Nothing of the batch was written; the daemon stops leading and stands by."""


class ReplayError(DaemonError):
    """The log does not replay (a bug or a damaged file): say which event."""


class UnknownKind(DaemonError, ValueError):
    """An event kind no payload class is registered for (``events.KINDS``): replay wraps it
    in a :class:`ReplayError` naming the event."""


class Busy(DaemonError):
    """Too many ledger queries are running and waiting; try again shortly."""


class Expired(DaemonError):
    """The query's deadline passed while it was waiting for a thread; it never ran."""


class ApiError(DaemonError):
    """An answer to a request that is not a success: status, contract code, message."""

    def __init__(
        self, status: int, code: str, message: str, details: dict[str, Any] | None = None
    ) -> None:
        message = clip(message)  # a caller's value quoted whole would be echoed whole
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details

    def body(self) -> dict[str, Any]:
        err: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details:
            err["details"] = self.details
        return {"error": err}


def bad_request(message: str, details: dict[str, Any] | None = None) -> ApiError:
    return ApiError(400, "invalid-request", message, details)


def forbidden(message: str) -> ApiError:
    return ApiError(403, "forbidden", message)


def not_found(message: str) -> ApiError:
    return ApiError(404, "not-found", message)


class MethodNotAllowed(ApiError):
    """A 405 with the methods the path does serve: the error middleware sends them as the
    ``Allow`` header (RFC 9110 15.5.6: a 405 MUST carry it)."""

    def __init__(self, message: str, allow: tuple[str, ...]) -> None:
        super().__init__(405, "method-not-allowed", message)
        self.allow = allow


class Unavailable(ApiError):
    """The daemon is shutting down or its log cannot be written: nothing was recorded."""

    def __init__(self, message: str) -> None:
        super().__init__(503, "unavailable", message)


class StoreAway(ApiError):
    """The log cannot be written for now (PostgreSQL unreachable, the disk under the DuckDB
    file full): nothing of the request was recorded, the daemon keeps serving reads and
    retries by itself (``storefault.py``). 503, or 507 for a full disk, with ``Retry-After``
    (the error middleware sets it from :attr:`retry_after_s`)."""

    def __init__(self, status: int, code: str, message: str, retry_after_s: int) -> None:
        super().__init__(status, code, message, {"retry_after_s": retry_after_s})
        self.retry_after_s = retry_after_s
