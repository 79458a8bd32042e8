"""Log compaction: the workers' per-attempt chatter of long-ended tasks leaves the log.

The event log is also the audit log (``GET /v1/events``, the dashboard, alerts) and the
ledger's source, and what users expect of an audit log is that it keeps every decision and
every request: submissions, placements, preemptions, cancellations, ends, estate changes,
tokens, the engine switch, alerts, workers registered and lost. None of those is removed.
What a long-ended task no longer needs is the protocol between the daemon and its workers:
``leased``, ``started``, ``stopped`` and ``unleased``, several per attempt. Once a task
ended more than ``--compact-after`` ago (30 days by default), before the last snapshot, with
nothing logged about it since, those events are deleted from the log (and from the audit's
copy of it beside a PostgreSQL log); the task's history row keeps their summary (its
worker, epochs, start, exit code: ``GET /v1/tasks/{id}`` answers as before).

A full replay (no usable snapshot) still rebuilds the same state: those events change only a
task's leases, and the leases of a task that ended long ago are all closed. Each run is
recorded in ``log_compactions`` (when, up to which event, which ends, how many removed).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import duckdb

if TYPE_CHECKING:
    from kliqued.daemon.storage.store import Store

log = logging.getLogger(__name__)

NOISE = ("leased", "started", "stopped", "unleased")
"""The kinds compaction removes: a worker's lease of an attempt and its lifecycle."""

ENDS = ("ended", "cancelled")

AFTER_MS = 30 * 24 * 3600 * 1000
"""Default retention of the chatter after a task ends (``kliqued serve --compact-after``)."""


def delete_sql(mark: str) -> str:
    """The DELETE, in either dialect (``mark``: ``?`` for DuckDB, ``%s`` for psycopg),
    with parameters (upto_seq, ended_from_ms, ended_before_ms, upto_seq): the chatter of the
    tasks that ended in the window, up to the snapshot, whose log ends there."""
    kinds = ", ".join(f"'{k}'" for k in NOISE)
    ends = ", ".join(f"'{k}'" for k in ENDS)
    return (
        f"DELETE FROM events WHERE kind IN ({kinds}) AND seq <= {mark} AND task IN ("
        f"SELECT e.task FROM events e WHERE e.kind IN ({ends}) AND e.task IS NOT NULL"
        f" AND e.at_ms >= {mark} AND e.at_ms < {mark} AND NOT EXISTS ("
        f"SELECT 1 FROM events l WHERE l.task = e.task AND l.seq > {mark}))"
    )


class Compactor:
    """Runs after each snapshot (``Snapshotter.on_taken``), on a thread: each run looks at
    the tasks that ended since the previous run's window, so its work follows what is new,
    not the length of the log."""

    def __init__(self, store: Store, after_ms: int = AFTER_MS) -> None:
        self.store = store
        self.after_ms = after_ms
        """Retention after a task's end; negative: no compaction."""

    def __call__(self, upto_seq: int) -> int:
        """Compacts up to the snapshot at ``upto_seq``; returns how many events left."""
        if self.after_ms < 0:
            return 0
        now = int(time.time() * 1000)
        since, upto_at = self.store.read_sync(lambda cur: _window(cur, upto_seq))
        # ends past the snapshot cannot be compacted yet: the window stops at its time
        before = min(now - self.after_ms, upto_at + 1)
        if before <= since:
            return 0
        removed = self.store.compact(delete_sql, [upto_seq, since, before, upto_seq])
        self.store.write_local(
            lambda conn: conn.execute(
                "INSERT INTO log_compactions VALUES (?, ?, ?, ?, ?)",
                [now, upto_seq, since, before, removed],
            )
        )
        if removed:
            log.info(
                "log compaction: %d worker events of tasks ended before %s removed "
                "(up to event %d)",
                removed,
                time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(before / 1000)),
                upto_seq,
            )
        return removed


def _window(cur: duckdb.DuckDBPyConnection, upto_seq: int) -> tuple[int, int]:
    """(where the last run's window ended, the time of event ``upto_seq``)."""
    row = cur.execute("SELECT max(ended_before_ms) FROM log_compactions").fetchone()
    since = int(row[0]) if row and row[0] is not None else 0
    row = cur.execute(
        "SELECT at_ms FROM events WHERE seq <= ? ORDER BY seq DESC LIMIT 1", [upto_seq]
    ).fetchone()
    return since, int(row[0]) if row else 0
