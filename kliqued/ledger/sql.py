"""Finance's read-only SQL on the ledger.

Read-only by construction, not by pattern matching: DuckDB's own parser splits the text into
statements (``duckdb.extract_statements``); there must be exactly one and its type must be
SELECT. It then runs in its own ``BEGIN TRANSACTION READ ONLY`` (one consistent snapshot, and
DuckDB itself refuses any write) that is always rolled back, and a timer interrupts it at its
deadline. Its parse tree and plan may touch only the ledger's relations and side-effect-free
functions (``sandbox``): not the event log, not tokens, not the catalog. File and network
table functions fail because the daemon opens the database with
``enable_external_access = false``. The answer is capped exactly: ``limit`` rows (then
``truncated``) and ``max_bytes`` of JSON (then refused as ``too-large``).

Values come back JSON-ready: DECIMAL as text (exact: ``"1.850000"``), timestamps as RFC 3339
UTC text (``2026-01-01T00:00:00Z``, with milliseconds when present), dates as ``2026-01-01``,
intervals as seconds, BLOBs as hex, NaN and infinities as text, lists/structs/maps recursively.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import time
import uuid
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Sequence, Union

import duckdb

from klique_util.excerpt import excerpt

from . import growth, lending, sandbox, scope
from .db import Fetching, scalar
from .watchdog import Watchdog

JsonValue = Union[None, bool, int, float, str, list[Any], dict[str, Any]]
"""A value of the daemon's JSON answer (:func:`to_json_value`)."""

MAX_LIMIT = 100_000
"""The most rows one query may return; larger results belong in ``kliqued ledger export``."""

MAX_BYTES = 32 * 2**20
"""The most bytes the rows of one answer may take as JSON (counted exactly), whatever their
count."""

CODES = (
    "not-read-only",
    "multiple-statements",
    "not-allowed",
    "sql-error",
    "timeout",
    "too-large",
    "unavailable",
)
"""``unavailable``: the database finance's SQL runs on (PostgreSQL, a replica) cannot be
reached (:mod:`.pgsql`)."""


class LedgerSqlError(Exception):
    """A query refused or failed; ``code`` is one of :data:`CODES`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def to_json(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message}}


@dataclass
class SqlResult:
    columns: list[str]
    types: list[str]
    rows: list[list[JsonValue]]
    truncated: bool
    elapsed_ms: float

    def to_json(self) -> dict[str, Any]:
        return {
            "columns": self.columns,
            "types": self.types,
            "rows": self.rows,
            "truncated": self.truncated,
            "elapsed_ms": self.elapsed_ms,
        }


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


def to_json_value(value: object) -> JsonValue:
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


_PLAIN = frozenset(
    {
        "VARCHAR",
        "BOOLEAN",
        "TINYINT",
        "SMALLINT",
        "INTEGER",
        "BIGINT",
        "UTINYINT",
        "USMALLINT",
        "UINTEGER",
        "UBIGINT",
        "HUGEINT",
        "UHUGEINT",
    }
)
"""Types whose Python values are already JSON values: their columns skip conversion."""


# --- the query ----------------------------------------------------------------------------


def check_read_only(sql: str) -> str:
    """Raises unless ``sql`` is exactly one SELECT statement, as DuckDB's parser sees it;
    returns that statement's text."""
    if not sql or not sql.strip():
        raise LedgerSqlError("sql-error", "empty query: send one SELECT statement")
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise LedgerSqlError("sql-error", _clean(exc)) from None
    if len(statements) == 0:
        raise LedgerSqlError("sql-error", "empty query: send one SELECT statement")
    if len(statements) > 1:
        raise LedgerSqlError(
            "multiple-statements",
            f"{len(statements)} statements found; send exactly one SELECT "
            "(remove the extra ';'-separated statements)",
        )
    kind = statements[0].type
    if kind != duckdb.StatementType.SELECT:
        name = getattr(kind, "name", str(kind))
        raise LedgerSqlError(
            "not-read-only",
            f"only SELECT queries may run on the ledger; this statement is "
            f"{name} (the ledger is read-only for every role)",
        )
    return statements[0].query


def _clean(exc: BaseException) -> str:
    """DuckDB's message without its error-class prefix noise, on one line where possible."""
    text = str(exc).strip()
    return text or type(exc).__name__


def json_size(value: list[Any]) -> int:
    """The bytes ``value`` (a row, or a list of rows) takes in the daemon's JSON answer
    (compact, UTF-8): what the byte cap counts, exactly."""
    return len(
        json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str).encode("utf-8")
    )


LAST_CHUNK = 2048
"""The most rows fetched at once. Fetches start at one row and double, but never ask for
many more rows than the bytes left could hold at the rows' average size so far: little is
held before its size is known, and a large answer of small rows costs few calls."""


def timeout_error(limit_s: float, queued: bool = False) -> LedgerSqlError:
    """The error of a query past its deadline: ``queued`` when it never got to run."""
    if queued:
        return LedgerSqlError(
            "timeout",
            f"the query waited for a free query slot longer than its "
            f"time limit of {limit_s:g} s (other ledger queries "
            "were running); try again, or narrow them",
        )
    return LedgerSqlError(
        "timeout",
        f"the query ran longer than {limit_s:g} s and was stopped; "
        "narrow it (a WHERE on start_at) or aggregate more",
    )


def _too_large(max_bytes: int) -> LedgerSqlError:
    size = f"{max_bytes / 2**20:g} MiB" if max_bytes >= 2**20 else f"{max_bytes} bytes"
    return LedgerSqlError(
        "too-large",
        f"the answer is larger than {size}; add a LIMIT, select "
        "fewer columns, aggregate, or use `kliqued ledger export`",
    )


def out_of_memory(conn: duckdb.DuckDBPyConnection) -> LedgerSqlError:
    """The error of a query that needed more memory than the database may use (DuckDB's
    ``memory_limit``, ``kliqued serve --db-memory``): refused as ``too-large``."""
    try:
        conn.execute("ROLLBACK")  # the failed transaction reads nothing more
        limit = scalar(conn, "SELECT current_setting('memory_limit')")
    except duckdb.Error:
        limit = "its limit"
    return LedgerSqlError(
        "too-large",
        f"the query needed more memory than the ledger's "
        f"database may use ({limit}); aggregate earlier, "
        "select fewer or shorter values, or add a WHERE",
    )


def check_limit(limit: object) -> None:
    """Raises unless ``limit`` is a row count a query may ask for."""
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise LedgerSqlError(
            "sql-error", f"limit must be a whole number >= 1, found {excerpt(limit)}"
        )
    if limit > MAX_LIMIT:
        raise LedgerSqlError(
            "too-large",
            f"limit {limit} is above the maximum of {MAX_LIMIT} "
            "rows; aggregate in SQL or use `kliqued ledger export`",
        )


def run_readonly(
    conn: duckdb.DuckDBPyConnection,
    sql: str,
    limit: int = 10000,
    timeout_s: float = 10.0,
    max_bytes: int = MAX_BYTES,
    deadline: float | None = None,
    groups: Sequence[str] | None = None,
    pieces: str | None = None,
) -> SqlResult:
    """Runs one read-only SELECT on ``conn`` (use a cursor of its own: the query runs in its
    own transaction, which must not already be open on it) and returns at most ``limit``
    rows (``truncated`` when there were more) whose JSON takes at most ``max_bytes``.

    The query may read only the ledger's relations (:mod:`kliqued.ledger.sandbox`). It is
    interrupted at ``deadline`` (``time.monotonic()``; default: now + ``timeout_s``): a caller
    that queued the query passes the deadline counted from the request's arrival, so waiting
    counts against the limit. ``groups``: the query sees only the rows of these groups'
    subtrees (a group admin's, :mod:`kliqued.ledger.scope`); None: the whole ledger.
    ``pieces``: the server's own queries of one month derive borrowing and lending from that
    month's pieces only (:func:`kliqued.ledger.lending.month_pieces`), not the whole ledger's.
    Raises :class:`LedgerSqlError`."""
    check_limit(limit)
    query = check_read_only(sql)
    if deadline is None:
        deadline = time.monotonic() + timeout_s
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise timeout_error(timeout_s, queued=True)

    started = time.perf_counter()
    conn.execute("BEGIN TRANSACTION READ ONLY")
    watchdog = Watchdog(conn.interrupt, deadline).start()
    try:
        try:
            conn.execute(_check_sandbox(conn, query, groups, pieces))
            description = conn.description or []
            types = [str(d[1]) for d in description]
            rows, truncated = _fetch(conn, types, limit, max_bytes, deadline, timeout_s)
        finally:
            watchdog.stop()
    except sandbox.NotAllowed as exc:
        raise LedgerSqlError("not-allowed", str(exc)) from None
    except RecursionError:
        # a parse tree, plan or value nested deeper than Python walks (DuckDB's own limit on
        # expression depth is 1,000; its JSON tree is deeper than that)
        raise LedgerSqlError(
            "sql-error",
            "the query or a value of its answer is nested too deeply for ledger SQL; flatten it",
        ) from None
    except duckdb.InterruptException:
        raise timeout_error(timeout_s) from None
    except duckdb.OutOfMemoryException:
        raise out_of_memory(conn) from None
    except duckdb.PermissionException as exc:
        first = _clean(exc).splitlines()[0]
        raise LedgerSqlError(
            "sql-error",
            "file and network access is disabled on the ledger: "
            f"query its tables and views only ({first})",
        ) from None
    except duckdb.Error as exc:
        if watchdog.fired:
            raise timeout_error(timeout_s) from None
        message = _clean(exc)
        raise LedgerSqlError(
            "sql-error", message if groups is None else scope.relocate(message)
        ) from None
    finally:
        try:
            conn.execute("ROLLBACK")
        except duckdb.Error:
            pass
    elapsed = round((time.perf_counter() - started) * 1000, 1)
    return SqlResult([d[0] for d in description], types, rows, truncated, elapsed)


def _check_sandbox(
    conn: duckdb.DuckDBPyConnection,
    query: str,
    groups: Sequence[str] | None = None,
    pieces: str | None = None,
) -> str:
    """The query's parse tree and plan stay inside the ledger (``sandbox``); returns the SQL
    to run: the query, or for ``groups`` the query over their subtrees' rows only (and with
    ``pieces``, over those lending pieces: :func:`kliqued.ledger.scope.scoped`)."""
    database = str(scalar(conn, "SELECT current_database()"))
    tree = sandbox.parsed(conn, query)
    sandbox.check_tree(tree, database, qualified=groups is None and pieces is None)
    growth.check(tree)
    if groups is not None or pieces is not None:
        query = scope.scoped(query, groups, pieces)
    plan = conn.execute("EXPLAIN (FORMAT json) " + query).fetchall()
    temp = () if pieces is None else lending.temp_tables(pieces)
    for _key, text in plan:
        sandbox.check_plan(text, database, temp)
    return query


def _fetch(
    conn: Fetching, types: list[str], limit: int, max_bytes: int, deadline: float, timeout_s: float
) -> tuple[list[list[JsonValue]], bool]:
    """At most ``limit`` rows, converted, counting their exact JSON bytes as they come:
    refused as soon as the answer passes ``max_bytes``, so no more than one chunk beyond the
    cap is ever held."""
    convert = [t not in _PLAIN for t in types]
    rows: list[list[JsonValue]] = []
    size = 2  # the rows' enclosing []
    chunk = 1
    while True:
        want = min(chunk, limit - len(rows))
        fetched = conn.fetchmany(want + 1 if want == limit - len(rows) else want)
        if not fetched:
            return rows, False
        more = len(rows) + len(fetched) > limit
        batch: list[list[JsonValue]] = [
            [to_json_value(v) if c else v for v, c in zip(raw, convert)]
            for raw in fetched[: limit - len(rows)]
        ]
        if batch:
            # the batch's rows as the answer will hold them: the same bytes as each row's
            # json_size plus the commas between them
            size += json_size(batch) - 2 + (1 if rows else 0)
            if size > max_bytes:
                raise _too_large(max_bytes)
            rows.extend(batch)
        if more:
            return rows, True
        if time.monotonic() >= deadline:
            raise timeout_error(timeout_s)
        average = max(1, (size - 2) // len(rows))
        chunk = max(1, min(chunk * 2, LAST_CHUNK, (max_bytes - size) // average + 1))
