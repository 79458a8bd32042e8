"""The DuckDB file: schema, the group-commit write path and the read paths.

The events and tokens are kept by an ``eventlog.EventLog``: this file's own tables
(``DuckLog``, the default) or PostgreSQL (``pglog.PgLog``, ``--db postgresql://...``). With
PostgreSQL the DuckDB file still holds a copy of the usage ledger and of the events for the
reads whose SQL is DuckDB's (docs/ha.md). PostgreSQL is the truth there and the file a cache
that *follows* it: a batch is one PostgreSQL transaction, committed on the write thread, and
its part for the file (the events' copy, the ledger's writes, the history's rows) is handed
to one *file thread* that applies queued batches in order, several in one DuckDB transaction
when they queue up. The sequencer does not wait for it; reads of the file wait until it has
applied what was committed before them (:meth:`Store.settled`). A file left behind by a stop
(``kill -9``) is brought up to PostgreSQL at the next start (:meth:`Store.take_lead`).

Only this process opens the file (DuckDB's lock refuses a second writer process), with
``enable_external_access = false`` so that finance's SQL can read no file and no URL.
Every write to the file runs on one dedicated thread with the one connection (with DuckDB
alone: the sequencer's write thread, one transaction per batch; with PostgreSQL: the file
thread, as above): events through DuckDB's appender (measured here: ~10 us a row, against ~500 us with
``executemany`` and ~80 us with a multi-row ``VALUES`` list), then the batch's other writes
(ledger intervals, tokens, prices) as callables on the same connection, then COMMIT. Reads
(the audit log, ledger SQL, CSV export) run on other threads, each on its own cursor, and see
committed data only; finance's SQL has its own threads (``querypool``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import json
import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import duckdb

from kliqued.ledger import ops as ledger_ops
from kliqued.ledger import schema as ledger_schema
from kliqued.ledger.ops import LEDGER_WRITES, LedgerWrite
from kliqued.ledger.schema import q

from kliqued.daemon.storage.schema import SCHEMA, ensure_tables

from kliqued.daemon.errors import CopyBehind, DatabaseLocked, StoreMismatch, Unavailable
from kliqued.daemon.storage.eventlog import DuckLog, EventLog, TokenInsert, TokenUpdate, TokenWrite
from kliqued.daemon.storage.querypool import QueryPool

log = logging.getLogger(__name__)

CHECKPOINT_WAL = "256MB"

FINGERPRINT = (
    "SELECT (SELECT count(*) FROM ledger), (SELECT count(*) FROM ledger WHERE "
    "end_at IS NULL), (SELECT coalesce(max(seq), 0) FROM ledger_feed), "
    "(SELECT count(*) FROM prices), (SELECT count(*) FROM capacity), "
    "(SELECT count(*) FROM cloud_nodes), (SELECT count(*) FROM cloud_nodes WHERE "
    "end_at IS NULL), (SELECT count(*) FROM preemptions)"
)
"""What tells a local copy of the ledger from PostgreSQL's, in SQL both run: rows opened
and closed, prices, capacity snapshots, cloud nodes (a copy behind another daemon's lead
differs in one of them)."""

BEHIND_TABLE = "CREATE TABLE IF NOT EXISTS ledger_behind (since_seq BIGINT)"
"""With the log in PostgreSQL: a row when this file's copy of the ledger is known behind the
log, written by the catch-up that copies events without their ledger writes (a ``kill -9``
before the file thread applied the last batches, a standby following another daemon's
lead), in the same transaction; the ledger is then replaced by PostgreSQL's at the next
lead (:meth:`Store._seed_ledger`), which deletes it. Nothing per batch: the file thread's
batches carry their ledger writes with their events."""

DEFAULT_MEMORY = "2GiB"
"""DuckDB's memory limit unless ``kliqued serve --db-memory`` says otherwise. DuckDB's own
default is 80% of the machine's memory, and a memory limit is per database, not per query:
without a lower one, one finance query (``string_agg`` over ``repeat``) took the daemon to
4 GB (issue 25; docs/decisions.md). Pages of the database beyond it are evicted, and
spilled to its temporary directory, not refused."""

FOLLOW_DELAY_ENV = "KLIQUED_TEST_FOLLOW_DELAY_S"
"""Tests only: the file thread waits this long before applying what is queued (a ``kill -9``
lands while the file is behind PostgreSQL; a read right after a write must wait for it)."""

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
    def __init__(
        self, path: str, log: EventLog | None = None, memory_limit: str = DEFAULT_MEMORY
    ) -> None:
        """``path``: the DuckDB file; ``log``: where the events and tokens are kept when not
        in that file (PostgreSQL); ``memory_limit``: the most memory DuckDB may use (its
        ``memory_limit``, e.g. ``2GB``), which also bounds a finance query's (a query that
        needs more fails, as ``too-large``: kliqued/ledger/sql.py)."""
        self.path = path
        self.recovered = []
        try:
            self.conn = duckdb.connect(
                path, config={"enable_external_access": False, "memory_limit": memory_limit}
            )
        except duckdb.IOException as exc:
            text = str(exc)
            if "lock" in text.lower():
                pid = re.search(r"PID (\d+)", text)
                who = f" (process {pid.group(1)})" if pid else ""
                raise DatabaseLocked(
                    f"{path} is in use by another process{who}: only one kliqued serve may "
                    f"open a database; stop it first, or give another --db"
                ) from None
            raise
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="db-write")
        self._readers = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="db-read")
        self.log: EventLog = log or DuckLog(self.conn, path)
        self._copy: DuckLog | None = None if log is None else DuckLog(self.conn, path)
        """The local copy of the events (audit reads) when the log is elsewhere."""
        self._filer = (
            self._writer
            if log is None
            else concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="db-file")
        )
        """The thread of every write to the DuckDB file: the write thread itself with DuckDB
        alone (the file is the log); with PostgreSQL a thread of its own, which the file's
        part of each batch is handed to (:meth:`_hand`), so that its jobs run in commit
        order and a snapshot at event S is written after every batch up to S."""
        self._queue: list[Batch] = []
        """Batches committed in PostgreSQL, their file part not yet applied (file thread)."""
        self._queue_lock = threading.Lock()
        self._handed = 0
        """Batches handed to the file thread so far, and applied by it (:meth:`settled`)."""
        self._applied = 0
        self.follow_failed: BaseException | None = None
        """Why the file thread could not apply a batch: the daemon stops (CopyBehind)."""
        self.on_follow_failed: Callable[[BaseException], None] | None = None
        """Told (on the file thread) when the file thread fails: the daemon's fatal path."""
        self._follow_delay = float(os.environ.get(FOLLOW_DELAY_ENV) or 0) if log else 0.0
        if self._follow_delay:
            logging.getLogger(__name__).warning(
                "%s: the file thread waits %.2f s before each batch (tests only)",
                FOLLOW_DELAY_ENV,
                self._follow_delay,
            )
        self.ledger_queries = QueryPool(self.conn, before=self.settled)
        """Finance's SQL: threads of its own, so event reads never wait behind it."""
        self.finance_queries: QueryPool | None = None
        """With the ledger in PostgreSQL: finance's whole-ledger SQL, run there as the
        read-only role (``pgreader``), on a replica when one is configured."""

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
        ensure_tables(self.conn)
        self._writer.submit(self.log.migrate).result()
        if self._copy is not None:
            self.conn.execute(BEHIND_TABLE)
        if lead:
            self.take_lead()

    def take_lead(self) -> None:
        """What a daemon does before it writes, once it leads (at start, or a standby after
        a takeover): end the batches an older kliqued left prepared (:meth:`recover`), bring
        the file up to the log (the events' copy, then the ledger's), on the file thread."""
        if self._copy is not None:
            self.recover()
            self._filer.submit(self._catch_up, self._copy).result()
            self._filer.submit(self._seed_ledger).result()

    def catch_up(self) -> None:
        """The events' copy brought up to the log (a standby, between its looks at the
        lease); counted in :attr:`caught_up`."""
        if self._copy is not None:
            before, self.caught_up = self.caught_up, 0
            self._filer.submit(self._catch_up, self._copy).result()
            self.caught_up += before

    def recover(self) -> None:
        self._writer.submit(self._recover).result()

    def _recover(self) -> None:
        """Commits the batches a kliqued from before the file followed PostgreSQL left
        prepared (its two-phase commit, stopped between the phases): PostgreSQL is the
        truth, and a file that lacks the batch catches up (:meth:`_catch_up`). A prepared
        batch holds the lease's row, so a standby ends them before taking over. Called only
        while no other daemon leads (the lease expired)."""
        for gid in self.log.pending():
            self.log.finish(gid, commit=True)
            self.recovered.append((gid, True))

    recovered: list[tuple[str, bool]]
    """Prepared batches ended at start, and whether each was committed (always, now)."""

    def _catch_up(self, copy: DuckLog) -> None:
        """Brings the local copy of the events up to the log (after a stop before the file
        thread applied the last batches, or a new local file); a copy ahead of the log means
        the log is not the one this file was written with (restored from an older backup,
        another database). On the file thread; it reads the log on the log's connection,
        which nothing else uses meanwhile (a start, a standby: no batch is committed)."""
        have, logged = copy.last_seq(), self.log.last_seq()
        if have > logged:
            raise StoreMismatch(
                f"{self.path} holds events up to {have} but {self.log.label} only up to "
                f"{logged}: they are not the same deployment's (was the database restored "
                f"from an older backup?). Give the --ledger-db written with this database"
            )
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
                # the ledger's writes of these events are not here: known behind
                self.conn.execute(
                    "INSERT INTO ledger_behind SELECT ? WHERE NOT EXISTS "
                    "(SELECT 1 FROM ledger_behind)",
                    [have],
                )
                self.conn.execute("COMMIT")
            except BaseException:
                copy.rollback()
                self.conn.execute("ROLLBACK")
                raise
            self.caught_up = logged - have

    caught_up = 0
    """Events copied from the log into the local file at start."""

    def _seed_ledger(self) -> None:
        """At start (file thread): the two ledgers made the same. PostgreSQL's empty and the
        file's not (the deployment kept its ledger in the file before PostgreSQL held one):
        PostgreSQL gets the file's, once. Otherwise a file whose copy has not followed the
        log to its last event (:data:`BEHIND_TABLE`: behind after a ``kill -9``, behind
        another daemon's lead), is new, or differs from it (:data:`FINGERPRINT`) gets
        PostgreSQL's."""
        log = self.log
        if not hasattr(log, "seed_ledger"):
            return
        has = self.conn.execute(
            "SELECT (SELECT count(*) FROM ledger) + (SELECT count(*) FROM capacity)"
        ).fetchone()
        file_empty = not (has and has[0])
        pg_empty = getattr(log, "ledger_empty")()
        behind = self._one("SELECT count(*) FROM ledger_behind") > 0
        if pg_empty and not file_empty:
            self.seeded = log.seed_ledger(self._file_table)
        elif not pg_empty and (
            file_empty
            or behind
            or self._one_row(FINGERPRINT) != getattr(log, "ledger_fingerprint")()
        ):
            self.seeded_file = self._fill_file(log, replace=not file_empty)
        if behind:
            self.conn.execute("DELETE FROM ledger_behind")

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
                    raise StoreMismatch(
                        f"{self.path}'s {table} has other columns than "
                        f"{log.label}'s: give a new --ledger-db"
                    )
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
    """Ledger rows copied from PostgreSQL into the local file at start."""

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
        """One batch, durable when this returns: with DuckDB alone one transaction of the
        file (:meth:`_commit_file`); with the log in PostgreSQL one PostgreSQL transaction,
        the file's part then handed to the file thread (:meth:`_commit_log`)."""
        if self._copy is None:
            self._commit_file(batch)
        else:
            self._commit_log(batch)

    def _commit_file(self, batch: Batch) -> None:
        """The DuckDB file is the log: the events, tokens and the ledger in one transaction."""
        conn = self.conn
        tokens: list[TokenWrite] = [
            op for op in batch.ops if isinstance(op, (TokenInsert, TokenUpdate))
        ]
        conn.execute("BEGIN TRANSACTION")
        try:
            self.log.write(batch.rows, tokens)
            for op in batch.ops:
                if isinstance(op, LEDGER_WRITES):
                    ledger_ops.apply_duck(conn, op)
                elif not isinstance(op, (TokenInsert, TokenUpdate)):
                    op(conn)
        except BaseException:
            self._undo()
            raise
        try:
            conn.execute("COMMIT")
        except BaseException:
            self._undo()
            raise

    def _commit_log(self, batch: Batch) -> None:
        """The log in PostgreSQL: its transaction (the fence's check, the events, tokens and
        ledger writes) committed, then the file's part (the events' copy, the ledger's
        writes, the other writes such as the history's rows) queued for the file thread. A
        failure of the file thread before is this batch's failure: nothing of it is
        written, and the daemon stops (the restart brings the file up to date)."""
        if self.follow_failed is not None:
            raise CopyBehind(
                f"{self.path} could not apply a batch committed in "
                f"{self.log.label} ({self.follow_failed}): stopping; the restart "
                f"brings the file up to date"
            )
        tokens: list[TokenWrite] = []
        ledger: list[LedgerWrite] = []
        local: list[DbOp] = []
        for op in batch.ops:
            if isinstance(op, (TokenInsert, TokenUpdate)):
                tokens.append(op)
            else:
                local.append(op)
                if isinstance(op, LEDGER_WRITES):
                    ledger.append(op)
        try:
            self.log.begin()
            self.log.write(batch.rows, tokens, ledger)
            self.log.commit()
        except BaseException:
            try:
                self.log.rollback()
            except Exception:
                pass
            raise
        if batch.rows or local:
            self._hand(Batch(batch.rows, local))

    def _hand(self, part: Batch) -> None:
        """Queues a committed batch's file part; the file thread takes every part queued
        when it runs (:meth:`_follow`)."""
        with self._queue_lock:
            self._queue.append(part)
            self._handed += 1
        self._filer.submit(self._follow)

    def _follow(self) -> None:
        """On the file thread: applies every queued part, in commit order, in one DuckDB
        transaction (a busy daemon's batches coalesce: fewer commits, less CPU). A failure is fatal: logged,
        kept in :attr:`follow_failed` (the next commit and every read of the file refuse),
        told to :attr:`on_follow_failed`; the file stays as it was and the restart brings
        it up to the log."""
        if self._follow_delay and self._queue:
            time.sleep(self._follow_delay)
        with self._queue_lock:
            parts, self._queue = self._queue, []
        if not parts:
            return
        if self.follow_failed is not None:
            self._applied += len(parts)  # never applied: readers are refused instead
            return
        conn = self.conn
        copy = self._copy
        assert copy is not None
        rows = parts[0].rows if len(parts) == 1 else [r for p in parts for r in p.rows]
        conn.execute("BEGIN TRANSACTION")
        try:
            copy.write(rows, [])
            for part in parts:
                for op in part.ops:
                    if isinstance(op, LEDGER_WRITES):
                        ledger_ops.apply_duck(conn, op)
                    else:
                        op(conn)  # type: ignore[operator]
            conn.execute("COMMIT")
        except BaseException as exc:
            for undo in (copy.rollback, lambda: conn.execute("ROLLBACK")):
                try:
                    undo()
                except Exception:
                    pass
            self.follow_failed = exc
            log.error(
                "kliqued: %s could not apply %d batch(es) committed in %s (%s: %s); "
                "stopping: the restart brings the file up to date",
                self.path,
                len(parts),
                self.log.label,
                type(exc).__name__,
                exc,
            )
            if self.on_follow_failed is not None:
                try:
                    self.on_follow_failed(exc)
                except Exception:  # the loop is gone (stopping): the next commit refuses
                    pass
        finally:
            self._applied += len(parts)

    def _undo(self) -> None:
        for undo in (
            self.log.rollback,
            *((self._copy.rollback,) if self._copy else ()),
            lambda: self.conn.execute("ROLLBACK"),
        ):
            try:
                undo()
            except Exception:
                pass

    def write_local(self, fn: Callable[[duckdb.DuckDBPyConnection], object]) -> None:
        """``fn`` on the DuckDB file alone, in a transaction of its own, on the file's
        thread: what only this file keeps and replay writes (the evicted tasks' history,
        snapshots), while the log may still be streaming the replay's events; with
        PostgreSQL after every batch handed to the file before it."""

        def run() -> None:
            self.conn.execute("BEGIN TRANSACTION")
            try:
                fn(self.conn)
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            self.conn.execute("COMMIT")

        self._filer.submit(run).result()

    def read_sync(self, fn: Callable[[duckdb.DuckDBPyConnection], Any]) -> Any:
        """``fn`` on a fresh cursor of the DuckDB file, in the calling thread (not the event
        loop's: snapshots' and compaction's threads), once the file has what was committed
        before (:meth:`settled`)."""
        self._settle_sync()
        cur = self.conn.cursor()
        try:
            return fn(cur)
        finally:
            cur.close()

    def compact(self, sql: Callable[[str], str], params: list[Any]) -> int:
        """Log compaction's DELETE (``sql`` of the dialect's placeholder) on the log (on the
        write thread, between two batches), then on the events' copy beside a log kept
        elsewhere (on the file thread); returns the rows the log lost."""
        removed = self._writer.submit(self.log.compact, sql, params).result()
        if self._copy is not None:
            self._filer.submit(self._copy.compact, sql, params).result()
        return removed

    def commit_sync(self, batch: Batch) -> None:
        """For start-up (before the loop runs) and tools."""
        self._writer.submit(self._commit, batch).result()
        self._count_ledger(batch)

    async def commit(self, batch: Batch) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._writer, self._commit, batch)
        self._count_ledger(batch)

    # ------------------------------------------------------------------ the store away
    async def revive(self) -> None:
        """After a commit failed because the store was away (storefault.py): makes the log
        writable again or raises what still stands in the way. PostgreSQL: a new connection
        (libpq's multi-host URL finds the primary) and an empty batch, which checks the
        fence (``Deposed`` when another daemon took the lease meanwhile). DuckDB: the
        file's directory must have :data:`RESUME_FREE_BYTES` free again (an ``OSError``
        ENOSPC otherwise), so that one small commit does not take the last bytes."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._writer, self._revive)

    def _revive(self) -> None:
        reconnect = getattr(self.log, "reconnect", None)
        if reconnect is not None:
            reconnect()
            self._commit_log(Batch())
            return
        free = free_bytes(self.path)
        if free is not None and free < RESUME_FREE_BYTES:
            raise OSError(
                errno.ENOSPC,
                f"No space left on device: {free} bytes free beside "
                f"{self.path}, {RESUME_FREE_BYTES} wanted to resume",
            )

    async def last_seq_async(self) -> int:
        """:meth:`last_seq` from the event loop (the write thread reads it)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._writer, self.log.last_seq)

    ledger_changes = 0
    """Committed batches that wrote the ledger since start: what a cache of figures derived
    from the ledger compares (the dashboards' CIO figures, kliqued/web/data.py)."""

    def _count_ledger(self, batch: Batch) -> None:
        if any(isinstance(op, LEDGER_WRITES) for op in batch.ops):
            self.ledger_changes += 1

    # ------------------------------------------------------------------ the file's reads
    async def settled(self) -> None:
        """Returns once the file has every batch committed before the call (with PostgreSQL:
        the file thread has applied them; at once when it has, or with DuckDB alone, where
        a batch is in the file when committed). Every read of the file comes here first
        (:meth:`read`, :meth:`read_sync`, :meth:`cursor`, :attr:`ledger_queries`), so a
        request sees its own writes. Raises 503 once the file thread has failed."""
        if self._filer is self._writer:
            return
        if self._applied < self._handed:
            await asyncio.wrap_future(self._filer.submit(_nothing))
        self._refuse_if_failed()

    def _settle_sync(self) -> None:
        """:meth:`settled` for a thread that may block (never the file thread)."""
        if self._filer is self._writer:
            return
        if self._applied < self._handed:
            self._filer.submit(_nothing).result()
        self._refuse_if_failed()

    def _refuse_if_failed(self) -> None:
        if self.follow_failed is not None:
            raise Unavailable(
                f"the local file {self.path} is behind the log and kliqued is "
                f"stopping; retry after its restart"
            )

    async def cursor(self) -> duckdb.DuckDBPyConnection:
        """A fresh cursor of the file once it is :meth:`settled` (streamed exports); the
        caller closes it."""
        await self.settled()
        return self.conn.cursor()

    # ------------------------------------------------------------------ reads
    async def read(self, fn: Callable[[duckdb.DuckDBPyConnection], Any]) -> Any:
        """Runs ``fn`` on a fresh cursor in a reader thread, once the file is
        :meth:`settled`."""
        await self.settled()

        def run() -> Any:
            cur = self.conn.cursor()
            try:
                return fn(cur)
            finally:
                cur.close()

        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._readers, run)

    def page_events(
        self,
        cur: duckdb.DuckDBPyConnection,
        where: list[str],
        params: list,
        limit: int,
        max_bytes: int,
    ) -> tuple[list[dict], bool]:
        """At most ``limit`` events in log order, the page also stopping once its events' data
        passes ``max_bytes`` (at least one event): (events, whether more may follow)."""
        sql = (
            f"SELECT seq, at_ms, kind, task, actor, revision, data FROM events"
            f"{' WHERE ' + ' AND '.join(where) if where else ''} ORDER BY seq LIMIT ?"
        )
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
            out.append(
                {
                    "seq": r[0],
                    "at_ms": r[1],
                    "kind": r[2],
                    "task": r[3],
                    "actor": r[4],
                    "revision": r[5],
                    "data": json.loads(r[6]) if r[6] else {},
                }
            )
        return out, True

    # ------------------------------------------------------------------ shutdown
    def close(self) -> None:
        """Checkpoint (the WAL folded into the file) and close; called after the last
        commit. The file thread first applies what is queued (its jobs run in order)."""

        def fin() -> None:
            if self._copy is not None:
                self._copy.close()
            if self._filer is self._writer:
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
        if self._filer is not self._writer:
            try:
                self._filer.submit(fin).result()
            finally:
                self._filer.shutdown(wait=True)
                self._writer.submit(self.log.close).result()
                self._writer.shutdown(wait=True)
            return
        self._writer.submit(fin).result()
        self._writer.shutdown(wait=True)


RESUME_FREE_BYTES = 1 << 20
"""Free bytes beside the DuckDB file before writes resume after a full disk."""


def free_bytes(path: str) -> int | None:
    """Bytes free to this process on the filesystem of ``path``; None when unknown."""
    try:
        st = os.statvfs(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _nothing() -> None:
    """The file thread's barrier: it runs after every job submitted before it."""
