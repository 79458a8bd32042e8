"""Lost work in the ledger (lending.md "Least lost work first"): one row per preemption the
engine decided, with the GPU-hours it lost and the group that took the GPUs back.

Why a table of its own rather than columns of ``ledger``: a preemption is an event at one
moment, not a span of time, and finance attributes its cost to someone other than the
interval's group (``settings.attribution.lost_work``: the taker, the owner or overhead).
The row is keyed by the interval the preemption ended, so writing it twice (a replay) is a
no-op, as closing an interval twice is.

Lost GPU-hours are ``gpus x lost_ms``, exact: stored as the integer milliseconds and the
3-decimal size, and as hours rounded half up to the millionth (the ledger's precision).
Both backends get the same table and view (:data:`DUCK_TABLE`, :data:`PG_TABLE`,
:func:`view_sql`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Iterable

from klique_util.units import UNITS_PER_HOUR

from .dialect import DUCKDB, POSTGRESQL
from .tables import PREEMPTIONS

_UNITS_PER_MICRO_HOUR = UNITS_PER_HOUR // 1_000_000
"""milli-GPU x ms in a millionth of a GPU-hour."""


@dataclass(frozen=True, slots=True)
class PreemptionRow:
    """One engine preemption: the placement it ended and what that placement lost."""

    interval_id: str
    """The ledger interval it closed (``<task>#<n>``)."""
    task: str
    user: str
    project: str | None
    group: str
    group_path: str | None
    policy: str
    pool: str
    gpu_type: str
    gpus_milli: int
    at_ms: int
    kind: str
    """``reclaimed``, ``rebalanced``, ``budget`` or ``unstarted`` (engine decisions)."""
    reason: str
    """As a person reads it: ``reclaimed by team-a``."""
    taker: str | None
    """The group whose reclaim or rebalance took the GPUs back; None for a budget or a
    start timeout."""
    taker_path: str | None
    lost_ms: int
    revision: str | None

    @property
    def lost_gpu_micro_hours(self) -> int:
        """Lost GPU-hours in millionths, rounded half up (as the ledger's hours are)."""
        return (
            self.gpus_milli * self.lost_ms + _UNITS_PER_MICRO_HOUR // 2
        ) // _UNITS_PER_MICRO_HOUR

    @property
    def lost_gpu_hours(self) -> Decimal:
        return Decimal(self.lost_gpu_micro_hours).scaleb(-6)


COLUMNS = PREEMPTIONS.column_names
"""The table's columns, in order (``user`` and ``group`` are quoted in SQL)."""

DUCK_TABLE = PREEMPTIONS.render(DUCKDB)
PG_TABLE = PREEMPTIONS.render(POSTGRESQL, if_missing=True)
"""The table (:data:`.tables.PREEMPTIONS`) in each dialect."""


def view_sql(cost: str, month: str) -> str:
    """``lost_work``: each preemption with its month and its lost GPU-hours priced at the
    price in force for its GPU type at the moment of the preemption. ``cost`` and ``month``
    are the dialect's (:func:`.dialect.cost`; the month expression)."""
    return f"""
SELECT p.*, {month} AS month, pp.per_gpu_hour, pp.currency, pp.effective_from AS price_from,
       {cost} AS lost_cost
FROM preemptions p
LEFT JOIN price_periods pp ON p.gpu_type = pp.gpu_type
      AND p.preempted_at >= pp.effective_from AND p.preempted_at < pp.effective_to"""


def _ts(ms: int) -> datetime:
    """Integer milliseconds since the epoch as a naive UTC datetime (exact)."""
    return datetime(1970, 1, 1) + timedelta(milliseconds=int(ms))


_DUCK_INSERT = """
INSERT INTO preemptions
SELECT interval_id, task, "user", project, "group", group_path, policy, pool, gpu_type,
       CAST(gpus AS DECIMAL(12,3)), make_timestamp(at_ms * 1000), kind, reason, taker,
       taker_path, lost_ms, CAST(lost AS DECIMAL(18,6)), revision
FROM (SELECT unnest(?::VARCHAR[]) AS interval_id, unnest(?::VARCHAR[]) AS task,
             unnest(?::VARCHAR[]) AS "user", unnest(?::VARCHAR[]) AS project,
             unnest(?::VARCHAR[]) AS "group", unnest(?::VARCHAR[]) AS group_path,
             unnest(?::VARCHAR[]) AS policy, unnest(?::VARCHAR[]) AS pool,
             unnest(?::VARCHAR[]) AS gpu_type, unnest(?::VARCHAR[]) AS gpus,
             unnest(?::BIGINT[]) AS at_ms, unnest(?::VARCHAR[]) AS kind,
             unnest(?::VARCHAR[]) AS reason, unnest(?::VARCHAR[]) AS taker,
             unnest(?::VARCHAR[]) AS taker_path, unnest(?::BIGINT[]) AS lost_ms,
             unnest(?::VARCHAR[]) AS lost, unnest(?::VARCHAR[]) AS revision)
ON CONFLICT DO NOTHING"""

_PG_INSERT = """
INSERT INTO preemptions
SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[],
                     %s::text[], %s::text[], %s::text[], %s::numeric[], %s::timestamp[],
                     %s::text[], %s::text[], %s::text[], %s::text[], %s::bigint[],
                     %s::numeric[], %s::text[])
ON CONFLICT DO NOTHING"""


def _columns(rows: list[PreemptionRow], amount: Any, at: Any) -> list[list[Any]]:
    return [
        [r.interval_id for r in rows],
        [r.task for r in rows],
        [r.user for r in rows],
        [r.project for r in rows],
        [r.group for r in rows],
        [r.group_path for r in rows],
        [r.policy for r in rows],
        [r.pool for r in rows],
        [r.gpu_type for r in rows],
        [amount(Decimal(r.gpus_milli).scaleb(-3)) for r in rows],
        [at(r.at_ms) for r in rows],
        [r.kind for r in rows],
        [r.reason for r in rows],
        [r.taker for r in rows],
        [r.taker_path for r in rows],
        [int(r.lost_ms) for r in rows],
        [amount(r.lost_gpu_hours) for r in rows],
        [r.revision for r in rows],
    ]


def write_duck(conn: Any, rows: Iterable[PreemptionRow]) -> int:
    """Records preemptions in the caller's DuckDB transaction; one already recorded (the
    same interval) is left as it is. Returns how many rows were given."""
    rows = list(rows)
    if rows:
        conn.execute(_DUCK_INSERT, _columns(rows, str, int))
    return len(rows)


def write_pg(cur: Any, rows: Iterable[PreemptionRow]) -> int:
    """:func:`write_duck` on a psycopg cursor, in the batch's PostgreSQL transaction (times
    as naive UTC datetimes, exact, as ``pgwriter.ts`` makes them)."""
    rows = list(rows)
    if rows:
        cur.execute(_PG_INSERT, _columns(rows, lambda d: d, _ts))
    return len(rows)
