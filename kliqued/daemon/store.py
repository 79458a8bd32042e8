"""The DuckDB file: schema, the group-commit write path and the read paths.

The events and tokens are kept by an ``eventlog.EventLog``: this file's own tables
(``DuckLog``, the default) or PostgreSQL (``pglog.PgLog``, ``--db postgresql://...``). With
PostgreSQL the DuckDB file still holds the usage ledger and a copy of the events for the
audit reads (docs/ha.md): a batch is committed to PostgreSQL first (the moment it is durable),
then here; a copy left behind by a crash between the two is brought up to date at start.

Only this process opens the file (DuckDB's lock refuses a second writer process), with
``enable_external_access = false`` so that finance's SQL can read no file and no URL.
Every write runs on one dedicated thread with the one connection, as one transaction per
batch: events through DuckDB's appender (measured here: ~10 us a row, against ~500 us with
``executemany`` and ~80 us with a multi-row ``VALUES`` list), then the batch's other writes
(ledger intervals, tokens, prices) as callables on the same connection, then COMMIT. Reads
(the audit log, ledger SQL, CSV export) run on other threads, each on its own cursor, and see
committed data only; finance's SQL has its own threads (``querypool``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import duckdb

from kliqued.ledger import ops as ledger_ops
from kliqued.ledger import schema as ledger_schema
from kliqued.ledger.ops import LEDGER_WRITES, LedgerWrite
from kliqued.ledger.schema import q

from . import compaction, history, snapshot

from .errors import CopyBehind, DatabaseLocked, StoreMismatch
from .eventlog import DuckLog, EventLog, TokenInsert, TokenUpdate, TokenWrite
from .querypool import QueryPool

SCHEMA = [
    """CREATE TABLE IF NOT EXISTS events (
        seq BIGINT PRIMARY KEY, at_ms BIGINT NOT NULL, kind VARCHAR NOT NULL, task VARCHAR,
        actor VARCHAR, revision VARCHAR, grp VARCHAR, usr VARCHAR, data JSON)""",
    """CREATE TABLE IF NOT EXISTS tokens (
        id VARCHAR PRIMARY KEY, hash VARCHAR NOT NULL UNIQUE, principal VARCHAR NOT NULL,
        name VARCHAR, created_at_ms BIGINT NOT NULL, created_by VARCHAR,
        revoked_at_ms BIGINT)""",
    "ALTER TABLE tokens ADD COLUMN IF NOT EXISTS expires_at_ms BIGINT",
]

CHECKPOINT_WAL = "256MB"

FINGERPRINT = ("SELECT (SELECT count(*) FROM ledger), (SELECT count(*) FROM ledger WHERE "
               "end_at IS NULL), (SELECT coalesce(max(seq), 0) FROM ledger_feed), "
               "(SELECT count(*) FROM prices), (SELECT count(*) FROM capacity), "
               "(SELECT count(*) FROM cloud_nodes), (SELECT count(*) FROM cloud_nodes WHERE "
               "end_at IS NULL)")
"""What tells a local copy of the ledger from PostgreSQL's, in SQL both run: rows opened
and closed, prices, capacity snapshots, cloud nodes (a copy behind another daemon's lead
differs in one of them)."""

DECISION_TABLE = "CREATE TABLE IF NOT EXISTS log_decision (gid VARCHAR)"
"""With the log in PostgreSQL: the name of the last batch this file committed, the decision
of the two-phase commit (at most one row)."""

NODE_TABLE = "CREATE TABLE IF NOT EXISTS log_node (id VARCHAR)"
"""With the log in PostgreSQL: this file's random name, in its prepared batches' names."""

DbOp = Callable[[duckdb.DuckDBPyConnection], object] | TokenInsert | TokenUpdate | LedgerWrite
"""A write of a batch's transaction: a token write or a ledger write (data, for whichever
backend keeps them: ``kliqued.ledger.ops``), or a callable on the DuckDB connection (tools
and tests; what it returns is ignored)."""


@dataclass
class Batch:
    rows: list[tuple] = field(default_factory=list)
    """Event rows, seq already assigned, in log order."""
    ops: list[DbOp] = field(default_factory=list)
    """Other writes of the same transaction, in order."""


class Store:
    def __init__(self, path: str, log: EventLog | None = None) -> None:
        """``path``: the DuckDB file; ``log``: where the events and tokens are kept when not
        in that file (PostgreSQL)."""
        self.path = path
        self.recovered = []
        try:
            self.conn = duckdb.connect(path, config={"enable_external_access": False})
        except duckdb.IOException as exc:
            text = str(exc)
            if "lock" in text.lower():
                pid = re.search(r"PID (\d+)", text)
                who = f" (process {pid.group(1)})" if pid else ""
                raise DatabaseLocked(
                    f"{path} is in use by another process{who}: only one kliqued serve may "
                    f"open a database; stop it first, or give another --db") from None
            raise
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="db-write")
        self._readers = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="db-read")
        self.ledger_queries = QueryPool(self.conn)
        """Finance's SQL: threads of its own, so event reads never wait behind it."""
        self.finance_queries: QueryPool | None = None
        """With the ledger in PostgreSQL: finance's whole-ledger SQL, run there as the
        read-only role (``pgreader``), on a replica when one is configured."""
        self.log: EventLog = log or DuckLog(self.conn, path)
        self._copy: DuckLog | None = None if log is None else DuckLog(self.conn, path)
        """The local copy of the events (audit reads) when the log is elsewhere."""

    # ------------------------------------------------------------------ setup
    def ensure_schema(self, lead: bool = True) -> None:
        """The schemas of the file and the log; with ``lead`` (one daemon alone, tools) also
        :meth:`take_lead`. ``kliqued serve`` on PostgreSQL passes False and takes the lead
        once the lease is its (lease.py): a standby must not end the leader's batches."""
        # DuckDB checkpoints inside the commit that crosses this much WAL, stalling the
        # sequencer (~100+ ms, measured); the daemon checkpoints at every clean stop, so a
        # large threshold moves that work there. A crash replays the WAL at the next open.
        self.conn.execute(f"SET checkpoint_threshold = '{CHECKPOINT_WAL}'")
        for stmt in SCHEMA:
            self.conn.execute(stmt)
        ledger_schema.ensure_schema(self.conn)
        history.ensure_schema(self.conn)
        snapshot.ensure_schema(self.conn)
        compaction.ensure_schema(self.conn)
        self._writer.submit(self.log.migrate).result()
        if self._copy is not None:
            self.conn.execute(DECISION_TABLE)
            self.conn.execute(NODE_TABLE)
            row = self.conn.execute("SELECT id FROM log_node").fetchone()
            if row is None:
                row = (uuid.uuid4().hex[:8],)
                self.conn.execute("INSERT INTO log_node VALUES (?)", list(row))
            self.node = str(row[0])
        if lead:
            self.take_lead()

    def take_lead(self) -> None:
        """What a daemon does before it writes, once it leads (at start, or a standby after
        a takeover): end the batches left prepared (:meth:`recover`), bring the events'
        copy up to the log."""
        if self._copy is not None:
            self.recover()
            self._writer.submit(self._catch_up, self._copy).result()
            self._writer.submit(self._seed_ledger).result()

    def catch_up(self) -> None:
        """The events' copy brought up to the log (a standby, between its looks at the
        lease); counted in :attr:`caught_up`."""
        if self._copy is not None:
            before, self.caught_up = self.caught_up, 0
            self._writer.submit(self._catch_up, self._copy).result()
            self.caught_up += before

    node = ""
    """This ledger file's name in its prepared batches' names (``kliqued-NODE-...``): which
    of them this file decides."""

    def recover(self) -> None:
        self._writer.submit(self._recover).result()

    def _recover(self) -> None:
        """Ends the batches a daemon left prepared in PostgreSQL between the two phases. One
        of this file's: its commit when this file committed it (the file records the batch's
        name in the same transaction), its rollback otherwise. Another daemon's (a leader
        that died, found by a standby taking over): committed, since its file either
        committed it too or is behind, and a file behind is brought up to date at its next
        start (docs/ha.md). Called only while no other daemon leads (the lease expired)."""
        pending = self.log.pending()
        if not pending:
            return
        row = self.conn.execute("SELECT gid FROM log_decision").fetchone()
        decided = row[0] if row else None
        for gid in pending:
            commit = gid == decided or not self._mine(gid)
            self.log.finish(gid, commit=commit)
            self.recovered.append((gid, commit))

    def _mine(self, gid: str) -> bool:
        """A batch this file prepared: named with its node, or in the form from before
        nodes (``kliqued-`` and 32 hex digits: one daemon per database then)."""
        rest = gid[len("kliqued-"):]
        return rest.startswith(f"{self.node}-") or "-" not in rest

    recovered: list[tuple[str, bool]]
    """Prepared batches ended at start, and whether each was committed."""

    def _catch_up(self, copy: DuckLog) -> None:
        """Brings the local copy of the events up to the log (after a crash between the two
        commits, or a new local file); a copy ahead of the log means the log is not the
        one this file was written with (restored from an older backup, another database)."""
        have, logged = copy.last_seq(), self.log.last_seq()
        if have > logged:
            raise StoreMismatch(
                f"{self.path} holds events up to {have} but {self.log.label} only up to "
                f"{logged}: they are not the same deployment's (was the database restored "
                f"from an older backup?). Give the --ledger-db written with this database")
        if have < logged:
            self.conn.execute("BEGIN TRANSACTION")
            try:
                batch: list[tuple] = []
                for row in self.log.read_events(after=have):
                    batch.append(row)
                    if len(batch) >= 20_000:
                        copy.write(batch, [])
                        batch = []
                copy.write(batch, [])
                self.conn.execute("COMMIT")
            except BaseException:
                copy.rollback()
                self.conn.execute("ROLLBACK")
                raise
            self.caught_up = logged - have

    caught_up = 0
    """Events copied from the log into the local file at start."""

    def _seed_ledger(self) -> None:
        """One of the two ledgers empty and the other not, at start: the empty one gets the
        other's, once, so the two answer the same from then on. PostgreSQL's is empty when
        the deployment kept its ledger in the file before PostgreSQL held one; the file's
        when it is new beside a database that has one (a daemon started on another
        machine)."""
        log = self.log
        if not hasattr(log, "seed_ledger"):
            return
        has = self.conn.execute("SELECT (SELECT count(*) FROM ledger) + "
                                "(SELECT count(*) FROM capacity)").fetchone()
        file_empty = not (has and has[0])
        pg_empty = getattr(log, "ledger_empty")()
        if pg_empty and not file_empty:
            self.seeded = log.seed_ledger(self._file_table)
        elif not pg_empty and (file_empty or self._one_row(FINGERPRINT)
                               != getattr(log, "ledger_fingerprint")()):
            # new, or behind: another daemon led meanwhile (a standby's file, a takeover)
            self.seeded_file = self._fill_file(log, replace=not file_empty)

    def _one_row(self, sql: str) -> tuple:
        row = self.conn.execute(sql).fetchone()
        return tuple(int(v) for v in row) if row else ()

    def _file_table(self, table: str, columns: list[str]) -> Iterator[tuple]:
        cur = self.conn.cursor()
        try:
            cur.execute(f"SELECT {', '.join(q(c) for c in columns)} FROM {table}")
            while rows := cur.fetchmany(20_000):
                yield from rows
        finally:
            cur.close()

    def _fill_file(self, log: Any, replace: bool = False) -> int:
        """Copies PostgreSQL's ledger into this file's (``replace``: in place of what it
        had), in one transaction; returns the ledger rows copied."""
        copied = 0
        self.conn.execute("BEGIN TRANSACTION")
        try:
            for table in log.SEED_TABLES if replace else ():
                self.conn.execute(f"DELETE FROM {table}")
            for table in log.SEED_TABLES:
                columns, rows = log.read_table(table)
                if ledger_schema._columns(self.conn, table) != columns:
                    raise StoreMismatch(f"{self.path}'s {table} has other columns than "
                                        f"{log.label}'s: give a new --ledger-db")
                appender = self.conn.appender(table)
                batch: list[tuple] = []
                for row in rows:
                    batch.append(row)
                    if len(batch) >= 20_000:
                        appender.append_rows(batch)
                        batch = []
                appender.append_rows(batch)
                appender.flush()
                if table == "ledger":
                    copied = self._one("SELECT count(*) FROM ledger")
            n = self._one("SELECT coalesce(max(seq), 0) FROM ledger_feed")
            self.conn.execute(f"DROP SEQUENCE IF EXISTS {ledger_schema.FEED_SEQUENCE}")
            self.conn.execute(f"CREATE SEQUENCE {ledger_schema.FEED_SEQUENCE} START {n + 1}")
            self.conn.execute("COMMIT")
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        return int(copied)

    def _one(self, sql: str) -> int:
        row = self.conn.execute(sql).fetchone()
        return int(row[0]) if row else 0

    seeded_file = 0
    """Ledger rows copied from PostgreSQL into a new local file at start."""

    seeded = 0
    """Ledger rows copied from the file into an empty PostgreSQL ledger at start."""

    def on_writer(self, fn: Callable[[], Any]) -> Any:
        """Runs ``fn`` on the write thread (the log's connection is that thread's), for
        start-up work on the log's database."""
        return self._writer.submit(fn).result()

    def last_seq(self) -> int:
        return self._writer.submit(self.log.last_seq).result()

    def read_events(self, chunk: int = 20_000, after: int = 0) -> Iterator[tuple]:
        """Every event after ``after`` in log order, as (seq, at_ms, kind, task, actor,
        revision, grp, usr, data text): from the log itself (before the loop runs:
        start-up's replay, after the snapshot it loaded)."""
        return self.log.read_events(after, chunk)

    def read_tokens(self) -> list[tuple]:
        return self._writer.submit(self.log.read_tokens).result()

    # ------------------------------------------------------------------ writes
    def _commit(self, batch: Batch) -> None:
        """One transaction: the log's (events, tokens) and the DuckDB file's (the ledger, the
        events' copy). With the log in PostgreSQL and prepared transactions on, two phases:
        PostgreSQL prepares, the DuckDB file commits with the batch's name (the decision),
        PostgreSQL commits the prepared batch; a stop anywhere in between is resolved at the
        next start (:meth:`_recover`). Without prepared transactions, PostgreSQL commits
        first (docs/ha.md: the ledger rows of a batch caught between are lost)."""
        conn = self.conn
        tokens: list[TokenWrite] = [op for op in batch.ops
                                    if isinstance(op, (TokenInsert, TokenUpdate))]
        ledger: list[LedgerWrite] = [op for op in batch.ops if isinstance(op, LEDGER_WRITES)]
        gid: str | None = None
        conn.execute("BEGIN TRANSACTION")
        try:
            self.log.begin()
            self.log.write(batch.rows, tokens, ledger)
            if self._copy is not None:
                self._copy.write(batch.rows, [])
            for op in batch.ops:
                if isinstance(op, LEDGER_WRITES):
                    ledger_ops.apply_duck(conn, op)
                elif not isinstance(op, (TokenInsert, TokenUpdate)):
                    op(conn)
            if self._copy is not None and self.log.two_phase:
                gid = f"kliqued-{self.node}-{uuid.uuid4().hex}"
                conn.execute("DELETE FROM log_decision")
                conn.execute("INSERT INTO log_decision VALUES (?)", [gid])
                self.log.prepare(gid)
            else:
                self.log.commit()
        except BaseException:
            self._undo()
            raise
        try:
            conn.execute("COMMIT")
        except BaseException as exc:
            self._undo()
            if gid is not None:
                self.log.finish(gid, commit=False)
                raise
            if self._copy is None:
                raise
            raise CopyBehind(f"a batch is in {self.log.label} but {self.path} could not "
                             f"commit it ({exc}): stopping; the restart brings the file up "
                             f"to date") from exc
        if gid is not None:
            try:
                self.log.finish(gid, commit=True)
            except BaseException as exc:
                if self._committed_elsewhere(gid, batch):
                    return  # durable: the next batch finds the new leader's fence
                raise CopyBehind(f"a batch is committed in {self.path} but its commit in "
                                 f"{self.log.label} failed ({exc}): stopping; the restart "
                                 f"commits it") from exc

    def _committed_elsewhere(self, gid: str, batch: Batch) -> bool:
        """Whether a prepared batch of ours was committed by a standby taking over (this
        daemon paused past its lease between the two phases; docs/ha.md): no longer
        pending, and its last event in the log."""
        try:
            if gid in self.log.pending():
                return False
            return not batch.rows or self.log.last_seq() >= batch.rows[-1][0]
        except Exception:  # the log unreachable: not known, so not
            return False

    def _undo(self) -> None:
        for undo in (self.log.rollback, *((self._copy.rollback,) if self._copy else ()),
                     lambda: self.conn.execute("ROLLBACK")):
            try:
                undo()
            except Exception:
                pass

    def write_local(self, fn: Callable[[duckdb.DuckDBPyConnection], object]) -> None:
        """``fn`` on the DuckDB file alone, in a transaction of its own, on the writer
        thread: what only this file keeps and replay writes (the evicted tasks' history,
        snapshots), while the log may still be streaming the replay's events."""
        def run() -> None:
            self.conn.execute("BEGIN TRANSACTION")
            try:
                fn(self.conn)
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            self.conn.execute("COMMIT")
        self._writer.submit(run).result()

    def read_sync(self, fn: Callable[[duckdb.DuckDBPyConnection], Any]) -> Any:
        """``fn`` on a fresh cursor of the DuckDB file, in the calling thread (not the event
        loop's: snapshots' and compaction's threads)."""
        cur = self.conn.cursor()
        try:
            return fn(cur)
        finally:
            cur.close()

    def compact(self, sql: Callable[[str], str], params: list[Any]) -> int:
        """Log compaction's DELETE (``sql`` of the dialect's placeholder) on the log, and on
        the events' copy beside a log kept elsewhere, on the writer thread between two
        batches; returns the rows the log lost."""
        def run() -> int:
            removed = self.log.compact(sql, params)
            if self._copy is not None:
                self._copy.compact(sql, params)
            return removed
        return self._writer.submit(run).result()

    def commit_sync(self, batch: Batch) -> None:
        """For start-up (before the loop runs) and tools."""
        self._writer.submit(self._commit, batch).result()
        self._count_ledger(batch)

    async def commit(self, batch: Batch) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._writer, self._commit, batch)
        self._count_ledger(batch)

    ledger_changes = 0
    """Committed batches that wrote the ledger since start: what a cache of figures derived
    from the ledger compares (the dashboards' CIO figures, kliqued/web/data.py)."""

    def _count_ledger(self, batch: Batch) -> None:
        if any(isinstance(op, LEDGER_WRITES) for op in batch.ops):
            self.ledger_changes += 1

    # ------------------------------------------------------------------ reads
    async def read(self, fn: Callable[[duckdb.DuckDBPyConnection], Any]) -> Any:
        """Runs ``fn`` on a fresh cursor in a reader thread."""
        def run() -> Any:
            cur = self.conn.cursor()
            try:
                return fn(cur)
            finally:
                cur.close()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._readers, run)

    def page_events(self, cur: duckdb.DuckDBPyConnection, where: list[str], params: list,
                    limit: int, max_bytes: int) -> tuple[list[dict], bool]:
        """At most ``limit`` events in log order, the page also stopping once its events' data
        passes ``max_bytes`` (at least one event): (events, whether more may follow)."""
        sql = (f"SELECT seq, at_ms, kind, task, actor, revision, data FROM events"
               f"{' WHERE ' + ' AND '.join(where) if where else ''} ORDER BY seq LIMIT ?")
        cur.execute(sql, [*params, limit])
        out: list[dict] = []
        budget = max_bytes
        while len(out) < limit:
            r = cur.fetchone()
            if r is None:
                return out, False
            if budget < 0:
                return out, True
            budget -= len(r[6] or "") + 256
            out.append({"seq": r[0], "at_ms": r[1], "kind": r[2], "task": r[3], "actor": r[4],
                        "revision": r[5], "data": json.loads(r[6]) if r[6] else {}})
        return out, True

    # ------------------------------------------------------------------ shutdown
    def close(self) -> None:
        """Checkpoint (the WAL folded into the file) and close; called after the last
        commit."""
        def fin() -> None:
            if self._copy is not None:
                self._copy.close()
            self.log.close()
            self.conn.execute("CHECKPOINT")
            self.conn.close()
        self._readers.shutdown(wait=True)
        self.ledger_queries.shutdown()
        if self.finance_queries is not None:
            self.finance_queries.shutdown()
            closer = getattr(self.finance_queries.handles, "close", None)
            if closer is not None:
                closer()
        self._writer.submit(fin).result()
        self._writer.shutdown(wait=True)
