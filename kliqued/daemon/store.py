"""The DuckDB file: schema, the group-commit write path and the read paths.

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
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import duckdb

from kliqued.ledger import schema as ledger_schema

from .errors import DatabaseLocked
from .events import COLUMNS
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

DbOp = Callable[[duckdb.DuckDBPyConnection], object]
"""A write of a batch's transaction, on its connection (what it returns is ignored: the
ledger's writers return counts)."""


@dataclass
class Batch:
    rows: list[tuple] = field(default_factory=list)
    """Event rows, seq already assigned, in log order."""
    ops: list[DbOp] = field(default_factory=list)
    """Other writes of the same transaction, in order."""


class Store:
    def __init__(self, path: str) -> None:
        self.path = path
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
        self._appender: Any = None

    # ------------------------------------------------------------------ setup
    def ensure_schema(self) -> None:
        # DuckDB checkpoints inside the commit that crosses this much WAL, stalling the
        # sequencer (~100+ ms, measured); the daemon checkpoints at every clean stop, so a
        # large threshold moves that work there. A crash replays the WAL at the next open.
        self.conn.execute(f"SET checkpoint_threshold = '{CHECKPOINT_WAL}'")
        for stmt in SCHEMA:
            self.conn.execute(stmt)
        ledger_schema.ensure_schema(self.conn)

    def last_seq(self) -> int:
        row = self.conn.execute("SELECT max(seq) FROM events").fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def read_events(self, chunk: int = 20_000) -> Iterator[tuple]:
        """Every event in log order, as (seq, at_ms, kind, task, actor, revision, grp, usr,
        data text)."""
        cur = self.conn.cursor()
        try:
            cur.execute(f"SELECT {', '.join(COLUMNS)} FROM events ORDER BY seq")
            while True:
                rows = cur.fetchmany(chunk)
                if not rows:
                    return
                yield from rows
        finally:
            cur.close()

    def read_tokens(self) -> list[tuple]:
        return self.conn.execute(
            "SELECT id, hash, principal, name, created_at_ms, created_by, revoked_at_ms, "
            "expires_at_ms FROM tokens ORDER BY id").fetchall()

    # ------------------------------------------------------------------ writes
    def _commit(self, batch: Batch) -> None:
        conn = self.conn
        if self._appender is None:
            self._appender = conn.appender("events")
        conn.execute("BEGIN TRANSACTION")
        try:
            if batch.rows:
                self._appender.append_rows(batch.rows)
                self._appender.flush()
            for op in batch.ops:
                op(conn)
            conn.execute("COMMIT")
        except BaseException:
            try:
                self._appender.clear()
                conn.execute("ROLLBACK")
            except Exception:
                pass
            raise

    def commit_sync(self, batch: Batch) -> None:
        """For start-up (before the loop runs) and tools."""
        self._writer.submit(self._commit, batch).result()

    async def commit(self, batch: Batch) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._writer, self._commit, batch)

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
            if self._appender is not None:
                self._appender = None
            self.conn.execute("CHECKPOINT")
            self.conn.close()
        self._readers.shutdown(wait=True)
        self.ledger_queries.shutdown()
        self._writer.submit(fin).result()
        self._writer.shutdown(wait=True)
