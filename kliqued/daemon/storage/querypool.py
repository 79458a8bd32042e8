"""Finance's ledger queries run on threads of their own, a few at a time, within a deadline.

Why a pool of their own: the event log's reads (``/v1/events``, the audit log) and finance's
ad-hoc SQL used to share two reader threads, so a few long finance queries kept every event
read waiting for as long as they ran. Here finance's queries have ``threads`` threads (so at
most that many run at once, each on its own cursor), at most ``max_waiting`` more wait in
line, and beyond that a query is refused at once as busy. A query's deadline is set by its
caller when the request arrives, so the time it waits in line counts against its limit: one
that is still waiting at its deadline is dropped without running, one that is running is
interrupted by ``run_readonly`` (``conn.interrupt()``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from typing import Any, Awaitable, Callable, Protocol, TypeVar

from kliqued.daemon.errors import Busy, Expired

T = TypeVar("T")

GRACE_S = 1.0
"""How long past its deadline a query may take to answer (its interrupt and clean-up)
before its caller stops waiting."""


class Handles(Protocol):
    """Where a pool's queries run: a handle opened for each query (a DuckDB cursor, a
    PostgreSQL connection kept per thread), released after it, interrupted at shutdown."""

    def open(self) -> Any: ...

    def call(self, fn: Callable[[Any], T], handle: Any) -> T:
        """``fn(handle)``, its errors as the handles' kind says (a lost connection)."""

    def release(self, handle: Any) -> None: ...

    def interrupt(self, handle: Any) -> None: ...


class DuckCursors:
    """A fresh cursor of the daemon's DuckDB connection for each query."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def open(self) -> Any:
        return self.conn.cursor()

    def call(self, fn: Callable[[Any], T], handle: Any) -> T:
        return fn(handle)

    def release(self, handle: Any) -> None:
        handle.close()

    def interrupt(self, handle: Any) -> None:
        handle.interrupt()


class QueryPool:
    def __init__(
        self,
        conn: Any,
        threads: int = 2,
        max_waiting: int = 8,
        handles: Handles | None = None,
        before: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """``conn``: the DuckDB connection whose cursors run the queries, or ``handles``:
        where they run instead (PostgreSQL: ``pgreader.Readers``). ``before``: awaited
        before each query (the Store's ``settled``: the file has what was committed)."""
        self._before = before
        self._handles: Handles = handles if handles is not None else DuckCursors(conn)
        self.handles = self._handles
        self.threads = threads
        self.max_waiting = max_waiting
        self._executor = concurrent.futures.ThreadPoolExecutor(
            threads, thread_name_prefix="ledger-sql"
        )
        self._pending = 0  # running + waiting; changed on the event loop's thread only
        self._running: set[Any] = set()  # cursors of running queries, for shutdown
        self._lock = threading.Lock()

    @property
    def pending(self) -> int:
        return self._pending

    async def run(self, fn: Callable[[Any], T], deadline: float) -> T:
        """Runs ``fn(cursor)`` on a fresh cursor (a handle) in one of the pool's threads. Raises
        :class:`Busy` when the line is full and :class:`Expired` when ``deadline``
        (``time.monotonic()``) passes before a thread takes it."""
        if self._pending >= self.threads + self.max_waiting:
            raise Busy(
                f"{self._pending} ledger queries are running or waiting "
                f"(at most {self.threads} run at once)"
            )
        self._pending += 1
        if self._before is not None:
            try:
                await self._before()
            except BaseException:
                self._pending -= 1
                raise
        started = concurrent.futures.Future()  # type: concurrent.futures.Future[None]

        def job() -> T:
            started.set_result(None)
            if time.monotonic() >= deadline:
                raise Expired()
            cur = self._handles.open()
            with self._lock:
                self._running.add(cur)
            try:
                return self._handles.call(fn, cur)
            finally:
                with self._lock:
                    self._running.discard(cur)
                self._handles.release(cur)

        try:
            future = self._executor.submit(job)
            wrapped = asyncio.wrap_future(future)
            try:
                return await asyncio.wait_for(
                    asyncio.shield(wrapped), max(0.0, deadline - time.monotonic()) + GRACE_S
                )
            except asyncio.TimeoutError:
                if future.cancel() or not started.done():
                    raise Expired() from None
                # running past its deadline and its grace: its interrupt is under way; the
                # answer is the timeout it will raise
                return await wrapped
        finally:
            self._pending -= 1

    def shutdown(self) -> None:
        """Drops waiting queries, interrupts the running ones and waits for them to end, so
        that a stop does not wait for a finance query's deadline."""
        self._executor.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            for cur in self._running:
                self._handles.interrupt(cur)
        self._executor.shutdown(wait=True)
