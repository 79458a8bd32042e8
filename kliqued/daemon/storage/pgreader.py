"""Finance's SQL on PostgreSQL: the read-only role and the connections its queries run on.

The role (``klique_finance`` unless ``--ledger-role`` names another) may log in, may
``SELECT`` the ledger's relations (``kliqued.ledger.sandbox.RELATIONS``: the ledger's tables
and documented views) and nothing else (PostgreSQL grants no table to a role by default, so
``events``, ``tokens``, ``klique_schema`` and the internal aggregates stay closed), and its
transactions are read-only by default. :func:`grant` sets this up at every start, on the
primary (a streaming replica gets the same catalog); creating the role needs kliqued's role
to have ``CREATEROLE``, and without it the administrator creates it once (docs/ha.md).

The queries run on ``--ledger-replica`` when given (a streaming replica: a heavy query never
touches the writer), else on the primary, always logged in as the role: the connection
string is ``--db``'s (or the replica's) with its user replaced, so a password comes from
``~/.pgpass`` or ``PGPASSWORD`` for that user, never from the daemon's own login.

PostgreSQL has no memory limit per query, so the role also gets the bounds it does have
(:data:`kliqued.ledger.pgsql.ROLE_LIMITS`): ``work_mem`` and ``hash_mem_multiplier`` (a sort
or hash past them spills to disk) and ``temp_file_limit`` (what spills may take). The first
two each query sets again for itself, since setting them on a role needs ``CREATEROLE``;
``temp_file_limit`` only a superuser may set, so without one the start logs the command for
the administrator (docs/ha.md).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, TypeVar

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from kliqued.ledger import sandbox
from kliqued.ledger.pgsql import ROLE_LIMITS
from kliqued.ledger.sql import LedgerSqlError

from kliqued.daemon.storage.pglog import safe_label

log = logging.getLogger(__name__)

ROLE = "klique_finance"

T = TypeVar("T")

FEED = ("ledger_feed",)
"""Beside the ledger's relations: the billing feed's numbering, which the feed's pulls read
(``kliqued.ledger.feed``; the intervals' ids in closing order, nothing more)."""


def grant(
    conn: psycopg.Connection, role: str = ROLE, limits: tuple[tuple[str, str], ...] = ROLE_LIMITS
) -> str | None:
    """Makes ``role`` finance's read-only role with the settings ``limits`` (see the module's
    docstring); returns a warning when it cannot (the role is missing and kliqued may not
    create it or set a limit; another daemon granting at the same moment), None when
    done."""
    try:
        return _grant(conn, role, limits)
    except psycopg.Error as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return f"could not grant finance's role {role} its reads ({first}): docs/ha.md"


def _grant(conn: psycopg.Connection, role: str, limits: tuple[tuple[str, str], ...]) -> str | None:
    ident = sql.Identifier(role)
    with conn.transaction():
        exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role]).fetchone()
    if not exists:
        try:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(ident))
        except psycopg.errors.InsufficientPrivilege:
            return (
                f"finance's SQL needs the role {role}, and kliqued's role may not create "
                f"it: as PostgreSQL's admin, CREATE ROLE {role} LOGIN PASSWORD '...'; "
                f"until then ledger SQL answers that it cannot log in (docs/ha.md)"
            )
        except psycopg.errors.DuplicateObject:
            pass  # another daemon made it meanwhile
    with conn.transaction():
        try:
            with conn.transaction():
                conn.execute(
                    sql.SQL("ALTER ROLE {} SET default_transaction_read_only = on").format(ident)
                )
        except psycopg.errors.InsufficientPrivilege:
            log.info(
                "cannot ALTER ROLE %s (no CREATEROLE): its queries are read-only by their "
                "own transactions",
                role,
            )
        conn.execute(sql.SQL("REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {}").format(ident))
        conn.execute(sql.SQL("REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM {}").format(ident))
        conn.execute(
            sql.SQL("GRANT SELECT ON {} TO {}").format(
                sql.SQL(", ").join(sql.Identifier(r) for r in (*sandbox.RELATIONS, *FEED)), ident
            )
        )
    return _limit(conn, role, limits)


def _limit(conn: psycopg.Connection, role: str, limits: tuple[tuple[str, str], ...]) -> str | None:
    """Sets ``limits`` on ``role`` (its sessions' defaults); returns what the administrator
    should run for those kliqued's role may not set, or None."""
    refused = []
    for name, value in limits:
        statement = sql.SQL("ALTER ROLE {} SET {} = {}").format(
            sql.Identifier(role), sql.SQL(name), sql.Literal(value)
        )
        try:
            with conn.transaction():
                conn.execute(statement)
        except psycopg.errors.InsufficientPrivilege:
            refused.append(statement.as_string(conn))
    if not refused:
        return None
    return (
        f"kliqued's role may not set all the bounds of finance's queries on {role} "
        f"(temp_file_limit needs a superuser): as PostgreSQL's superuser, run "
        f"{'; '.join(refused)}; until then a query's spill to disk is bounded by its "
        f"deadline only (docs/ha.md)"
    )


def reader_url(url: str, role: str = ROLE) -> str:
    """``url`` (``--db`` or ``--ledger-replica``) logged in as ``role``."""
    params = conninfo_to_dict(url)
    params.pop("password", None)  # the daemon's own password is not the role's
    params["user"] = role
    params["application_name"] = "kliqued-ledger-sql"
    return make_conninfo("", **params)


class Readers:
    """Finance's connections, one per query thread, opened when first needed and again after
    a failure (a replica restarted). A ``QueryPool``'s handles."""

    def __init__(self, url: str, role: str = ROLE) -> None:
        self.url = reader_url(url, role)
        self.label = f"{safe_label(self.url)}"
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: set[psycopg.Connection] = set()

    def open(self) -> psycopg.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        try:
            conn = psycopg.connect(self.url, autocommit=True, connect_timeout=5)
        except psycopg.Error as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise LedgerSqlError(
                "unavailable",
                f"the ledger's database {self.label} cannot be used for ledger SQL: {first}",
            ) from None
        self._local.conn = conn
        with self._lock:
            self._all.add(conn)
        return conn

    def stream(self) -> psycopg.Connection:
        """A connection of its own whose transactions are read-only (not autocommit: its
        server-side cursors live in its one transaction): for an export streamed over many
        calls, from any thread; closing it ends everything."""
        try:
            conn = psycopg.connect(self.url, connect_timeout=5)
        except psycopg.Error as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise LedgerSqlError(
                "unavailable",
                f"the ledger's database {self.label} cannot be used for the export: {first}",
            ) from None
        conn.read_only = True
        return conn

    def call(self, fn: Callable[[Any], T], handle: Any) -> T:
        """``fn(handle)``; a connection lost meanwhile (the replica restarted) is the 503
        ``unavailable`` rather than a driver's traceback."""
        try:
            return fn(handle)
        except psycopg.OperationalError as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise LedgerSqlError(
                "unavailable",
                f"the ledger's database {self.label} was lost during the read: {first}",
            ) from None

    def release(self, handle: Any) -> None:
        """Kept for the thread's next query; a broken one is dropped."""
        if handle.broken:
            with self._lock:
                self._all.discard(handle)
            handle.close()

    def interrupt(self, handle: Any) -> None:
        try:
            handle.cancel()
        except psycopg.Error:
            pass

    def close(self) -> None:
        with self._lock:
            for conn in self._all:
                conn.close()
            self._all.clear()
