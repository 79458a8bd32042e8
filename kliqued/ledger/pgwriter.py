"""Writing the ledger in PostgreSQL: each write of :mod:`.ops` in the batch's transaction
(psycopg 3), the same rows as :mod:`.writer` writes in DuckDB (:mod:`.pgschema`'s tables).

Times travel as naive UTC ``datetime`` values built from integer milliseconds (exact), amounts
as ``Decimal`` (exact), and a batch's rows as one array per column unnested side by side: one
statement and one round trip per write, whatever its size.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Iterable

from .capacity import reserved_gpu_type
from . import lost
from .ops import (
    CloseCloudNode,
    CloseIntervals,
    FillGroupPaths,
    LedgerWrite,
    OpenCloudNode,
    OpenIntervals,
    RecordEstate,
    RecordPreemptions,
    ReplacePrices,
)
from .pgschema import MERGE_MONTHLY, monthly_rows_sql
from .schema import FLUSH_AT
from .writer import IntervalRow

_EPOCH = datetime(1970, 1, 1)


def ts(ms: int) -> datetime:
    """Integer milliseconds since the epoch as a naive UTC datetime (exact)."""
    return _EPOCH + timedelta(milliseconds=int(ms))


def _milli(milli: int) -> Decimal:
    return Decimal(int(milli)).scaleb(-3)


_OPEN = """
INSERT INTO ledger (interval_id, task, "user", project, "group", policy, profile, resource,
                    pool, gpu_type, gpus, time_weight, start_at, end_at, end_reason, revision,
                    group_path, channel)
SELECT v.interval_id, v.task, v."user", v.project, v."group", v.policy, v.profile, v.resource,
       v.pool, v.gpu_type, v.gpus, v.time_weight, v.start_at, NULL, NULL, v.revision,
       v.group_path, v.channel
FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[],
            %s::text[], %s::text[], %s::text[], %s::text[], %s::numeric[], %s::numeric[],
            %s::timestamp[], %s::text[], %s::text[], %s::text[])
     AS v(interval_id, task, "user", project, "group", policy, profile, resource, pool,
          gpu_type, gpus, time_weight, start_at, revision, group_path, channel)"""


def open_intervals(cur: Any, rows: Iterable[IntervalRow]) -> int:
    """Records placements; a duplicate ``interval_id`` raises (the batch rolls back)."""
    rows = list(rows)
    if not rows:
        return 0
    cur.execute(
        _OPEN,
        [
            [r.interval_id for r in rows],
            [r.task for r in rows],
            [r.user for r in rows],
            [r.project for r in rows],
            [r.group for r in rows],
            [r.policy for r in rows],
            [r.profile for r in rows],
            [r.resource for r in rows],
            [r.pool for r in rows],
            [r.gpu_type for r in rows],
            [_milli(r.gpus_milli) for r in rows],
            [_milli(r.weight_milli) for r in rows],
            [ts(r.start_ms) for r in rows],
            [r.revision for r in rows],
            [r.group_path for r in rows],
            [r.channel for r in rows],
        ],
    )
    return int(cur.rowcount)


_CLOSE = """
UPDATE ledger SET end_at = v.end_at, end_reason = v.reason
FROM unnest(%s::text[], %s::timestamp[], %s::text[]) AS v(interval_id, end_at, reason)
WHERE ledger.interval_id = v.interval_id AND ledger.end_at IS NULL
RETURNING ledger.interval_id"""

_PENDING = "INSERT INTO ledger_monthly_pending SELECT * FROM ledger WHERE interval_id = ANY(%s)"
_FEED = """
INSERT INTO ledger_feed
SELECT nextval('ledger_feed_seq'), i
FROM (SELECT i FROM unnest(%s::text[]) WITH ORDINALITY AS t(i, n) ORDER BY n) o"""


def close_intervals(cur: Any, items: Iterable[tuple[str, int, str]]) -> int:
    """Ends open intervals (the first item wins for an id given twice); returns how many
    were open. Each closed one goes to the pending monthly rows and the feed, in order."""
    seen: dict[str, tuple[int, str]] = {}
    for interval_id, end_ms, reason in items:
        seen.setdefault(interval_id, (int(end_ms), reason))
    if not seen:
        return 0
    ids = list(seen)
    cur.execute(_CLOSE, [ids, [ts(seen[k][0]) for k in ids], [seen[k][1] for k in ids]])
    returned = {r[0] for r in cur.fetchall()}
    done = [k for k in ids if k in returned]  # the order they were given: the feed's
    if done:
        cur.execute(_PENDING, [done])
        cur.execute(_FEED, [done])
        cur.execute("SELECT count(*) FROM ledger_monthly_pending")
        if cur.fetchone()[0] >= FLUSH_AT:
            flush_monthly(cur)
    return len(done)


_FLUSH = MERGE_MONTHLY.format(rows=monthly_rows_sql("ledger_monthly_pending"))


def flush_monthly(cur: Any) -> None:
    """Folds the pending closed intervals into ``ledger_monthly``."""
    cur.execute(_FLUSH)
    cur.execute("DELETE FROM ledger_monthly_pending")


def rebuild_monthly(cur: Any, gpu_types: list[str] | None = None) -> None:
    """``ledger_monthly`` recomputed from the closed intervals, all or some GPU types."""
    if gpu_types is None:
        cur.execute("DELETE FROM ledger_monthly")
        cur.execute("DELETE FROM ledger_monthly_pending")
        rows = monthly_rows_sql("(SELECT * FROM ledger WHERE end_at IS NOT NULL)")
        cur.execute(f"INSERT INTO ledger_monthly {rows}")
        return
    if not gpu_types:
        return
    cur.execute("DELETE FROM ledger_monthly WHERE gpu_type = ANY(%s)", [gpu_types])
    cur.execute("DELETE FROM ledger_monthly_pending WHERE gpu_type = ANY(%s)", [gpu_types])
    rows = monthly_rows_sql(
        "(SELECT * FROM ledger WHERE end_at IS NOT NULL AND gpu_type = ANY(%s))"
    )
    # the source appears twice in the rows' query (the two kinds of piece)
    cur.execute(f"INSERT INTO ledger_monthly {rows}", [gpu_types, gpu_types])


def _naive_utc(text: str) -> datetime:
    from .writer import _naive_utc as naive

    return naive(text)


def replace_prices(cur: Any, estate: Any) -> int:
    """:func:`.writer.replace_prices` (its docstring says why the monthly rows of a GPU type
    whose price periods changed are rebuilt)."""
    cur.execute("SELECT gpu_type, effective_from FROM prices")
    before = set(cur.fetchall())
    cur.execute("DELETE FROM prices")
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
        cur.executemany(
            "INSERT INTO prices (gpu_type, per_gpu_hour, currency, effective_from, "
            "list_per_gpu_hour) VALUES (%s, %s, %s, %s, %s)",
            rows,
        )
    after = {(r[0], r[3]) for r in rows}
    rebuild_monthly(cur, sorted({g for g, _ in before ^ after}))
    return len(rows)


def record_estate(cur: Any, estate: Any, at_ms: int) -> bool:
    """:func:`.capacity.record_estate` in PostgreSQL."""
    cur.execute("SELECT revision FROM capacity ORDER BY effective_from DESC LIMIT 1")
    latest = cur.fetchone()
    if latest is not None and latest[0] == estate.revision:
        return False
    at = ts(at_ms)
    pools = [
        (at, estate.revision, p.name, p.kind, p.gpu_type, _milli(p.capacity_milli))
        for p in estate.pools
    ]
    if pools:
        cur.executemany("INSERT INTO capacity VALUES (%s, %s, %s, %s, %s, %s)", pools)
    paths = {g.name: "/".join([*reversed(g.ancestors), g.name]) for g in estate.groups}
    res = [
        (
            at,
            estate.revision,
            p.name,
            p.group,
            paths.get(p.group, p.group),
            _milli(p.reservation_milli),
            reserved_gpu_type(estate, p),
        )
        for p in estate.policies
        if p.reservation_milli > 0 and not p.envelope
    ]
    if res:
        cur.executemany("INSERT INTO reservations VALUES (%s, %s, %s, %s, %s, %s, %s)", res)
    return True


_FILL = """
UPDATE {table} SET group_path = v.path
FROM unnest(%s::text[], %s::text[]) AS v(grp, path)
WHERE {table}."group" = v.grp AND {table}.group_path IS NULL"""


def fill_group_paths(cur: Any, paths: dict[str, str]) -> int:
    """:func:`.writer.fill_group_paths` in PostgreSQL."""
    if not paths:
        return 0
    lists = [list(paths), list(paths.values())]
    cur.execute(_FILL.format(table="ledger"), lists)
    filled = int(cur.rowcount)
    cur.execute(_FILL.format(table="ledger_monthly_pending"), lists)
    if filled:
        rebuild_monthly(cur)
    return filled


def open_cloud_node(cur: Any, op: OpenCloudNode) -> None:
    d = op.data
    cur.execute(
        "INSERT INTO cloud_nodes (node, pool, provider, instance_type, lifecycle, gpus, "
        "per_hour, currency, start_at, end_at, end_reason, revision) VALUES "
        "(%s, %s, %s, %s, %s, %s, %s::numeric(18,6), %s, %s, NULL, NULL, %s)",
        [
            d["node"],
            d["pool"],
            d["provider"],
            d["instance_type"],
            d["lifecycle"],
            int(d["gpus"]),
            str(d["per_hour"]),
            d["currency"],
            ts(op.start_ms),
            op.revision,
        ],
    )


def close_cloud_node(cur: Any, op: CloseCloudNode) -> None:
    cur.execute(
        "UPDATE cloud_nodes SET end_at = greatest(start_at, %s), end_reason = %s "
        "WHERE node = %s AND end_at IS NULL",
        [ts(op.end_ms), op.reason, op.node],
    )


def apply(cur: Any, op: LedgerWrite) -> object:
    """Writes ``op`` on a psycopg cursor, inside the caller's transaction."""
    if isinstance(op, OpenIntervals):
        return open_intervals(cur, op.rows)
    if isinstance(op, CloseIntervals):
        return close_intervals(cur, op.items)
    if isinstance(op, ReplacePrices):
        return replace_prices(cur, op.estate)
    if isinstance(op, RecordEstate):
        return record_estate(cur, op.estate, op.at_ms)
    if isinstance(op, FillGroupPaths):
        return fill_group_paths(cur, op.paths)
    if isinstance(op, OpenCloudNode):
        open_cloud_node(cur, op)
        return None
    if isinstance(op, CloseCloudNode):
        close_cloud_node(cur, op)
        return None
    if isinstance(op, RecordPreemptions):
        return lost.write_pg(cur, op.rows)
    raise TypeError(f"not a ledger write: {op!r}")
