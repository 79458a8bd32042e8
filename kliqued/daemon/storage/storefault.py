"""Which failed commits are the store being away for a while, not the daemon being wrong.

A commit can fail for three reasons: its data (``loop.unstorable``: one request refused with
a 422), the fence (``Deposed``: another daemon leads), or the store itself. Of the last, two
are routine and pass by themselves, so the daemon rides them out instead of exiting
(docs/daemon.md, "When the store is away"):

- **disk full** under the DuckDB file (``ENOSPC``, a quota): DuckDB 2.0 fails the commit with
  "Could not write file ... No space left on device" and rolls it back, the connection stays
  usable (measured on a full tmpfs), so writes work again once space returns. PostgreSQL's own
  disk full (SQLSTATE 53100) is the same for the client.
- **unreachable** PostgreSQL (a restart, a failover, the network): psycopg's
  ``OperationalError``/``InterfaceError``; the connection is reopened (libpq's multi-host URL
  finds the new primary).

Everything else (an invalidated DuckDB database, a bug) stays fatal: the process exits and a
restart rebuilds the State from what is durable. Pure: it only reads the exception.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import Literal

import duckdb
import psycopg

from kliqued.daemon.errors import Deposed, StoreAway

FaultKind = Literal["disk-full", "unreachable"]

RETRY_AFTER_S = 2
"""What a refused write's ``Retry-After`` says; the sequencer retries the store this often."""

_FULL_WORDS = ("no space left on device", "disk quota exceeded", "could not extend file")
_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}


@dataclass(frozen=True)
class StoreFault:
    """The store is away: what kind, where (a path or a URL without password), and the first
    line of what the database said."""

    kind: FaultKind
    where: str
    detail: str

    def text(self) -> str:
        """For health, logs and messages: ``disk full under /data/kliqued.duckdb (...)``."""
        what = "disk full under" if self.kind == "disk-full" else "cannot reach"
        return f"{what} {self.where} ({self.detail})"

    def refusal(self) -> StoreAway:
        """What a write gets while the store is away: 507 Insufficient Storage for a full
        disk, 503 otherwise; either way with ``Retry-After`` and nothing recorded."""
        if self.kind == "disk-full":
            return StoreAway(
                507,
                "insufficient-storage",
                f"the event log cannot be written: the {self.text()}; nothing "
                f"was recorded. Reads still answer; retry once space is freed "
                f"(kliqued resumes by itself)",
                RETRY_AFTER_S,
            )
        return StoreAway(
            503,
            "store-unavailable",
            f"the event log cannot be written: kliqued {self.text()}; nothing "
            f"was recorded. Reads still answer; retry shortly (kliqued "
            f"reconnects by itself)",
            RETRY_AFTER_S,
        )


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def disk_full(exc: BaseException) -> bool:
    """True for a write refused because the filesystem (or PostgreSQL's) is full."""
    if isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS:
        return True
    if isinstance(exc, psycopg.errors.DiskFull):
        return True
    if isinstance(exc, (duckdb.Error, psycopg.Error)):
        text = str(exc).lower()
        return any(w in text for w in _FULL_WORDS)
    return False


def classify(exc: BaseException, where: str) -> StoreFault | None:
    """The fault ``exc`` is, when the store is merely away; None when it is not one to ride
    out (its data, a deposed leader, an invalidated database, a bug)."""
    if isinstance(exc, Deposed) or "invalidated" in str(exc):
        return None  # DuckDB's "database has been invalidated": only a reopen helps
    if disk_full(exc):
        return StoreFault("disk-full", where, first_line(exc))
    if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
        return StoreFault("unreachable", where, first_line(exc))
    return None
