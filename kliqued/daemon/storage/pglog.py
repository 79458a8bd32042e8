"""The event log and tokens in PostgreSQL (``kliqued serve --db postgresql://...``), with
psycopg 3.

Same semantics as the DuckDB log (eventlog.DuckLog): one transaction per batch, the events
in ``seq`` order, the tokens keyed-hashed. The schema is versioned: :data:`MIGRATIONS` are
applied in order at start, each in its own transaction recorded in ``klique_schema``, under
an advisory lock so that two daemons starting together do not both apply one; a database
migrated by a newer kliqued is refused rather than written with an older schema. Events go
in by ``COPY`` (one round trip per batch).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Sequence

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from kliqued.ledger import pgschema, pgwriter
from kliqued.ledger.ops import LedgerWrite

from kliqued.daemon.errors import DaemonError
from kliqued.daemon.storage.eventlog import (
    INSERT_TOKEN,
    TOKEN_COLUMNS,
    UPDATABLE,
    TokenInsert,
    TokenWrite,
    token_params,
)
from kliqued.daemon.events import COLUMNS
from kliqued.daemon.errors import Deposed

FENCE_SQL = "SELECT epoch FROM klique_leader WHERE id = 1 FOR SHARE"
"""Run first in every write transaction of the leader: the epoch to compare with its own
(the lease, ha/lease.py, keeps the row; here because the log runs it, and storage imports
no room above it)."""

MIGRATIONS: list[tuple[int, str, list[str]]] = [
    (
        1,
        "events and tokens",
        [
            """CREATE TABLE events (
            seq BIGINT PRIMARY KEY, at_ms BIGINT NOT NULL, kind TEXT NOT NULL, task TEXT,
            actor TEXT, revision TEXT, grp TEXT, usr TEXT, data JSON)""",
            "CREATE INDEX events_task ON events (task) WHERE task IS NOT NULL",
            "CREATE INDEX events_kind ON events (kind)",
            """CREATE TABLE tokens (
            id TEXT PRIMARY KEY, hash TEXT NOT NULL UNIQUE, principal TEXT NOT NULL,
            name TEXT, created_at_ms BIGINT NOT NULL, created_by TEXT,
            revoked_at_ms BIGINT, expires_at_ms BIGINT)""",
        ],
    ),
    (
        2,
        "the leader's lease",
        [
            """CREATE TABLE klique_leader (
            id INT PRIMARY KEY CHECK (id = 1), epoch BIGINT NOT NULL, holder TEXT, url TEXT,
            expires_at TIMESTAMPTZ NOT NULL, acquired_at TIMESTAMPTZ)""",
            "INSERT INTO klique_leader (id, epoch, expires_at) VALUES (1, 0, '-infinity')",
        ],
    ),
    (3, "ledger tables", pgschema.TABLES),
    (4, "ledger views", pgschema.view_statements(until=pgschema.LOST_WORK_VIEW)),
    (
        5,
        "lost work: preemptions",
        [pgschema.lost.PG_TABLE, pgschema.view_create(pgschema.LOST_WORK_VIEW)],
    ),
]
"""(version, what it does, statements): append only; a released migration never changes."""

LOCK_KEY = 0x6B6C6971  # "kliq": the advisory lock the migrations run under
GID_PREFIX = "kliqued-"
"""Prepared transactions an older kliqued left (``kliqued-...``): committed at start."""


class PgError(DaemonError):
    """PostgreSQL cannot be used: unreachable, refused, or migrated by a newer kliqued."""


def safe_label(url: str) -> str:
    """The URL without its password, for logs and messages."""
    try:
        parts = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "postgresql://(unparsable URL)"
    host = parts.get("host", "")
    where = f"{host}:{parts['port']}" if parts.get("port") else host
    return f"postgresql://{parts.get('user', '')}@{where}/{parts.get('dbname', '')}"


class PgLog:
    """The log on one PostgreSQL connection, used by the Store's write thread (writes,
    start-up reads); reads elsewhere would open their own."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.label = safe_label(url)
        try:
            self.conn = psycopg.connect(url, autocommit=True, application_name="kliqued")
        except psycopg.Error as exc:
            raise PgError(f"cannot connect to {self.label}: {_first_line(exc)}") from None
        self.fence: int | None = None
        """The epoch of the leader's lease (lease.py): ``kliqued serve`` sets it when it
        takes the lease, and every batch then checks it under the row's share lock first.
        None only for tools and tests that open the log without a lease."""

    # ------------------------------------------------------------------ schema
    def migrate(self) -> None:
        """Raises :class:`PgError` naming the migration that cannot be applied (the role may
        not create tables, a table of that name exists already), never a driver traceback."""
        try:
            self._migrate()
        except psycopg.Error as exc:
            hint = ""
            if isinstance(exc, psycopg.errors.InsufficientPrivilege):
                hint = (
                    " (kliqued's role must be able to create tables: make it the "
                    "database's owner, createdb -O ROLE, or GRANT CREATE ON SCHEMA public)"
                )
            raise PgError(
                f"cannot bring the schema of {self.label} up to date: "
                f"{self._applying}: {_first_line(exc)}{hint}"
            ) from None

    _applying = "the version table klique_schema"

    def _migrate(self) -> None:
        with self.conn.transaction():
            self.conn.execute("SELECT pg_advisory_xact_lock(%s)", [LOCK_KEY])
            self._applying = "the version table klique_schema"
            self.conn.execute(
                "CREATE TABLE IF NOT EXISTS klique_schema (version INT PRIMARY KEY, "
                "name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
            )
            row = self.conn.execute("SELECT max(version) FROM klique_schema").fetchone()
            have = int(row[0]) if row and row[0] is not None else 0
            known = MIGRATIONS[-1][0]
            if have > known:
                raise PgError(
                    f"{self.label} has schema version {have}, newer than this kliqued knows "
                    f"({known}): run the kliqued that migrated it, or a newer one"
                )
            for version, name, statements in MIGRATIONS:
                if version <= have:
                    continue
                self._applying = f"migration {version} ({name})"
                for stmt in statements:
                    self.conn.execute(stmt)
                self.conn.execute(
                    "INSERT INTO klique_schema (version, name) VALUES (%s, %s)", [version, name]
                )

    def schema_version(self) -> int:
        row = self.conn.execute("SELECT max(version) FROM klique_schema").fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    # ------------------------------------------------------------------ reads
    def last_seq(self) -> int:
        row = self.conn.execute("SELECT max(seq) FROM events").fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def read_events(self, after: int = 0, chunk: int = 20_000) -> Iterator[tuple]:
        # a server-side cursor: a long log streams in chunks, not all in memory at once
        with self.conn.transaction(), self.conn.cursor(name="klique_replay") as cur:
            cur.itersize = chunk
            cur.execute(
                f"SELECT {', '.join(COLUMNS[:-1])}, data::text FROM events "
                f"WHERE seq > %s ORDER BY seq",
                [after],
            )
            yield from cur

    def read_tokens(self) -> list[tuple]:
        return self.conn.execute(
            f"SELECT {', '.join(TOKEN_COLUMNS)} FROM tokens ORDER BY id"
        ).fetchall()

    # ------------------------------------------------------------------ writes
    def begin(self) -> None:
        self.conn.execute("BEGIN")

    def write(
        self, rows: list[tuple], tokens: list[TokenWrite], ledger: Sequence[LedgerWrite] = ()
    ) -> None:
        """Stages the batch's events, token writes and ledger writes (the ledger is in this
        database too: ``kliqued.ledger.pgwriter``). A value PostgreSQL refuses (a NUL in
        text, a number out of range, a key taken) is a ``ValueError``: the sequencer's sign
        that the batch's data, not the store, failed (as DuckDB's conversion and constraint
        errors are)."""
        try:
            self._write(rows, tokens, ledger)
        except (psycopg.DataError, psycopg.IntegrityError) as exc:
            raise ValueError(f"PostgreSQL refused the data: {_first_line(exc)}") from exc

    def _write(
        self, rows: list[tuple], tokens: list[TokenWrite], ledger: Sequence[LedgerWrite]
    ) -> None:
        with self.conn.cursor() as cur:
            if self.fence is not None:
                row = cur.execute(FENCE_SQL).fetchone()
                if row is None or int(row[0]) != self.fence:
                    raise Deposed(
                        f"this daemon's lease (epoch {self.fence}) is no longer the "
                        f"leader's (epoch {row[0] if row else None}): the batch is "
                        f"not written"
                    )
            if rows:
                with cur.copy(f"COPY events ({', '.join(COLUMNS)}) FROM STDIN") as copy:
                    for r in rows:
                        copy.write_row(r)
            for w in tokens:
                if isinstance(w, TokenInsert):
                    cur.execute(INSERT_TOKEN.format(p=", ".join(["%s"] * 7)), token_params(w))
                else:
                    assert w.column in UPDATABLE
                    cur.execute(f"UPDATE tokens SET {w.column} = %s WHERE id = %s", [w.value, w.id])
            for op in ledger:
                pgwriter.apply(cur, op)

    # ------------------------------------------------------------------ the ledger's seed
    SEED_TABLES = (
        "ledger",
        "prices",
        "cloud_nodes",
        "capacity",
        "reservations",
        "ledger_monthly",
        "ledger_monthly_pending",
        "ledger_feed",
        "preemptions",
    )
    """The ledger's tables, copied once from the DuckDB file of a deployment whose ledger
    was kept there before this database held one (:meth:`seed_ledger`)."""

    def ledger_empty(self) -> bool:
        row = self.conn.execute(
            "SELECT NOT EXISTS (SELECT 1 FROM ledger) AND NOT EXISTS (SELECT 1 FROM prices) "
            "AND NOT EXISTS (SELECT 1 FROM capacity) AND NOT EXISTS (SELECT 1 FROM cloud_nodes)"
        ).fetchone()
        return bool(row and row[0])

    def seed_ledger(self, read: Callable[[str, list[str]], Iterable[tuple]]) -> int:
        """Copies every table of :data:`SEED_TABLES` from ``read(table, columns)`` (rows in
        that column order) in one transaction, the feed's sequence continuing after it;
        returns the ledger rows copied. Only into an empty ledger (:meth:`ledger_empty`)."""
        copied = 0
        with self.conn.transaction(), self.conn.cursor() as cur:
            for table in self.SEED_TABLES:
                cur.execute(
                    "SELECT column_name FROM information_schema.columns WHERE "
                    "table_schema = current_schema() AND table_name = %s "
                    "ORDER BY ordinal_position",
                    [table],
                )
                columns = [r[0] for r in cur.fetchall()]
                quoted = ", ".join(f'"{c}"' for c in columns)
                with cur.copy(f"COPY {table} ({quoted}) FROM STDIN") as copy:
                    for row in read(table, columns):
                        copy.write_row(row)
                        copied += table == "ledger"
            cur.execute(
                "SELECT setval('ledger_feed_seq', coalesce(max(seq), 0) + 1, false) "
                "FROM ledger_feed"
            )
        return copied

    def ledger_fingerprint(self) -> tuple:
        """``store.FINGERPRINT`` of this ledger."""
        from kliqued.daemon.storage.store import FINGERPRINT

        row = self.conn.execute(FINGERPRINT).fetchone()
        return tuple(int(v) for v in row) if row else ()

    def read_table(self, table: str) -> tuple[list[str], Iterator[tuple]]:
        """A ledger table's columns and its rows (streamed by a server-side cursor): what
        fills a new local file's copy of the ledger (``Store._seed_ledger``)."""
        assert table in self.SEED_TABLES
        columns = [
            r[0]
            for r in self.conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = "
                "current_schema() AND table_name = %s ORDER BY ordinal_position",
                [table],
            )
        ]

        def rows() -> Iterator[tuple]:
            with self.conn.transaction(), self.conn.cursor(name=f"klique_{table}") as cur:
                cur.itersize = 20_000
                cur.execute(f"SELECT * FROM {table}")
                yield from cur

        return columns, rows()

    # ------------------------------------------------------------------ prepared batches
    def finish(self, gid: str, commit: bool) -> None:
        """``COMMIT PREPARED`` or ``ROLLBACK PREPARED`` of a batch an older kliqued left
        prepared (its two-phase commit with the DuckDB file, stopped between the phases)."""
        verb = "COMMIT PREPARED {}" if commit else "ROLLBACK PREPARED {}"
        self.conn.execute(sql.SQL(verb).format(sql.Literal(gid)))

    def pending(self) -> list[str]:
        """This database's prepared batches left by an older kliqued that stopped between
        its two phases (kliqued now commits each batch in one transaction)."""
        return [
            g
            for (g,) in self.conn.execute(
                "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s AND database = "
                "current_database() ORDER BY prepared",
                [GID_PREFIX + "%"],
            )
        ]

    def compact(self, sql: Callable[[str], str], params: list[Any]) -> int:
        """A transaction of its own, fenced as a batch is: a deposed leader deletes
        nothing (``Deposed``)."""
        with self.conn.transaction(), self.conn.cursor() as cur:
            if self.fence is not None:
                row = cur.execute(FENCE_SQL).fetchone()
                if row is None or int(row[0]) != self.fence:
                    raise Deposed(
                        f"this daemon's lease (epoch {self.fence}) is no longer the "
                        f"leader's (epoch {row[0] if row else None}): the log is "
                        f"not compacted"
                    )
            cur.execute(sql("%s"), params)
            return max(0, cur.rowcount)

    def reconnect(self) -> None:
        """A new connection after this one broke (PostgreSQL restarted, failed over): the
        same URL, so libpq's multi-host list finds the new primary. Raises psycopg's
        ``OperationalError`` while it is still away (the sequencer tries again)."""
        if not (self.conn.closed or self.conn.broken):
            return
        try:
            self.conn.close()
        except psycopg.Error:
            pass
        self.conn = psycopg.connect(
            self.url, autocommit=True, application_name="kliqued", connect_timeout=5
        )

    def commit(self) -> None:
        """The batch is durable when this returns (PostgreSQL's COMMIT)."""
        self.conn.execute("COMMIT")

    def rollback(self) -> None:
        if not (self.conn.closed or self.conn.broken):
            self.conn.execute("ROLLBACK")

    def close(self) -> None:
        self.conn.close()


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
