"""Finance's read-only SQL on the ledger.

Read-only by construction, not by pattern matching: DuckDB's own parser splits the text into
statements (``duckdb.extract_statements``); there must be exactly one and its type must be
SELECT. It then runs in its own ``BEGIN TRANSACTION READ ONLY`` (one consistent snapshot, and
DuckDB itself refuses any write) that is always rolled back, and a timer interrupts it after
``timeout_s``. File and network table functions fail because the daemon opens the database
with ``enable_external_access = false``.

Values come back JSON-ready: DECIMAL as text (exact: ``"1.850000"``), timestamps as RFC 3339
UTC text (``2026-01-01T00:00:00Z``, with milliseconds when present), dates as ``2026-01-01``,
intervals as seconds, BLOBs as hex, NaN and infinities as text, lists/structs/maps recursively.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import threading
import time
import uuid
from dataclasses import dataclass
from decimal import Decimal

import duckdb

MAX_LIMIT = 100_000
"""The most rows one query may return; larger results belong in ``kliqued ledger export``."""

MAX_BYTES = 32 * 2**20
"""The most JSON one result may take (about), whatever its row count."""

CODES = ("not-read-only", "multiple-statements", "sql-error", "timeout", "too-large")


class LedgerSqlError(Exception):
    """A query refused or failed; ``code`` is one of :data:`CODES`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def to_json(self) -> dict:
        return {"error": {"code": self.code, "message": self.message}}


@dataclass
class SqlResult:
    columns: list[str]
    types: list[str]
    rows: list[list]
    truncated: bool
    elapsed_ms: float

    def to_json(self) -> dict:
        return {"columns": self.columns, "types": self.types, "rows": self.rows,
                "truncated": self.truncated, "elapsed_ms": self.elapsed_ms}


# --- values -------------------------------------------------------------------------------

def time_text(value: _dt.datetime) -> str:
    """RFC 3339 UTC: naive timestamps are UTC (the ledger stores UTC), aware ones converted."""
    if value.tzinfo is not None:
        value = value.astimezone(_dt.timezone.utc).replace(tzinfo=None)
    base = value.strftime("%Y-%m-%dT%H:%M:%S")
    us = value.microsecond
    if us == 0:
        return base + "Z"
    if us % 1000 == 0:
        return f"{base}.{us // 1000:03d}Z"
    return f"{base}.{us:06d}Z"


def to_json_value(value):
    """One DuckDB value as a JSON-serialisable Python value."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return value
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, _dt.datetime):
        return time_text(value)
    if isinstance(value, _dt.date):
        return value.isoformat()
    if isinstance(value, _dt.time):
        return value.isoformat()
    if isinstance(value, _dt.timedelta):
        seconds = value.total_seconds()
        return int(seconds) if seconds == int(seconds) else seconds
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, dict):
        return {str(k): to_json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json_value(v) for v in value]
    return str(value)


_PLAIN = frozenset({"VARCHAR", "BOOLEAN", "TINYINT", "SMALLINT", "INTEGER", "BIGINT",
                    "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT", "HUGEINT", "UHUGEINT"})
"""Types whose Python values are already JSON values: their columns skip conversion."""


# --- the query ----------------------------------------------------------------------------

def check_read_only(sql: str) -> None:
    """Raises unless ``sql`` is exactly one SELECT statement, as DuckDB's parser sees it."""
    if not sql or not sql.strip():
        raise LedgerSqlError("sql-error", "empty query: send one SELECT statement")
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise LedgerSqlError("sql-error", _clean(exc)) from None
    if len(statements) == 0:
        raise LedgerSqlError("sql-error", "empty query: send one SELECT statement")
    if len(statements) > 1:
        raise LedgerSqlError("multiple-statements",
                             f"{len(statements)} statements found; send exactly one SELECT "
                             "(remove the extra ';'-separated statements)")
    kind = statements[0].type
    if kind != duckdb.StatementType.SELECT:
        name = getattr(kind, "name", str(kind))
        raise LedgerSqlError("not-read-only",
                             f"only SELECT queries may run on the ledger; this statement is "
                             f"{name} (the ledger is read-only for every role)")


def _clean(exc: BaseException) -> str:
    """DuckDB's message without its error-class prefix noise, on one line where possible."""
    text = str(exc).strip()
    return text or type(exc).__name__


def run_readonly(conn, sql: str, limit: int = 10000, timeout_s: float = 10.0,
                 max_bytes: int = MAX_BYTES) -> SqlResult:
    """Runs one read-only SELECT on ``conn`` (use a cursor of its own: the query runs in its
    own transaction, which must not already be open on it) and returns at most ``limit``
    rows. Raises :class:`LedgerSqlError`."""
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise LedgerSqlError("sql-error", f"limit must be a whole number >= 1, found {limit!r}")
    if limit > MAX_LIMIT:
        raise LedgerSqlError("too-large", f"limit {limit} is above the maximum of {MAX_LIMIT} "
                                          "rows; aggregate in SQL or use `kliqued ledger export`")
    check_read_only(sql)

    state = {"done": False, "fired": False}
    lock = threading.Lock()

    def on_timeout() -> None:
        with lock:
            if not state["done"]:
                state["fired"] = True
                conn.interrupt()

    started = time.perf_counter()
    conn.execute("BEGIN TRANSACTION READ ONLY")
    timer = threading.Timer(timeout_s, on_timeout)
    timer.daemon = True
    timer.start()
    try:
        try:
            conn.execute(sql)
            description = conn.description or []
            fetched = conn.fetchmany(limit + 1)
        finally:
            with lock:
                state["done"] = True
            timer.cancel()
    except duckdb.InterruptException:
        raise LedgerSqlError("timeout", f"the query ran longer than {timeout_s:g} s and was "
                                        "stopped; narrow it (a WHERE on start_at) or aggregate "
                                        "more") from None
    except duckdb.PermissionException as exc:
        first = _clean(exc).splitlines()[0]
        raise LedgerSqlError("sql-error", "file and network access is disabled on the ledger: "
                                          f"query its tables and views only ({first})") from None
    except duckdb.Error as exc:
        if state["fired"]:
            raise LedgerSqlError("timeout", f"the query ran longer than {timeout_s:g} s and "
                                            "was stopped") from None
        raise LedgerSqlError("sql-error", _clean(exc)) from None
    finally:
        try:
            conn.execute("ROLLBACK")
        except duckdb.Error:
            pass

    truncated = len(fetched) > limit
    if truncated:
        fetched = fetched[:limit]
    columns = [d[0] for d in description]
    types = [str(d[1]) for d in description]
    convert = [t not in _PLAIN for t in types]
    rows: list[list] = []
    approx = 0
    for i, raw in enumerate(fetched):
        row = [to_json_value(v) if c else v for v, c in zip(raw, convert)]
        rows.append(row)
        if i % 64 == 0:  # estimate the JSON size from a sample of the rows
            approx += 64 * len(json.dumps(row, default=str))
            if approx > max_bytes:
                raise LedgerSqlError(
                    "too-large", f"the result is larger than about {max_bytes // 2**20} MiB; "
                                 "select fewer columns or rows, aggregate, or use `kliqued "
                                 "ledger export`")
    elapsed = round((time.perf_counter() - started) * 1000, 1)
    return SqlResult(columns, types, rows, truncated, elapsed)
