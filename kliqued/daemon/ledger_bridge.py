"""The daemon's calls into the usage ledger (``kliqued.ledger``, its own module): database
operations that run inside the same transaction as the events they belong to, so the ledger
and the event log cannot disagree.

The ledger module is imported when first needed; when it is not installed the daemon still
runs (and says so once at start), writing events only.
"""

from __future__ import annotations

import importlib
from typing import Any

from .store import DbOp


def _module(name: str) -> Any | None:
    try:
        return importlib.import_module(f"kliqued.ledger.{name}")
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("kliqued.ledger"):
            return None
        raise


def available() -> bool:
    return _module("writer") is not None


def intervals(opens: list[dict[str, Any]], closes: list[tuple[str, int, str]]) -> DbOp | None:
    """One pass's ledger changes as one operation: every placement's interval opened, then
    every preempted interval closed (a task lent and reclaimed in the same pass is opened
    before it is closed), with the ledger's multi-row writes."""
    w = _module("writer")
    if w is None or not (opens or closes):
        return None
    rows = [w.IntervalRow(**f) for f in opens]

    def op(conn: Any) -> None:
        if rows:
            w.open_intervals(conn, rows)
        if closes:
            w.close_intervals(conn, closes)
    return op


def close_interval(interval_id: str, end_ms: int, reason: str) -> DbOp | None:
    w = _module("writer")
    if w is None:
        return None
    return lambda conn: w.close_interval(conn, interval_id, end_ms, reason)


def replace_prices(compiled: Any) -> DbOp | None:
    w = _module("writer")
    if w is None:
        return None
    return lambda conn: w.replace_prices(conn, compiled)


def group_paths(compiled: Any) -> dict[str, str]:
    """Each group's path (its ancestors top first, then itself) for the intervals opened
    under ``compiled``; empty when the ledger is not installed."""
    w = _module("writer")
    return {} if w is None else w.group_paths(compiled)


def fill_group_paths(conn: Any, compiled: Any) -> int:
    """At start: the rows from before the ledger recorded paths get the paths of the estate
    in force (``writer.fill_group_paths``); returns how many."""
    w = _module("writer")
    if w is None:
        return 0
    conn.execute("BEGIN")  # the paths and the monthly aggregate rebuilt from them, or neither
    try:
        filled = w.fill_group_paths(conn, w.group_paths(compiled))
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return filled


def sql_module() -> Any | None:
    return _module("sql")


def export_module() -> Any | None:
    return _module("export")
