"""Writing the ledger: the daemon opens an interval when it places a task and closes it when the
task is preempted or ends. Every function runs inside the caller's transaction and never
commits, so a ledger row is durable exactly when the event that caused it is.

Times are integer milliseconds since the epoch (UTC), GPU amounts and weights integer
thousandths, as in the engine; they are stored as TIMESTAMP and DECIMAL(12,3) exactly.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any, Callable, Iterable

from compiler.compiled import CompiledEstate
from compiler.units import milli_str, parse_time

from .db import Conn, Rows
from .schema import FEED_SEQUENCE, FLUSH_AT, flush_monthly, rebuild_monthly

CHANNEL_LABEL = "klique.channel"
"""The task label that names the channel a task came through (kliqued/daemon/state/channels.py
sets it for schedules and pipelines); a task without it came through the API itself."""

BATCH = 10_000
"""Rows per statement in the batch functions."""


@dataclass(frozen=True, slots=True)
class IntervalRow:
    """One placement of a task: ``interval_id`` is ``<task>#<n>``, the task's nth placement."""

    interval_id: str
    task: str
    user: str
    project: str | None
    group: str
    policy: str
    profile: str
    resource: str
    pool: str
    gpu_type: str
    gpus_milli: int
    weight_milli: int
    start_ms: int
    revision: str | None
    group_path: str | None = None
    """The group and its ancestors, top first, joined by ``/`` (:func:`group_paths`), as the
    estate in force at the open has them; None when unknown."""
    channel: str | None = None
    """How the task was sent: ``cli``, ``sdk``, ``api``, ``mcp``, ``schedule``, ``pipeline``
    or ``session`` (kliqued/daemon/state/channels.py); None when unknown."""


def group_paths(estate: CompiledEstate) -> dict[str, str]:
    """Each group of a :class:`CompiledEstate` with its path: its ancestors top first, then
    itself, joined by ``/`` (``northwind/research/team-a``; a top group is its own path).
    Group names cannot contain ``/``, so the path splits back into its levels."""
    return {g.name: "/".join([*reversed(g.ancestors), g.name]) for g in estate.groups}


# Batches bind one list per column and unnest them side by side: DuckDB binds 16 list
# parameters instead of 16 x N scalars and plans one projection instead of N VALUES rows.
# Measured on this 2-core machine (10M-row ledger): about 0.01 ms/row, against 0.2 ms/row for a
# multi-row VALUES with flattened parameters and 0.8 ms/row for executemany. A list plan has a
# fixed cost of about 2 ms, so fewer than SMALL rows go through a multi-row VALUES instead.
# Amounts travel as exact decimal text ("1.5"), times as integer milliseconds.
_OPEN_SQL = """
INSERT INTO ledger (interval_id, task, "user", project, "group", policy, profile, resource,
                    pool, gpu_type, gpus, time_weight, start_at, end_at, end_reason, revision,
                    group_path, channel)
SELECT interval_id, task, "user", project, "group", policy, profile, resource, pool, gpu_type,
       CAST(gpus AS DECIMAL(12,3)), CAST(time_weight AS DECIMAL(12,3)),
       make_timestamp(start_ms * 1000), NULL, NULL, revision, group_path, channel
FROM (SELECT unnest(?::VARCHAR[]) AS interval_id, unnest(?::VARCHAR[]) AS task,
             unnest(?::VARCHAR[]) AS "user", unnest(?::VARCHAR[]) AS project,
             unnest(?::VARCHAR[]) AS "group", unnest(?::VARCHAR[]) AS policy,
             unnest(?::VARCHAR[]) AS profile, unnest(?::VARCHAR[]) AS resource,
             unnest(?::VARCHAR[]) AS pool, unnest(?::VARCHAR[]) AS gpu_type,
             unnest(?::VARCHAR[]) AS gpus, unnest(?::VARCHAR[]) AS time_weight,
             unnest(?::BIGINT[]) AS start_ms, unnest(?::VARCHAR[]) AS revision,
             unnest(?::VARCHAR[]) AS group_path, unnest(?::VARCHAR[]) AS channel)"""


_OPEN_VALUES_SQL = """
INSERT INTO ledger (interval_id, task, "user", project, "group", policy, profile, resource,
                    pool, gpu_type, gpus, time_weight, start_at, end_at, end_reason, revision,
                    group_path, channel)
VALUES {rows}"""
_OPEN_VALUES_ROW = (
    "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
    "make_timestamp(CAST(? AS BIGINT) * 1000), NULL, NULL, ?, ?, ?)"
)
SMALL = 24
"""Below this many rows, a multi-row VALUES with flattened parameters is cheaper than binding
lists (whose plan costs a few milliseconds whatever the size)."""


def _count(result: Rows) -> int:
    row = result.fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def open_interval(conn: Conn, row: IntervalRow) -> None:
    """Records a placement: a ledger row with no end yet. An ``interval_id`` that already
    exists raises ``duckdb.ConstraintException`` (the caller's transaction must roll back):
    two placements with one id are a bug to surface, not to hide."""
    open_intervals(conn, [row])


def open_intervals(conn: Conn, rows: Iterable[IntervalRow]) -> int:
    """Records many placements, ``BATCH`` rows per statement; returns how many. Raises like
    :func:`open_interval` on a duplicate id."""
    rows = list(rows)
    written = 0
    for i in range(0, len(rows), BATCH):
        chunk = rows[i : i + BATCH]
        if len(chunk) < SMALL:
            params = []
            for r in chunk:
                params += [
                    r.interval_id,
                    r.task,
                    r.user,
                    r.project,
                    r.group,
                    r.policy,
                    r.profile,
                    r.resource,
                    r.pool,
                    r.gpu_type,
                    milli_str(r.gpus_milli),
                    milli_str(r.weight_milli),
                    int(r.start_ms),
                    r.revision,
                    r.group_path,
                    r.channel,
                ]
            sql = _OPEN_VALUES_SQL.format(rows=", ".join([_OPEN_VALUES_ROW] * len(chunk)))
            written += _count(conn.execute(sql, params))
            continue
        columns = [
            [r.interval_id for r in chunk],
            [r.task for r in chunk],
            [r.user for r in chunk],
            [r.project for r in chunk],
            [r.group for r in chunk],
            [r.policy for r in chunk],
            [r.profile for r in chunk],
            [r.resource for r in chunk],
            [r.pool for r in chunk],
            [r.gpu_type for r in chunk],
            [milli_str(r.gpus_milli) for r in chunk],
            [milli_str(r.weight_milli) for r in chunk],
            [int(r.start_ms) for r in chunk],
            [r.revision for r in chunk],
            [r.group_path for r in chunk],
            [r.channel for r in chunk],
        ]
        written += _count(conn.execute(_OPEN_SQL, columns))
    return written


_CLOSE_SQL = """
UPDATE ledger SET end_at = make_timestamp(v.end_ms * 1000), end_reason = v.reason
FROM (SELECT unnest(?::VARCHAR[]) AS interval_id, unnest(?::BIGINT[]) AS end_ms,
             unnest(?::VARCHAR[]) AS reason) v
WHERE ledger.interval_id = v.interval_id AND ledger.end_at IS NULL
RETURNING ledger.interval_id"""

_CLOSE_ONE_SQL = """
UPDATE ledger SET end_at = make_timestamp(CAST(? AS BIGINT) * 1000), end_reason = ?
WHERE interval_id = ? AND end_at IS NULL"""

_PENDING_ONE = "INSERT INTO ledger_monthly_pending SELECT * FROM ledger WHERE interval_id = ?"
_PENDING_MANY = (
    "INSERT INTO ledger_monthly_pending SELECT * FROM ledger "
    "WHERE interval_id IN (SELECT unnest(?::VARCHAR[]))"
)
_FEED_ONE = f"INSERT INTO ledger_feed VALUES (nextval('{FEED_SEQUENCE}'), ?)"
_FEED_MANY = (
    f"INSERT INTO ledger_feed SELECT nextval('{FEED_SEQUENCE}'), i "
    "FROM (SELECT unnest(?::VARCHAR[]) AS i)"
)


def close_interval(conn: Conn, interval_id: str, end_ms: int, reason: str) -> bool:
    """Ends an open interval (preempted, finished, cancelled, ...). Returns False when there is
    no open interval with that id (already closed, or never opened): closing twice is a no-op,
    so replaying an event log is safe."""
    if _count(conn.execute(_CLOSE_ONE_SQL, [int(end_ms), reason, interval_id])) != 1:
        return False
    conn.execute(_PENDING_ONE, [interval_id])
    conn.execute(_FEED_ONE, [interval_id])
    return True


def close_intervals(conn: Conn, items: Iterable[tuple[str, int, str]]) -> int:
    """Ends many open intervals, given as ``(interval_id, end_ms, reason)``; returns how many
    were open. The first item wins when an id appears twice. DuckDB joins the batch to the
    ledger through the primary-key index, so this costs the batch, not the ledger's size.
    Folds the pending closed intervals into ``ledger_monthly`` when there are enough."""
    seen: dict[str, tuple[int, str]] = {}
    for interval_id, end_ms, reason in items:
        seen.setdefault(interval_id, (int(end_ms), reason))
    ids = list(seen)
    if len(ids) <= 1:  # a point update is cheaper than planning the list join (3 statements
        # each: two ids cost more than the list's 3)
        closed = sum(close_interval(conn, k, *seen[k]) for k in ids)
    else:
        closed = 0
        for i in range(0, len(ids), BATCH):
            chunk = ids[i : i + BATCH]
            done = [
                r[0]
                for r in conn.execute(
                    _CLOSE_SQL, [chunk, [seen[k][0] for k in chunk], [seen[k][1] for k in chunk]]
                ).fetchall()
            ]
            if done:
                conn.execute(_PENDING_MANY, [done])
                conn.execute(_FEED_MANY, [done])
            closed += len(done)
    if closed and _pending_due(conn, closed):
        flush_monthly(conn)
        _pending_seen[conn] = 0
    return closed


_pending_seen: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
"""Per connection, the pending closed intervals as last counted plus those closed since."""


def _pending_due(conn: Conn, closed: int) -> bool:
    """Whether ``ledger_monthly_pending`` holds ``FLUSH_AT`` rows. Counted in the table
    only when the tally of this connection's closes says it may (and at its first close):
    the count was one more statement in every commit that closed an interval, a few
    milliseconds each on a busy machine. The decision is still the table's count; a tally
    that drifted (a rolled-back batch, another writer) only moves when it is looked at."""
    try:
        tally = _pending_seen.get(conn)
    except TypeError:  # a connection that cannot be weakly referenced: count each time
        tally = None
    if tally is not None and tally + closed < FLUSH_AT:
        _pending_seen[conn] = tally + closed
        return False
    count = int(conn.execute("SELECT count(*) FROM ledger_monthly_pending").fetchone()[0])
    try:
        _pending_seen[conn] = count
    except TypeError:
        pass
    return count >= FLUSH_AT


def _naive_utc(text: str) -> datetime:
    return parse_time(text).astimezone(timezone.utc).replace(tzinfo=None)


def replace_prices(conn: Conn, estate: CompiledEstate) -> int:
    """Replaces the prices table with the estate's pricing (a :class:`CompiledEstate`), in
    ``settings.currency``. Past usage keeps its price because old rows stay in the estate with
    their ``effective_from``; returns how many prices were written. When a GPU type gains or
    loses a price period, its ``ledger_monthly`` rows are rebuilt (a changed amount needs
    nothing: the amount is joined at query time)."""
    before = set(conn.execute("SELECT gpu_type, effective_from FROM prices").fetchall())
    conn.execute("DELETE FROM prices")
    rows = [
        (
            p.gpu_type,
            Decimal(p.per_gpu_hour),
            estate.settings.currency,
            _naive_utc(p.effective_from),
            None if p.list_per_gpu_hour is None else Decimal(p.list_per_gpu_hour),
        )
        for p in estate.pricing
    ]
    if rows:
        params = [v for r in rows for v in r]
        conn.execute(
            "INSERT INTO prices (gpu_type, per_gpu_hour, currency, effective_from, "
            "list_per_gpu_hour) VALUES " + ", ".join(["(?, ?, ?, ?, ?)"] * len(rows)),
            params,
        )
    after = {(r[0], r[3]) for r in rows}
    rebuild_monthly(conn, sorted({g for g, _ in before ^ after}))
    return len(rows)


_FILL_SQL = """
UPDATE {table} SET group_path = v.path
FROM (SELECT unnest(?::VARCHAR[]) AS grp, unnest(?::VARCHAR[]) AS path) v
WHERE {table}."group" = v.grp AND {table}.group_path IS NULL"""


def fill_group_paths(conn: Conn, paths: dict[str, str]) -> int:
    """Gives the rows recorded before the ledger kept paths (``group_path`` NULL) the path of
    their group in ``paths`` (:func:`group_paths` of the estate in force at the daemon's
    start); returns how many rows it filled. Rows of a group that ``paths`` lacks keep NULL.
    When closed rows were filled, ``ledger_monthly`` (keyed by the path) is rebuilt. Runs in
    the caller's transaction; a no-op once every row has a path."""
    if (
        not paths
        or not conn.execute("SELECT count(*) FROM ledger WHERE group_path IS NULL").fetchone()[0]
    ):
        return 0
    lists = [list(paths), list(paths.values())]
    filled = _count(conn.execute(_FILL_SQL.format(table="ledger"), lists))
    conn.execute(_FILL_SQL.format(table="ledger_monthly_pending"), lists)
    if filled:
        rebuild_monthly(conn)
    return filled


# cloud nodes (kliqued/daemon/state/cloud.py) ------------------------------------------------------
def open_cloud_node(
    data: dict[str, Any], start_ms: int, revision: str | None
) -> Callable[[Conn], None]:
    """The ledger op that records a cloud node's start (``cloud_nodes``), at ``per_hour``."""

    def op(conn: Conn) -> None:
        conn.execute(
            "INSERT INTO cloud_nodes (node, pool, provider, instance_type, lifecycle, gpus, "
            "per_hour, currency, start_at, end_at, end_reason, revision) VALUES "
            "(?, ?, ?, ?, ?, ?, CAST(? AS DECIMAL(18,6)), ?, make_timestamp(? * 1000), NULL, "
            "NULL, ?)",
            [
                data["node"],
                data["pool"],
                data["provider"],
                data["instance_type"],
                data["lifecycle"],
                int(data["gpus"]),
                str(data["per_hour"]),
                data["currency"],
                start_ms,
                revision,
            ],
        )

    return op


def close_cloud_node(node: str, end_ms: int, reason: str) -> Callable[[Conn], None]:
    """The ledger op that records a cloud node's end (never before its start)."""

    def op(conn: Conn) -> None:
        conn.execute(
            "UPDATE cloud_nodes SET end_at = greatest(start_at, "
            "make_timestamp(? * 1000)), end_reason = ? "
            "WHERE node = ? AND end_at IS NULL",
            [end_ms, reason, node],
        )

    return op
