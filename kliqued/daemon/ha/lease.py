"""The leader's lease in PostgreSQL: which of several ``kliqued serve`` on one database may
write, and the fencing token that stops a deposed one (issue 18 part 2, docs/ha.md).

One row, ``klique_leader`` (migration 2 of ``pglog``): the holder, its advertised URL, the
**epoch** (the fencing token: raised by one at every takeover, never lowered) and the
lease's expiry. Times are PostgreSQL's own (``clock_timestamp()``), so the daemons' clocks
never have to agree.

- The leader renews the expiry every ``renew_s`` (a thread of its own, with its own
  connection, so a long replay or a busy event loop does not starve it); a renewal that
  finds another epoch means the lease was taken: the leader is **deposed**.
- A standby reads the row (to know where to redirect) and, once the expiry has passed, takes
  the row by a compare-and-set on the epoch it saw: of two standbys at once, one wins.
- **Fencing**: every write transaction of the leader (``PgLog.write``) first reads the row
  ``FOR SHARE`` and compares the epoch with its own (:data:`FENCE_SQL`). A takeover's
  ``UPDATE`` waits for that share lock, so a batch either commits before the takeover (and
  the new leader replays it) or sees the new epoch and fails with :class:`Deposed`: a
  deposed leader, even one paused past its TTL and resumed, can never write again.

A batch an older kliqued left prepared (its two-phase commit with the ledger's file, gone
since the file follows PostgreSQL) keeps its share lock until it is ended and would block
every takeover, so a standby commits such orphans before taking the row
(``Store.recover``, called through ``before_takeover``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Callable

import psycopg

from kliqued.daemon.errors import Deposed
from kliqued.daemon.storage.pglog import FENCE_SQL  # the log checks the epoch the lease keeps

__all__ = ["Deposed", "FENCE_SQL", "LeaderInfo", "Lease", "LeaseSettings"]

log = logging.getLogger(__name__)

LOCK_TIMEOUT = "1s"
"""How long a renewal or a takeover waits for the row (a batch in flight holds it shared)."""


@dataclass(frozen=True)
class LeaderInfo:
    """The lease row as one read saw it."""

    epoch: int
    holder: str | None
    url: str | None
    live: bool
    """The expiry is still ahead (PostgreSQL's clock)."""


@dataclass(frozen=True)
class LeaseSettings:
    ttl_s: float = 5.0
    """A leader not heard of for this long may be replaced."""
    renew_s: float = 1.0
    """How often the leader renews, and a standby looks."""

    @classmethod
    def for_ttl(cls, ttl_s: float) -> "LeaseSettings":
        """Renew five times per TTL, and at least once a second."""
        return cls(ttl_s, min(1.0, ttl_s / 5))


def new_holder() -> str:
    """This process's name in the row: host, pid and a random part (a restarted daemon with
    the same pid is another holder)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Lease:
    """The lease as one daemon sees it, on a PostgreSQL connection of its own."""

    def __init__(
        self,
        url: str,
        advertise_url: str | None,
        settings: LeaseSettings = LeaseSettings(),
        holder: str | None = None,
    ) -> None:
        self.url = url
        self.advertise_url = advertise_url
        self.settings = settings
        self.holder = holder or new_holder()
        self.epoch: int | None = None
        """Ours while we lead; None while standing by."""
        self.leader: LeaderInfo | None = None
        """The last row read (for the standby's redirects and ``/v1/leader``)."""
        self.before_takeover: Callable[[], None] | None = None
        """Ends batches a dead leader left prepared (they hold the row): ``Store.recover``."""
        self.on_lost: Callable[[], None] | None = None
        """Called (from the renewal thread) when a renewal finds the lease taken."""
        self.lost = threading.Event()
        self._valid_until = 0.0
        """While we lead: when the lease ends on this daemon's clock (``time.monotonic()``)
        unless renewed, counted from before the write that took or renewed it."""
        self._conn: psycopg.Connection | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ connection
    def _c(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(
                self.url, autocommit=True, application_name="kliqued-lease", connect_timeout=5
            )
        return self._conn

    def _drop(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:
                pass
            self._conn = None

    # ------------------------------------------------------------------ the row
    def read(self) -> LeaderInfo:
        with self._lock:
            row = (
                self._c()
                .execute(
                    "SELECT epoch, holder, url, expires_at > clock_timestamp() FROM klique_leader "
                    "WHERE id = 1"
                )
                .fetchone()
            )
        assert row is not None, "klique_leader has its row from migration 2"
        self.leader = LeaderInfo(int(row[0]), row[1], row[2], bool(row[3]))
        return self.leader

    def try_acquire(self) -> bool:
        """Takes the lease if it has expired; True when this daemon now leads (``epoch``
        set). Connection errors are the caller's to retry."""
        seen = self.read()
        if seen.live:
            return False
        if self.before_takeover is not None:
            self.before_takeover()
        sent = time.monotonic()
        try:
            row = self._update_row(
                "UPDATE klique_leader SET epoch = epoch + 1, holder = %s, url = %s, "
                "expires_at = clock_timestamp() + make_interval(secs => %s), "
                "acquired_at = clock_timestamp() WHERE id = 1 AND epoch = %s "
                "AND expires_at <= clock_timestamp() RETURNING epoch",
                [self.holder, self.advertise_url, self.settings.ttl_s, seen.epoch],
            )
        except psycopg.errors.LockNotAvailable:
            return False  # a batch still holds the row: next time
        if row is None:
            return False  # another standby was first
        self.epoch = int(row[0])
        self._valid_until = sent + self.settings.ttl_s
        self.lost.clear()
        self.leader = LeaderInfo(self.epoch, self.holder, self.advertise_url, True)
        log.info("lease taken: epoch %d (holder %s)", self.epoch, self.holder)
        return True

    def renew(self) -> bool:
        """Moves the expiry on; False when the lease is no longer ours (deposed). A row busy
        past the lock timeout is not a loss: the next renewal tries again."""
        if self.epoch is None:
            return False
        sent = time.monotonic()
        try:
            row = self._update_row(
                "UPDATE klique_leader SET expires_at = clock_timestamp() + "
                "make_interval(secs => %s) WHERE id = 1 AND epoch = %s AND holder = %s "
                "RETURNING 1",
                [self.settings.ttl_s, self.epoch, self.holder],
            )
        except psycopg.errors.LockNotAvailable:
            return True
        if row is not None:
            self._valid_until = sent + self.settings.ttl_s
        return row is not None

    def holds(self) -> bool:
        """We lead and our lease has not run out on this daemon's clock. After a pause
        (SIGSTOP past the TTL) the epoch is still set until the renewal thread runs and
        finds the lease taken; this is false at once, so nothing claims to lead meanwhile."""
        return self.epoch is not None and time.monotonic() < self._valid_until

    def _update_row(self, sql: str, params: list) -> tuple | None:
        """The takeover's and the renewal's one write: ``sql`` (an ``UPDATE ... RETURNING``
        of the row) in a transaction of its own that waits at most ``LOCK_TIMEOUT`` for the
        row, since a batch in flight holds it shared. Its returned row, None when the
        compare-and-set matched nothing; ``LockNotAvailable`` when the row stayed busy
        (each caller reads that its own way)."""
        with self._lock:
            conn = self._c()
            with conn.transaction():
                conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
                return conn.execute(sql, params).fetchone()

    def release(self) -> None:
        """A clean stop: the lease ends now, so a standby takes over at its next look rather
        than after the TTL."""
        self.stop_renewing()
        if self.epoch is None:
            return
        try:
            with self._lock:
                self._c().execute(
                    "UPDATE klique_leader SET expires_at = '-infinity' WHERE id = 1 AND "
                    "epoch = %s AND holder = %s",
                    [self.epoch, self.holder],
                )
        except psycopg.Error as exc:
            log.warning("the lease was not released (%s): a standby takes over after its TTL", exc)
        self.epoch = None

    # ------------------------------------------------------------------ renewal thread
    def start_renewing(self) -> None:
        """Renews every ``renew_s`` until stopped or lost; a loss sets :attr:`lost`, forgets
        the epoch and calls :attr:`on_lost`."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_loop, name="lease", daemon=True)
        self._thread.start()

    def stop_renewing(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)
        self._thread = None

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.settings.renew_s):
            try:
                ours = self.renew()
            except psycopg.Error as exc:
                # PostgreSQL unreachable: the writes fail too (fatal there); keep trying here
                log.warning("lease renewal failed: %s", str(exc).strip().splitlines()[0])
                self._drop()
                continue
            if not ours:
                self._deposed()
                return

    def _deposed(self) -> None:
        try:
            info = self.read()
            who = f"epoch {info.epoch}, {info.holder} at {info.url}"
        except psycopg.Error:
            who = "unknown"
        log.warning("deposed: the lease (epoch %s) was taken (%s); standing by", self.epoch, who)
        self.epoch = None
        self.lost.set()
        if self.on_lost is not None:
            try:
                self.on_lost()
            except RuntimeError:  # the leader's loop ended already (it found out first)
                pass

    def close(self) -> None:
        self.stop_renewing()
        with self._lock:
            self._drop()


def wait_s(settings: LeaseSettings) -> float:
    """How long a standby sleeps between two looks."""
    return max(0.05, settings.renew_s / 2)
