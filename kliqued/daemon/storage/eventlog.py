"""The event log's seam: where the events and the tokens are kept, as a small protocol.

The daemon's durable state is its log of events and its tokens (everything else is rebuilt
from them, docs/daemon.md). :class:`EventLog` is what the :class:`~.store.Store` needs of the
place that keeps them: versioned migrations at start, the highest sequence number, the events
in order, the tokens, and a batch's writes inside one transaction. Two implementations:
:class:`DuckLog` (the DuckDB file, the default: the events share the ledger's transaction)
and ``pglog.PgLog`` (PostgreSQL, chosen by a ``postgresql://`` URL).

Token writes are data (:class:`TokenInsert`, :class:`TokenUpdate`), not SQL, so each backend
writes them in its own dialect and no caller knows which one runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Literal, Protocol, Sequence, Union

from kliqued.daemon.events import COLUMNS

if TYPE_CHECKING:
    from kliqued.ledger.ops import LedgerWrite


@dataclass(frozen=True)
class TokenInsert:
    """A new token row (only the keyed hash of its secret)."""

    id: str
    hash: str
    principal: str
    name: str | None
    created_at_ms: int
    created_by: str | None
    expires_at_ms: int | None = None


@dataclass(frozen=True)
class TokenUpdate:
    """One column of one token changes: revoked, its end moved, or its hash re-keyed."""

    id: str
    column: Literal["revoked_at_ms", "expires_at_ms", "hash"]
    value: Any


TokenWrite = Union[TokenInsert, TokenUpdate]

TOKEN_COLUMNS = (
    "id",
    "hash",
    "principal",
    "name",
    "created_at_ms",
    "created_by",
    "revoked_at_ms",
    "expires_at_ms",
)
"""The order of a token row as :meth:`EventLog.read_tokens` returns it."""

INSERT_TOKEN = (
    "INSERT INTO tokens (id, hash, principal, name, created_at_ms, created_by, "
    "expires_at_ms) VALUES ({p})"
)
UPDATABLE = frozenset({"revoked_at_ms", "expires_at_ms", "hash"})


def token_params(w: TokenInsert) -> list[Any]:
    return [w.id, w.hash, w.principal, w.name, w.created_at_ms, w.created_by, w.expires_at_ms]


class EventLog(Protocol):
    """Where the events and tokens are kept. A batch is written between :meth:`begin` and
    :meth:`commit` (or :meth:`rollback`); :meth:`commit` returning is the moment the batch
    is durable."""

    label: str
    """Where the log is, for messages (no password)."""

    def migrate(self) -> None:
        """Brings the schema to this version (versioned, at start; idempotent)."""

    def last_seq(self) -> int:
        """The highest sequence number logged, 0 for an empty log."""

    def read_events(self, after: int = 0, chunk: int = 20_000) -> Iterator[tuple]:
        """The events with ``seq > after`` in log order, as tuples in ``events.COLUMNS``'
        order (``data`` as JSON text)."""

    def read_tokens(self) -> list[tuple]:
        """Every token, in ``TOKEN_COLUMNS``' order, by id."""

    def begin(self) -> None: ...

    def write(
        self, rows: list[tuple], tokens: list[TokenWrite], ledger: Sequence[LedgerWrite] = ()
    ) -> None:
        """Stages a batch's event rows (seq assigned, in order) and token writes, and its
        ledger writes when this log keeps a ledger of its own (PostgreSQL's)."""

    def commit(self) -> None: ...

    def rollback(self) -> None: ...

    def finish(self, gid: str, commit: bool) -> None:
        """Ends a prepared batch (:meth:`pending`)."""

    def pending(self) -> list[str]:
        """Prepared batches an older kliqued never ended (a stop between the two phases of
        the commit it made with the DuckDB file): committed at start."""

    def compact(self, sql: Callable[[str], str], params: list[Any]) -> int:
        """Runs log compaction's DELETE (``sql`` given this dialect's placeholder) in a
        transaction of its own; returns how many events it removed (compaction.py)."""

    def close(self) -> None: ...


class DuckLog:
    """The log in the daemon's DuckDB file, on the Store's one write connection: it joins
    the Store's transaction (so the events and the ledger's rows commit together), which is
    why :meth:`begin`, :meth:`commit` and :meth:`rollback` do nothing here."""

    def __init__(self, conn: Any, label: str) -> None:
        self.conn = conn
        self.label = label
        self._appender: Any = None

    def migrate(self) -> None:
        from kliqued.daemon.storage.schema import SCHEMA

        for stmt in SCHEMA:
            self.conn.execute(stmt)

    def last_seq(self) -> int:
        row = self.conn.execute("SELECT max(seq) FROM events").fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def read_events(self, after: int = 0, chunk: int = 20_000) -> Iterator[tuple]:
        cur = self.conn.cursor()
        try:
            cur.execute(
                f"SELECT {', '.join(COLUMNS)} FROM events WHERE seq > ? ORDER BY seq", [after]
            )
            while True:
                rows = cur.fetchmany(chunk)
                if not rows:
                    return
                yield from rows
        finally:
            cur.close()

    def read_tokens(self) -> list[tuple]:
        return self.conn.execute(
            f"SELECT {', '.join(TOKEN_COLUMNS)} FROM tokens ORDER BY id"
        ).fetchall()

    def begin(self) -> None:
        pass

    def write(
        self, rows: list[tuple], tokens: list[TokenWrite], ledger: Sequence[LedgerWrite] = ()
    ) -> None:
        """``ledger`` is ignored: the ledger in this file is written by the Store on the same
        connection (``ledger.ops.apply_duck``)."""
        if rows:
            if self._appender is None:
                self._appender = self.conn.appender("events")
            self._appender.append_rows(rows)
            self._appender.flush()
        for w in tokens:
            if isinstance(w, TokenInsert):
                self.conn.execute(INSERT_TOKEN.format(p=", ".join("?" * 7)), token_params(w))
            else:
                assert w.column in UPDATABLE
                self.conn.execute(f"UPDATE tokens SET {w.column} = ? WHERE id = ?", [w.value, w.id])

    def commit(self) -> None:
        pass

    def rollback(self) -> None:
        """Drops what the appender holds; the Store's ROLLBACK undoes the rest."""
        if self._appender is not None:
            self._appender.clear()

    def finish(self, gid: str, commit: bool) -> None:
        raise NotImplementedError("the DuckDB log commits with the file")

    def pending(self) -> list[str]:
        return []

    def compact(self, sql: Callable[[str], str], params: list[Any]) -> int:
        self.conn.execute("BEGIN TRANSACTION")
        try:
            row = self.conn.execute(sql("?"), params).fetchone()
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")
        return int(row[0]) if row else 0

    def close(self) -> None:
        self._appender = None
