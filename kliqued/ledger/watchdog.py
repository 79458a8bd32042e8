"""A query's deadline, delivered until it holds.

DuckDB's ``interrupt()`` sets a flag that the running query checks between vectors; a flag
set while no query is running (the sandbox's ``EXPLAIN`` has just ended, the query proper not
yet begun) is cleared when the next query starts, so one interrupt at the deadline could be
lost and the query then ran to its end (a ``threading.Timer`` firing once did exactly that).
The watchdog fires at the deadline and keeps firing every :data:`REPEAT_S` until the caller
says the query is done, so whatever the query is doing when the deadline passes, the next
check it makes stops it.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

REPEAT_S = 0.05
"""How often the interrupt is sent again after the deadline, until the query is done."""


class Watchdog:
    """Calls ``interrupt()`` from a thread of its own at ``deadline`` (``time.monotonic()``)
    and again every :data:`REPEAT_S` until :meth:`stop`; :attr:`fired` says whether it did."""

    def __init__(self, interrupt: Callable[[], None], deadline: float) -> None:
        self._interrupt = interrupt
        self._deadline = deadline
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self.fired = False
        self._thread = threading.Thread(target=self._run, name="ledger-sql-deadline", daemon=True)

    def start(self) -> "Watchdog":
        self._thread.start()
        return self

    def _run(self) -> None:
        wait = self._deadline - time.monotonic()
        while not self._stopped.wait(max(0.0, wait)):
            with self._lock:  # never after stop(): the handle may be reused or closed
                if self._stopped.is_set():
                    return
                self.fired = True
                self._interrupt()
            wait = REPEAT_S

    def stop(self) -> None:
        """The query is done: no interrupt is sent after this returns."""
        with self._lock:
            self._stopped.set()
        self._thread.join()
