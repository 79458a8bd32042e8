"""Finance's read-only SQL on PostgreSQL (``kliqued serve --db postgresql://...``).

On DuckDB the sandbox (:mod:`.sandbox`) is an allowlist the daemon checks, because DuckDB has
no privileges. PostgreSQL has them, so here the database itself enforces what finance may do:

- the query runs on a connection logged in as a role of its own (``klique_finance`` unless
  configured: :mod:`kliqued.daemon.pgreader`), which may ``SELECT`` the ledger's relations
  (:data:`.sandbox.RELATIONS`) and nothing else: not ``events``, ``tokens`` or
  ``klique_schema``, not the internal monthly aggregate; and whose transactions are read-only
  by default (``default_transaction_read_only``);
- inside ``BEGIN TRANSACTION READ ONLY``, always rolled back, with ``statement_timeout`` as
  the deadline;
- as a server-side cursor (``DECLARE ... CURSOR FOR`` takes exactly one SELECT or VALUES, and
  no data-modifying WITH), fetched in growing chunks under the same row and byte caps as on
  DuckDB (:func:`.sql._fetch`), so a huge answer never crosses the network whole.

Errors keep DuckDB's codes (:data:`.sql.CODES`), and ``unavailable`` when the database
cannot be reached.
"""

from __future__ import annotations

import re
import time

import psycopg
from psycopg import errors as pgerrors

from . import sandbox
from .sql import MAX_BYTES, LedgerSqlError, SqlResult, _fetch, check_limit, timeout_error

_COMMANDS = frozenset({
    "insert", "update", "delete", "merge", "create", "drop", "alter", "truncate", "grant",
    "revoke", "copy", "call", "do", "set", "reset", "begin", "start", "commit", "rollback",
    "end", "abort", "savepoint", "release", "prepare", "execute", "deallocate", "vacuum",
    "analyze", "cluster", "reindex", "refresh", "lock", "listen", "notify", "unlisten",
    "discard", "load", "checkpoint", "comment", "security", "import", "declare", "fetch",
    "move", "close", "explain", "show"})
"""First words of PostgreSQL statements other than a query, to say "not read-only"."""
_COMMENTS = re.compile(r"(--[^\n]*|/\*.*?\*/)", re.S)


def _first_word(sql: str) -> str:
    """The query's first word, past comments: only to word a refusal, never to allow one."""
    text = _COMMENTS.sub(" ", sql).strip()
    match = re.match(r"\(|[A-Za-z_]+", text)
    return match.group(0).lower() if match else ""


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def run_readonly(conn: psycopg.Connection, sql: str, limit: int = 10000,
                 timeout_s: float = 10.0, max_bytes: int = MAX_BYTES,
                 deadline: float | None = None) -> SqlResult:
    """Runs one read-only query on ``conn`` (autocommit, logged in as the finance role; no
    transaction open) and returns at most ``limit`` rows (``truncated`` when there were
    more) whose JSON takes at most ``max_bytes``; stopped at ``deadline``
    (``time.monotonic()``; default now + ``timeout_s``). Raises :class:`LedgerSqlError`."""
    check_limit(limit)
    if not sql or not sql.strip():
        raise LedgerSqlError("sql-error", "empty query: send one SELECT statement")
    if deadline is None:
        deadline = time.monotonic() + timeout_s
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise timeout_error(timeout_s, queued=True)
    started = time.perf_counter()
    try:
        conn.execute("BEGIN TRANSACTION READ ONLY")
        try:
            conn.execute(f"SET LOCAL statement_timeout = {max(1, int(remaining * 1000))}")
            with conn.cursor(name="ledger_sql") as cur:
                cur.itersize = 1
                cur.execute(sql.strip().rstrip(";"))
                description = cur.description or []
                types = [d.type_display for d in description]
                rows, truncated = _fetch(cur, types, limit, max_bytes, deadline, timeout_s)
        finally:
            if not conn.closed:
                try:
                    conn.execute("ROLLBACK")
                except psycopg.Error:
                    pass
    except LedgerSqlError:
        raise
    except pgerrors.QueryCanceled:
        raise timeout_error(timeout_s) from None
    except pgerrors.InsufficientPrivilege as exc:
        raise LedgerSqlError("not-allowed", f"{_first_line(exc)}: ledger SQL may read only "
                                            f"{sandbox.allowed_text()} (docs/ledger.md)") from None
    except pgerrors.ReadOnlySqlTransaction:
        raise _not_read_only(sql) from None
    except pgerrors.SyntaxError as exc:
        text = _first_line(exc)
        if "multiple commands" in text:
            raise LedgerSqlError("multiple-statements",
                                 "more than one statement found; send exactly one SELECT "
                                 "(remove the extra ';'-separated statements)") from None
        if _first_word(sql) in _COMMANDS:
            raise _not_read_only(sql) from None
        raise LedgerSqlError("sql-error", text) from None
    except pgerrors.FeatureNotSupported as exc:
        if _first_word(sql) in _COMMANDS or "data-modifying" in str(exc):
            raise _not_read_only(sql) from None
        raise LedgerSqlError("sql-error", _first_line(exc)) from None
    except RecursionError:
        raise LedgerSqlError("sql-error", "a value of the answer is nested too deeply for "
                                          "ledger SQL; flatten it") from None
    except psycopg.OperationalError as exc:
        raise LedgerSqlError("unavailable", f"the ledger's database cannot be reached: "
                                            f"{_first_line(exc)}") from None
    except psycopg.Error as exc:
        raise LedgerSqlError("sql-error", _first_line(exc)) from None
    elapsed = round((time.perf_counter() - started) * 1000, 1)
    return SqlResult([d.name for d in description], types, rows, truncated, elapsed)


def _not_read_only(sql: str) -> LedgerSqlError:
    word = _first_word(sql).upper() or "not a query"
    return LedgerSqlError("not-read-only", f"only SELECT queries may run on the ledger; this "
                                           f"statement is {word} (the ledger is read-only for "
                                           "every role)")
