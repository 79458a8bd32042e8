"""The billing feed: closed ledger intervals in the order they closed, for external billing
systems that pull increments (a cursor), never a row twice and none missed, across daemon
restarts (``ledger_feed`` in :mod:`kliqued.ledger.schema` holds the numbers).

Only **closed** intervals are in the feed: an open one still grows, and a billing system
takes each interval once, final. An interval is in the feed from the commit that closed it.
Its cost is the ledger's at the time of the read: a price backdated into it later reprices
it in the ledger (docs/ledger.md), not in rows already pulled.
"""

from __future__ import annotations

from typing import Any, Sequence

from klique_util.excerpt import excerpt

from . import scope
from .db import Conn
from .export import EXPORT_COLUMNS, _select_list

MAX_LIMIT = 10_000
"""The most rows one pull returns; ``more`` says when there are others."""

_FEED_SQL = f"""
SELECT f.seq, {_select_list()}
FROM ledger_feed f JOIN usage_priced u ON u.interval_id = f.interval_id
WHERE f.seq > ? {{scope}}
ORDER BY f.seq
LIMIT ?"""

_PG_FEED_SQL = f"""
SELECT f.seq, {_select_list(pg=True)}
FROM ledger_feed f JOIN usage_priced u ON u.interval_id = f.interval_id
WHERE f.seq > %s
ORDER BY f.seq
LIMIT %s"""
""":data:`_FEED_SQL` in PostgreSQL (the whole ledger; docs/ha.md)."""

COLUMNS = ["seq", *(n for n, _ in EXPORT_COLUMNS)]


class BadCursor(ValueError):
    """A cursor that is not one this feed gave out."""


def parse_cursor(text: str | None) -> int:
    """The position after which to read: ``None``/empty for the start, else the ``cursor``
    of an earlier answer (a decimal number; opaque to clients)."""
    if text is None or text == "":
        return 0
    if not text.isdigit() or len(text) > 19:
        raise BadCursor(
            f"cursor {excerpt(text)} is not one this feed gave out: pass back the "
            "`cursor` of the previous answer, or none to start from the beginning"
        )
    return int(text)


def pull(
    conn: Conn, after: int, limit: int = 1000, groups: Sequence[str] | None = None, pg: bool = False
) -> dict[str, Any]:
    """Up to ``limit`` closed intervals numbered after ``after``, in closing order:
    ``{"columns", "rows", "cursor", "more"}``; the next pull passes ``cursor``. ``groups``:
    a group admin's subtrees only (the cursor still counts every row, so it never goes
    back). ``pg``: ``conn`` is on PostgreSQL's ledger (the whole ledger)."""
    limit = max(1, min(int(limit), MAX_LIMIT))
    where = "" if groups is None else "AND " + scope.visible("u", groups)
    sql = _PG_FEED_SQL if pg else _FEED_SQL.format(scope=where)
    rows = conn.execute(sql, [after, limit + 1]).fetchall()
    more = len(rows) > limit
    rows = rows[:limit]
    cursor = rows[-1][0] if rows else after
    return {
        "columns": COLUMNS,
        "rows": [dict(zip(COLUMNS, r)) for r in rows],
        "cursor": str(cursor),
        "more": more,
    }
