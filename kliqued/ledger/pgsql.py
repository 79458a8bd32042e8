"""Finance's read-only SQL on PostgreSQL (``kliqued serve --db postgresql://...``).

On DuckDB the sandbox (:mod:`.sandbox`) is an allowlist the daemon checks, because DuckDB has
no privileges. PostgreSQL has them, so here the database itself enforces what finance may do:

- the query runs on a connection logged in as a role of its own (``klique_finance`` unless
  configured: :mod:`kliqued.daemon.storage.pgreader`), which may ``SELECT`` the ledger's relations
  (:data:`.sandbox.RELATIONS`) and nothing else: not ``events``, ``tokens`` or
  ``klique_schema``, not the internal monthly aggregate; and whose transactions are read-only
  by default (``default_transaction_read_only``);
- inside ``BEGIN TRANSACTION READ ONLY``, always rolled back, with ``statement_timeout`` as
  the deadline;
- as a server-side cursor (``DECLARE ... CURSOR FOR`` takes exactly one SELECT or VALUES, and
  no data-modifying WITH), fetched in growing chunks under the same row and byte caps as on
  DuckDB (:func:`.sql._fetch`), so a huge answer never crosses the network whole.

PostgreSQL bounds a query's memory only piece by piece, and the role's settings
(:data:`ROLE_LIMITS`, set by :mod:`kliqued.daemon.storage.pgreader`) use each piece: a sort or hash
table spills to disk past ``work_mem`` (times ``hash_mem_multiplier``), the spill stops at
``temp_file_limit``, and a value stops at PostgreSQL's 1 GB cap (``repeat``, ``lpad``,
``string_agg``). Each query sets the two memory settings again (``SET LOCAL``), so they hold
where the role could not be altered. A query past a bound is refused as ``too-large``.

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

_COMMANDS = frozenset(
    {
        "insert",
        "update",
        "delete",
        "merge",
        "create",
        "drop",
        "alter",
        "truncate",
        "grant",
        "revoke",
        "copy",
        "call",
        "do",
        "set",
        "reset",
        "begin",
        "start",
        "commit",
        "rollback",
        "end",
        "abort",
        "savepoint",
        "release",
        "prepare",
        "execute",
        "deallocate",
        "vacuum",
        "analyze",
        "cluster",
        "reindex",
        "refresh",
        "lock",
        "listen",
        "notify",
        "unlisten",
        "discard",
        "load",
        "checkpoint",
        "comment",
        "security",
        "import",
        "declare",
        "fetch",
        "move",
        "close",
        "explain",
        "show",
    }
)
"""First words of PostgreSQL statements other than a query, to say "not read-only"."""
WORK_MEM = "16MB"
"""Per sort or hash of a finance query: the ledger's aggregates fit; more spills to disk."""
HASH_MEM_MULTIPLIER = "1"
"""A hash table may use ``work_mem`` (PostgreSQL 15's default doubles it)."""
TEMP_FILE_LIMIT = "1GB"
"""What a finance query may spill to disk in all (a superuser's setting: on the role)."""
ROLE_LIMITS: tuple[tuple[str, str], ...] = (
    ("work_mem", WORK_MEM),
    ("hash_mem_multiplier", HASH_MEM_MULTIPLIER),
    ("temp_file_limit", TEMP_FILE_LIMIT),
)
"""The finance role's settings, in the order they are set (the last needs a superuser)."""
_COMMENTS = re.compile(r"(--[^\n]*|/\*.*?\*/)", re.S)


def _first_word(sql: str) -> str:
    """The query's first word, past comments: only to word a refusal, never to allow one."""
    text = _COMMENTS.sub(" ", sql).strip()
    match = re.match(r"\(|[A-Za-z_]+", text)
    return match.group(0).lower() if match else ""


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def run_readonly(
    conn: psycopg.Connection,
    sql: str,
    limit: int = 10000,
    timeout_s: float = 10.0,
    max_bytes: int = MAX_BYTES,
    deadline: float | None = None,
) -> SqlResult:
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
            conn.execute(f"SET LOCAL work_mem = '{WORK_MEM}'")
            conn.execute(f"SET LOCAL hash_mem_multiplier = {HASH_MEM_MULTIPLIER}")
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
    except (pgerrors.ProgramLimitExceeded, pgerrors.OutOfMemory) as exc:
        raise LedgerSqlError(
            "too-large",
            f"{_first_line(exc)}: the query built a value or "
            "held more than PostgreSQL allows one query (a "
            "value is at most 1 GB); aggregate earlier, select "
            "fewer or shorter values, or add a WHERE",
        ) from None
    except pgerrors.ConfigurationLimitExceeded as exc:
        raise LedgerSqlError(
            "too-large",
            f"{_first_line(exc)}: the query spilled more to "
            "disk than a ledger query may (temp_file_limit "
            "of the finance role); add a WHERE or a LIMIT, or "
            "sort and group fewer rows",
        ) from None
    except pgerrors.InsufficientPrivilege as exc:
        raise LedgerSqlError(
            "not-allowed",
            f"{_first_line(exc)}: ledger SQL may read only "
            f"{sandbox.allowed_text()} (docs/ledger.md)",
        ) from None
    except pgerrors.ReadOnlySqlTransaction:
        raise _not_read_only(sql) from None
    except pgerrors.SyntaxError as exc:
        text = _first_line(exc)
        if "multiple commands" in text:
            raise LedgerSqlError(
                "multiple-statements",
                "more than one statement found; send exactly one SELECT "
                "(remove the extra ';'-separated statements)",
            ) from None
        if _first_word(sql) in _COMMANDS:
            raise _not_read_only(sql) from None
        raise LedgerSqlError("sql-error", text) from None
    except pgerrors.FeatureNotSupported as exc:
        if _first_word(sql) in _COMMANDS or "data-modifying" in str(exc):
            raise _not_read_only(sql) from None
        raise LedgerSqlError("sql-error", _first_line(exc)) from None
    except RecursionError:
        raise LedgerSqlError(
            "sql-error", "a value of the answer is nested too deeply for ledger SQL; flatten it"
        ) from None
    except psycopg.OperationalError as exc:
        raise LedgerSqlError(
            "unavailable", f"the ledger's database cannot be reached: {_first_line(exc)}"
        ) from None
    except psycopg.Error as exc:
        raise LedgerSqlError("sql-error", _first_line(exc)) from None
    elapsed = round((time.perf_counter() - started) * 1000, 1)
    return SqlResult([d.name for d in description], types, rows, truncated, elapsed)


def _not_read_only(sql: str) -> LedgerSqlError:
    word = _first_word(sql).upper() or "not a query"
    return LedgerSqlError(
        "not-read-only",
        f"only SELECT queries may run on the ledger; this "
        f"statement is {word} (the ledger is read-only for "
        "every role)",
    )
