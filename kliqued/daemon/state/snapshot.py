"""Snapshots of the daemon's state, so that a restart replays only the log after the last one.

A snapshot is the Daemon's state at one sequence number (the engine's State, the records in
memory, workers and leases, schedules, pipelines, cloud nodes, ...: :data:`FIELDS`), pickled
and compressed, in the ``snapshots`` table of the DuckDB file (beside the task history it
goes with), with its format, the build that wrote it, its size and its SHA-256.

**Without stalling the sequencer.** The state is copied by ``fork()`` between two cycles,
when it equals the log up to ``Daemon.seq`` exactly: the child (copy-on-write) pickles and
sends the bytes down a pipe, then exits; the parent reads them on a thread and stores them in
a transaction of their own on the store's writer thread. The event loop only pays for the
fork (page tables: milliseconds) and one insert beside the batches. At a clean stop the
snapshot is taken in-process (nothing to stall any more).

**Crash-safe.** A snapshot is used only if its format is :data:`FORMAT`, it was written by
this very build (:func:`build_id`: a digest of the sources of every class it holds; an
upgrade replays the whole log once), its size and checksum match, it unpickles, and its
sequence number is not past the log's. Anything else is skipped with a warning, for the
previous one or a full replay: a snapshot can make a start faster, never wrong. It is
written and read only by kliqued in its own database, like the log it summarises.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import pickle
import resource
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import duckdb

if TYPE_CHECKING:
    from kliqued.daemon.state.daemon import Daemon
    from kliqued.daemon.storage.store import Store

log = logging.getLogger(__name__)

FORMAT = 1
"""The layout of a snapshot's body; bumped when :data:`FIELDS` changes meaning."""

EVERY = 100_000
"""Events between two snapshots by default (``kliqued serve --snapshot-every``)."""

KEEP = 2
"""Snapshots kept: the newest, and the one before it should the newest not load."""

FIELDS = (
    "index",
    "state",
    "access",
    "gpu_type",
    "session_idle",
    "group_path",
    "records",
    "ids",
    "placed_count",
    "stored",
    "idem",
    "alerts",
    "estate",
    "seq",
    "task_ids",
    "passes",
    "workers",
    "unleased",
    "schedules",
    "pipelines",
    "cloud",
    "eviction",
)
"""The Daemon's attributes a snapshot holds. Not: tokens (their table is their state),
live-only bookkeeping (gang offers, undelivered leases, the last pass's result, the reasons'
cache, the records read back from the history), and what comes from flags."""


_SOURCES = ("kliqued/daemon", "kliqued/engine", "kliqued/schedule", "compiler", "klique_util")
_build: str | None = None


def build_id() -> str:
    """A digest of the sources whose classes a snapshot pickles: a snapshot is loaded only
    by the build that wrote it."""
    global _build
    if _build is None:
        root = Path(__file__).resolve().parents[2]
        h = hashlib.sha256(f"format {FORMAT}".encode())
        for sub in _SOURCES:
            for f in sorted((root / sub).rglob("*.py")):
                h.update(str(f.relative_to(root)).encode())
                h.update(f.read_bytes())
        _build = h.hexdigest()[:32]
    return _build


# ---------------------------------------------------------------------- encoding
def encode(d: Daemon) -> bytes:
    """The state's body: :data:`FIELDS` and the clock, pickled, then compressed."""
    state = {k: getattr(d, k) for k in FIELDS}
    state["clock_last"] = d.clock.last
    return zlib.compress(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL), 1)


def restore(d: Daemon, body: bytes) -> None:
    """Sets ``d``'s :data:`FIELDS` from a body :func:`encode` made."""
    state: dict[str, Any] = pickle.loads(zlib.decompress(body))
    missing = [k for k in FIELDS if k not in state]
    if missing:
        raise ValueError(f"the snapshot lacks {', '.join(missing)}")
    keep = d.eviction.keep  # from this start's flags
    for k in FIELDS:
        setattr(d, k, state[k])
    d.eviction.keep = keep
    d.clock.at_least(int(state["clock_last"]))
    now = d.mono()
    for w in d.workers.values():  # monotonic times of the process that wrote it
        w.last_seen = now
        for lease in w.leases.values():
            lease.leased_mono = now


@dataclass
class Taken:
    seq: int
    body: bytes
    sha256: str


def take(d: Daemon) -> Taken:
    body = encode(d)
    return Taken(d.seq, body, hashlib.sha256(body).hexdigest())


def write(conn: duckdb.DuckDBPyConnection, snap: Taken, now_ms: int) -> None:
    """Stores ``snap`` and drops all but the newest :data:`KEEP` (in the caller's
    transaction)."""
    conn.execute(
        "INSERT INTO snapshots VALUES (?, ?, ?, ?, ?, ?, ?)",
        [snap.seq, FORMAT, build_id(), snap.sha256, len(snap.body), now_ms, snap.body],
    )
    conn.execute(
        "DELETE FROM snapshots WHERE seq NOT IN (SELECT seq FROM snapshots "
        "ORDER BY seq DESC LIMIT ?)",
        [KEEP],
    )


# ---------------------------------------------------------------------- loading
def load(d: Daemon, store: Store, last_seq: int) -> int:
    """Restores the newest usable snapshot into ``d``; returns its sequence number (the
    replay goes on after it), 0 when none is usable (a full replay)."""
    cur = store.conn.cursor()
    try:
        heads = cur.execute(
            "SELECT seq, format, build, sha256, size FROM snapshots ORDER BY seq DESC"
        ).fetchall()
        for seq, fmt, build, sha, size in heads:
            why = None
            if fmt != FORMAT:
                why = f"format {fmt}, this kliqued reads {FORMAT}"
            elif build != build_id():
                why = "written by another build of kliqued"
            elif seq > last_seq:
                why = f"it is past the log's last event ({last_seq})"
            if why is None:
                row = cur.execute(
                    "SELECT body FROM snapshots WHERE seq = ? AND sha256 = ?", [seq, sha]
                ).fetchone()
                body = bytes(row[0]) if row else b""
                if len(body) != size or hashlib.sha256(body).hexdigest() != sha:
                    why = "its body does not match its size and checksum (half-written)"
                else:
                    try:
                        restore(d, body)
                        return int(seq)
                    except Exception as exc:  # noqa: BLE001 — any failure: not this one
                        why = f"it does not load ({type(exc).__name__}: {exc})"
            log.warning("snapshot at event %d not used: %s", seq, why)
        return 0
    finally:
        cur.close()


# ---------------------------------------------------------------------- taking them live
class Snapshotter:
    """Takes a snapshot every ``every`` events, from a forked copy of the process (see the
    module's docstring); one at a time."""

    def __init__(self, d: Daemon, store: Store, every: int = EVERY) -> None:
        self.d = d
        self.store = store
        self.every = every
        self.last = d.snapshot_at
        """The sequence number of the last snapshot (0: none yet): after a long replay the
        first cycle takes one."""
        self.running: asyncio.Task | None = None
        self.taken = 0

    def maybe(self) -> None:
        """Called by the sequencer between cycles (the state equals the log at ``d.seq``):
        forks the copy now, collects it on a task."""
        if self.every <= 0 or self.running is not None or not self.d.ready:
            return
        if self.d.seq - self.last < self.every:
            return
        self.last = seq = self.d.seq
        try:
            r, w = os.pipe()
            try:
                pid = os.fork()
            except OSError:
                os.close(r)
                os.close(w)
                raise
        except OSError as exc:  # no memory or processes left: the next one will try again
            log.warning("snapshot at event %d not taken: %s", seq, exc)
            return
        if pid == 0:  # the child: a frozen copy of the state; it touches no database
            _child(self.d, w)
        os.close(w)
        self.running = asyncio.get_running_loop().create_task(self._collect(seq, pid, r))
        self.running.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self.running = None
        if not task.cancelled() and task.exception() is not None:
            log.warning("snapshot not taken: %s", task.exception())

    async def _collect(self, seq: int, pid: int, r: int) -> None:
        t0 = time.perf_counter()
        loop = asyncio.get_running_loop()
        try:
            data = await loop.run_in_executor(None, _read_all, r)
        finally:
            os.close(r)
            _, status = await loop.run_in_executor(None, os.waitpid, pid, 0)
        sha, _, body = data.partition(b"\n")
        if status != 0 or hashlib.sha256(body).hexdigest().encode() != sha:
            raise RuntimeError(f"the snapshot's process ended with status {status}")
        snap = Taken(seq, body, sha.decode())
        now = self.d.clock.now()
        await loop.run_in_executor(
            None, self.store.write_local, lambda conn: write(conn, snap, now)
        )
        self.taken += 1
        log.info(
            "snapshot at event %d: %.1f MiB in %.2f s",
            seq,
            len(body) / 2**20,
            time.perf_counter() - t0,
        )
        await loop.run_in_executor(None, self._after, seq)

    on_taken: Callable[[int], object] | None = None
    """Called on a thread with each new snapshot's sequence number (log compaction)."""

    def final(self) -> None:
        """At a clean stop, once the sequencer has stopped: a snapshot in-process, so that
        the next start replays nothing."""
        if self.every <= 0 or not self.d.ready or self.d.seq <= self.last:
            return
        snap = take(self.d)
        now = self.d.clock.now()
        self.store.write_local(lambda conn: write(conn, snap, now))
        self.last = snap.seq
        self._after(snap.seq)

    def _after(self, seq: int) -> None:
        if self.on_taken is None:
            return
        try:
            self.on_taken(seq)
        except Exception:  # compaction can wait for the next snapshot
            log.exception("after the snapshot at event %d", seq)

    async def wait(self) -> None:
        if self.running is not None:
            try:
                await self.running
            except Exception:  # noqa: BLE001 — logged by _done
                pass


def _child(d: Daemon, w: int) -> None:
    """In the forked child: close every inherited descriptor but the pipe's (sockets, the
    database files: the parent keeps them; a child outliving a killed parent must not hold
    its port or its PostgreSQL session), pickle, write, exit without cleanup."""
    code = 1
    try:
        os.closerange(3, w)
        os.closerange(w + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        delay = os.environ.get(TEST_DELAY_ENV)
        if delay:
            time.sleep(float(delay))
        body = encode(d)
        data = hashlib.sha256(body).hexdigest().encode() + b"\n" + body
        view = memoryview(data)
        while view:
            view = view[os.write(w, view[: 1 << 20]) :]
        code = 0
    finally:
        os._exit(code)


TEST_DELAY_ENV = "KLIQUED_TEST_SNAPSHOT_DELAY_S"
"""Tests only: the snapshot's child waits this long first (a kill -9 lands mid-snapshot)."""


def _read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    while True:
        b = os.read(fd, 1 << 20)
        if not b:
            return b"".join(chunks)
        chunks.append(b)
