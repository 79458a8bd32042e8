"""Rebuilding the daemon at start: every event of the log, in order, through the one
dispatch table (``reducers.REDUCERS``: each kind to the ``Daemon.on_*`` method the live path
uses), at the logged times.

Engine decisions are *applied* (``State.place``, ``State.preempt``, ...), never re-decided:
the rebuilt State equals the one that stopped, whatever the rules or the clock say now. The
bookkeeping only a pass keeps (which compute resources to look at, parked queues) starts from
"everything changed", so the first pass after a start looks at everything once.
"""

from __future__ import annotations

import gc
import json
import logging
import time
from dataclasses import dataclass

from kliqued.daemon.state import history, reducers, snapshot
from kliqued.daemon.auth import TokenRecord
from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.errors import ReplayError
from kliqued.daemon.events import Event
from kliqued.daemon.storage.store import Store

log = logging.getLogger(__name__)


@dataclass
class ReplayStats:
    events: int
    tasks: int
    seconds: float
    snapshot: int = 0
    """The sequence number of the snapshot the replay started from (0: the whole log)."""


def rebuild(d: Daemon, store: Store) -> ReplayStats:
    """Replays the log into ``d`` (with the cyclic collector paused: replay allocates
    hundreds of thousands of long-lived objects, and its full passes over them would cost
    more than the replay itself)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _rebuild(d, store)
    finally:
        if enabled:
            gc.enable()


def _rebuild(d: Daemon, store: Store) -> ReplayStats:
    t0 = time.perf_counter()
    n = 0
    last_task: str | None = None
    # A standby's replica (replica.py) reads the log through a connection of its own and
    # writes nothing: no snapshot, no history, every task kept in memory.
    bounded = isinstance(store, Store)
    start = d.snapshot_at = snapshot.load(d, store, store.last_seq()) if bounded else 0
    evict_at = d.eviction.keep + history.EVICT_PER_CYCLE if bounded else None
    for seq, at, kind, task, actor, revision, grp, usr, data_text in (
        store.read_events(after=start) if start else store.read_events()
    ):
        n += 1
        if evict_at is not None and len(d.eviction.ended) > evict_at:
            _evict(d, store, at)  # memory stays bounded through a long log
        d.clock.at_least(at)
        try:
            data = json.loads(data_text) if data_text else {}
            reducers.apply(d, Event(kind, task, actor, revision, grp, usr, data), at)
            if kind == "submitted":
                last_task = task
        except Exception as exc:
            raise ReplayError(
                f"event {seq} ({kind} {task or ''}) does not replay: {type(exc).__name__}: {exc}"
            ) from exc
        d.seq = seq
    d.task_ids.seed(last_task)
    for tid, h, principal, name, created, by, revoked, expires in store.read_tokens():
        d.tokens.add(TokenRecord(tid, h, principal, name, created, by, revoked, expires))
        d.token_ids.seed(tid)
    if bounded:
        history.mark_stored(d, store)
    return ReplayStats(n, len(d.records), time.perf_counter() - t0, start)


def _evict(d: Daemon, store: Store, at: int) -> None:
    """Ended tasks past what memory keeps, written to the history and dropped, as the
    sequencer does live (already there from before the restart: left as they are)."""
    recs = d.eviction.due(d)
    if recs:
        store.write_local(lambda conn: history.write_records(conn, recs))
        d.eviction.drop(d, recs, at)
