"""Rebuilding the daemon at start: every event of the log, in order, through the same
``Daemon.on_*`` methods the live path uses, at the logged times.

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

from compiler.compiled import CompiledEstate

from .auth import TokenRecord
from .core import Daemon
from .errors import ReplayError
from .store import Store

log = logging.getLogger(__name__)


@dataclass
class ReplayStats:
    events: int
    tasks: int
    seconds: float


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
    for seq, at, kind, task, actor, revision, _grp, _usr, data_text in store.read_events():
        n += 1
        d.clock.at_least(at)
        try:
            data = json.loads(data_text) if data_text else {}
            if kind == "submitted":
                d.on_submitted(task, at, actor, revision, data)
                last_task = task
            elif kind == "placed":
                d.on_placed(task, data["pool"], at, replay=True)
            elif kind == "preempted":
                d.on_preempted(task, at, data["kind"], data["text"], replay=True)
            elif kind == "cancelled":
                d.on_ended(task, at, "cancelled", reason=data.get("text"),
                           by=actor if data.get("by") == "request" else data.get("by"))
            elif kind == "ended":
                d.on_ended(task, at, data["kind"], data.get("reason"), data.get("epoch"),
                           data.get("exit_code"), data.get("signal"), bool(data.get("lost")),
                           message=data.get("message"))
            elif kind == "leased":
                d.on_leased(task, data["worker"], data["epoch"], at)
            elif kind == "started":
                d.on_started(task, data["epoch"], at)
            elif kind == "stopped":
                d.on_stopped(task, data["epoch"], at, data)
            elif kind == "unleased":
                d.on_unleased(task, data["epoch"], at)
            elif kind == "worker_registered":
                d.on_worker_registered(data, at)
            elif kind == "worker_lost":
                d.on_worker_lost(data["worker"], at)
            elif kind == "worker_deregistered":
                d.on_worker_deregistered(data["worker"], at)
            elif kind in ("engine_enabled", "engine_disabled"):
                d.on_engine(kind == "engine_enabled", at)
            elif kind == "alert":
                d.on_alert(data, at, replay=True)
            elif kind == "estate_applied":
                d.on_estate(CompiledEstate.model_validate(data["estate"]), data.get("source"),
                            at, data.get("commit"))
            elif kind == "estate_refused":
                d.estate.refused = {**data, "at": at}
            # token_created / token_revoked: the tokens table is their state
        except Exception as exc:
            raise ReplayError(f"event {seq} ({kind} {task or ''}) does not replay: "
                              f"{type(exc).__name__}: {exc}") from exc
        d.seq = seq
    d.task_ids.seed(last_task)
    for tid, h, principal, name, created, by, revoked, expires in store.read_tokens():
        d.tokens.add(TokenRecord(tid, h, principal, name, created, by, revoked, expires))
        d.token_ids.seed(tid)
    return ReplayStats(n, len(d.records), time.perf_counter() - t0)
