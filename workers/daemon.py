"""The worker daemon: registers, leases work, runs it, heartbeats, reports, uploads logs.

Asyncio loops over one state (``self.records``):

- lease (two of them): long-polls ``/workers/{id}/lease`` while some GPU has room and no
  lease is waiting for GPUs, and, in a request of its own, while a CPU-only slot
  (``--cpu-tasks``) is free; a lease's record is on disk with its pid right after its start,
  or at once when it waits for room (``_write_waiting``);
- heartbeat: every TTL/3, carries the tasks it runs, receives stop instructions;
- outbox: uploads the logs, then sends the reports (started, then finished/failed/stopped)
  of every task at once in one request (``POST /workers/{id}/reports``; one request a task
  against a control plane without it), retried until acknowledged; a ``409 stale-epoch``
  kills the task at once and forgets it;
- one supervisor per running task: notices the task's end at once (the executor's
  ``exit_waiter``, a pidfd; else it polls every 0.25 s), carries out a stop, records the end.

Every loop and supervisor is watched (``_watch``): one that raises, or returns while the
worker runs, is logged with its cause and the worker stops with exit code 1 (its heartbeats
stop with it; systemd restarts it and the restart takes the tasks back), rather than
heartbeating on while it no longer leases, reports or watches.

A state directory that cannot be written (full: ENOSPC; read-only; quota) is a fault the
worker rides out (``_state_fault``): the records stay in memory and their writes are retried
every second; the ends of tasks are reported from memory at once (the report, once
acknowledged, is the durable record); no lease is asked for, and one that arrives is given
back (``stopped``, reason ``cannot-work``: requeued at the front, no loss counted); the
heartbeats say ``cannot_work`` with the cause, which the control plane shows. The first
write that works again ends the fault and the leasing resumes. See docs/workers.md.

Task records are written atomically (a rename) as things happen, so a restart of the worker
process finds them; they are made durable (fsync, in a thread, for all of them at once)
before any report that depends on them is sent.

The control plane being down never stops the worker: every call is retried with backoff and
the tasks keep running. See docs/workers.md and docs/decisions.md.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import random
import shlex
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from klique_util.files import write_atomic
from klique_util.poolsettings import PoolSettings
from klique_util.units import DAY_S, gpus_to_milli
from workers import __version__, checkpoints, durable, idle, outputs, tunnel
from workers.client import LOG_CHUNK, ApiError, ControlPlaneClient, StaleEpoch, Unreachable
from klique_util import session_apps
from workers.executors.base import Executor, Exited, Handle, Start, Started, StartError
from workers.gpus import MILLI, Gpu, GpuAllocator
from workers.liveness import WRITE_EVERY_S, Liveness
from workers.state import ENDED, RUNNING, STARTING, StateDir, TaskRecord

log = logging.getLogger(__name__)


ROOM_AFTER_S = 0.05
"""A freed GPU is asked for with the report of its end, or this long after it at the latest
(``WorkerDaemon._room_soon``)."""

HEADROOM = 1 << 20
"""Free bytes the state dir needs before a fault of a full disk counts as over."""

TEST_PAUSE_ENV = "KLIQUE_WORKER_TEST_PAUSE_AFTER_START"
"""Tests only: a file path. After the executor started a batch and before its records are
written, the worker writes the batch's record keys to that file and sleeps, so that a test
can ``kill -9`` it inside that window (tests/workers/test_orphans.py)."""

MARK_FIELDS = ("task", "epoch", "lease", "milli", "gpus", "log_path", "leased_at")
"""The fields of a task's record handed with its start (``Start.mark``): what a restart
rebuilds the record from when the worker died before writing it."""


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class WorkerConfig:
    url: str
    pool: str
    token_file: str
    state_dir: str
    executor: str = "process"
    grace_s: float = 30.0
    retry_max_s: float = 30.0
    log_interval_s: float = 2.0
    log_retention_s: float = 7 * DAY_S
    hostname: str = ""
    drain: bool = False  # on shutdown: stop and hand back every task, then deregister
    cpu_tasks: int = 1  # CPU-only (0-GPU) tasks run at once, beside the GPU tasks
    session_apps: list[str] | None = None
    """The session apps it says it can start (``--session-apps``); None: those whose program
    the executor's tasks find on their PATH (``klique_util.session_apps``)."""


def _detected(executor: Executor) -> list[str] | None:
    """The session apps the executor's tasks find on their PATH (None: it cannot tell)."""
    path = executor.task_path()
    return None if path is None else session_apps.detect(path)


def default_cpu_tasks() -> int:
    """Half the machine's CPUs (at least 1): CPU-only tasks (preprocessing, evaluation)
    start even when every GPU is busy, and the other half stays for the GPU tasks' own CPU
    work (data loaders)."""
    return max(1, (os.cpu_count() or 2) // 2)


class Backoff:
    def __init__(self, initial: float = 0.5, maximum: float = 30.0):
        self.initial, self.maximum, self.current = initial, maximum, initial

    def next(self) -> float:
        delay = self.current * random.uniform(0.8, 1.2)
        self.current = min(self.current * 2, self.maximum)
        return min(delay, self.maximum)

    def reset(self) -> None:
        self.current = self.initial


class WorkerDaemon:
    def __init__(
        self,
        cfg: WorkerConfig,
        gpus: list[Gpu],
        executor: Executor,
        state: StateDir,
        client: ControlPlaneClient,
    ):
        self.cfg, self.gpus, self.executor, self.state, self.client = (
            cfg,
            gpus,
            executor,
            state,
            client,
        )
        self.worker_id = state.worker_id()
        client.worker_key = state.worker_key()  # proves this worker's id on every call
        self.alloc = GpuAllocator([g.index for g in gpus])
        self.records: dict[str, TaskRecord] = {}
        self.handles: dict[str, Handle] = {}
        self.supervisors: dict[str, asyncio.Task] = {}
        self.tunnels: dict[str, asyncio.Task] = {}
        """The open tunnel of each running session (workers/tunnel.py), by record key."""
        self.stop_events: dict[str, asyncio.Event] = {}
        self.ttl_s = 15.0
        self.poll_wait_s = 30.0
        self.apps = cfg.session_apps if cfg.session_apps is not None else _detected(executor)
        """The session apps it advertises, found once at start (None: it cannot tell)."""
        self.registered = asyncio.Event()
        self.room = asyncio.Event()  # set when GPUs were freed or a lease placed
        self.cpu_room = asyncio.Event()  # set when a CPU-only slot was freed
        self.outbox_wake = asyncio.Event()
        self.heartbeat_wake = asyncio.Event()  # a task checkpointed: tell the control plane now
        self.shutdown = asyncio.Event()
        self._down_since: float | None = None
        self._down_logged = 0.0
        self._register_lock = asyncio.Lock()
        self._dirty: set[Path] = set()  # records written but not fsync'ed yet
        self._unwritten: set[str] = set()  # leases accepted, not written yet (_write_waiting)
        self._janitor = ThreadPoolExecutor(1, thread_name_prefix="janitor")
        """Removes the files of forgotten tasks, in order, off the event loop."""
        self._batch_reports = True  # the control plane has POST /workers/{id}/reports
        # what the tasks' wrappers watch to stop orphans in time (workers/liveness.py)
        self.liveness = Liveness(state.root)
        self.cannot_work: str | None = None
        """Why this worker takes no work now (its state dir cannot be written), or None."""
        self.can_work = asyncio.Event()
        self.can_work.set()
        self._unsaved: dict[str, TaskRecord] = {}  # records whose last write failed
        self.failure: str | None = None
        """The loop or supervisor that failed (the worker then exits 1), or None."""

    def _contact(self, sent_at: float) -> None:
        """A request sent at ``sent_at`` (monotonic) was answered: the control plane counts
        its lost-worker TTL from then or later. The first one is written at once: a task
        leased by it must never start before its wrapper can see a deadline."""
        first = self.liveness.contact_at is None or self.liveness.ttl_s != self.ttl_s
        self.liveness.contact(sent_at, self.ttl_s)
        if first:
            try:
                self.liveness.write()
            except OSError as exc:
                log.warning("cannot write %s: %s", self.liveness.path, exc)

    # connectivity log lines --------------------------------------------------------------
    def _unreachable(self, what: str, exc: Exception, retry_in: float) -> None:
        now = time.monotonic()
        if self._down_since is None:
            self._down_since = now
            self._down_logged = now
            log.warning(
                "control plane %s unreachable (%s: %s); retrying in %.1fs, tasks keep running",
                self.client.base,
                what,
                exc,
                retry_in,
            )
        elif now - self._down_logged >= 60:
            self._down_logged = now
            log.warning(
                "control plane still unreachable after %.0fs (%s: %s)",
                now - self._down_since,
                what,
                exc,
            )
        else:
            log.debug("%s: %s; retrying in %.1fs", what, exc, retry_in)

    def _reachable(self) -> None:
        if self._down_since is not None:
            log.info(
                "control plane reachable again after %.1fs", time.monotonic() - self._down_since
            )
            self._down_since = None

    # records -----------------------------------------------------------------------------
    def _save(self, rec: TaskRecord) -> None:
        """Writes the record atomically (temporary file and rename: a restarted worker
        process finds it); ``_make_durable`` fsyncs it before anything is reported.

        Never raises: a write that fails (a full disk) leaves the record in memory, where
        it is the truth, and in ``_unsaved`` for ``retry_state`` (a raise here used to end
        the lease loop, the outbox and the task's supervisor, silently)."""
        path = self.state.tasks / f"{rec.key}.json"
        self._unwritten.discard(rec.key)
        try:
            write_atomic(path, json.dumps(rec.to_json()), fsync=False, mkdir=False)
        except OSError as exc:
            self._unsaved[rec.key] = rec
            self._state_fault(exc)
            return
        self._unsaved.pop(rec.key, None)
        self._dirty.add(path)

    def _state_fault(self, exc: OSError) -> None:
        """The state dir cannot be written: stop taking work until it can (see the module's
        docstring). Logged once per fault, with its cause."""
        if self.cannot_work is not None:
            return
        name = errno.errorcode.get(exc.errno or 0, "error")
        self.cannot_work = (
            f"state directory unwritable ({name} on {self.state.root}: {exc.strerror or exc})"
        )
        self.can_work.clear()
        log.error(
            "%s: leasing stops and leases that arrive are given back; the tasks' ends "
            "are kept in memory and reported; retrying the writes every %.0fs",
            self.cannot_work,
            WRITE_EVERY_S,
        )
        try:
            asyncio.get_running_loop().call_soon(self._place_pending)
        except RuntimeError:  # no loop (load() at start): the first lease round does it
            pass

    def retry_state(self) -> None:
        """Writes the records whose write failed, then (with ``HEADROOM`` free) a probe
        file; when everything is written, the fault is over and the lease loops ask for
        work again."""
        if self.cannot_work is None:
            return
        for rec in list(self._unsaved.values()):
            if rec.key in self.records:
                self._save(rec)
            else:
                self._unsaved.pop(rec.key, None)
            if rec.key in self._unsaved:
                return
        probe = self.state.root / ".writable"
        try:
            st = os.statvfs(self.state.root)
            if st.f_bavail * st.f_frsize < HEADROOM:
                return  # a deleted record's few KiB would only make the fault flap
            write_atomic(probe, b"\0" * 4096, fsync=False, mkdir=False)
            probe.unlink()
        except OSError:
            return
        log.warning(
            "state directory %s is writable again (%s is over): leasing resumes",
            self.state.root,
            self.cannot_work,
        )
        self.cannot_work = None
        self.can_work.set()
        self.room.set()
        self.cpu_room.set()

    async def _make_durable(self) -> None:
        if not self._dirty:
            return
        paths, self._dirty = self._dirty, set()
        try:
            await asyncio.get_running_loop().run_in_executor(
                None, durable.fsync_together, paths, self.state.tasks
            )
        except OSError as exc:  # the report goes anyway: acknowledged, it is the record
            self._state_fault(exc)

    def _forget(self, rec: TaskRecord) -> None:
        """The task's last report was acknowledged: out of memory now, its files (the
        record, its outputs, its checkpoint directories) removed by the janitor thread, since
        an unlink or rmdir costs milliseconds here and the lease and report loops share this
        event loop. Nothing reads them any more: the acknowledged report is the record, a
        new lease is a new epoch (another key), and a restart that still finds the record
        reports the end again, which the control plane acknowledges as a repeat, as it did
        when the worker died between the answer and the unlink."""
        self._janitor.submit(
            _remove_files,
            self.state.tasks / f"{rec.key}.json",
            rec.log_path,
            self.executor.leftovers(rec.key),
        )
        self._dirty.discard(self.state.tasks / f"{rec.key}.json")
        self._unsaved.pop(rec.key, None)
        self.records.pop(rec.key, None)
        self.handles.pop(rec.key, None)
        self.stop_events.pop(rec.key, None)
        self.supervisors.pop(rec.key, None)
        self._close_tunnel(rec)

    def _find(self, task: str, epoch: int | None = None) -> list[TaskRecord]:
        return [
            r
            for r in self.records.values()
            if r.task == task and (epoch is None or r.epoch == epoch)
        ]

    def _task_log(self, rec: TaskRecord, text: str) -> None:
        """A line of the worker's own in the task's log (stops, kills), so its owner sees
        why the task ended."""
        try:
            with open(rec.log_path, "ab") as fh:
                fh.write(f"[klique-worker {now_rfc3339()}] {text}\n".encode())
        except OSError:
            pass

    def _end(
        self,
        rec: TaskRecord,
        event: str,
        exit_code=None,
        sig=None,
        message: str | None = None,
        ended_at: str | None = None,
        save: bool = True,
    ) -> None:
        """``ended_at``: when the task ended, if its executor recorded it (the control plane
        charges until then); else now, when the worker sees it. ``save`` False: the end is
        not written to the task's record, which stays ``running`` on disk, because a restart
        would derive this same end again from what is on disk (``_finish``)."""
        self._free_room(rec)
        rec.state = ENDED
        rec.outcome = {
            "event": event,
            "exit_code": exit_code,
            "signal": sig,
            "at": ended_at or now_rfc3339(),
            "message": message,
        }
        if event == "finished" and rec.log_path:
            written = outputs.read(outputs.path_for(rec.log_path))
            if written:
                rec.outcome["outputs"] = written  # a pipeline's later steps use them
        if event == "stopped" and rec.stop is not None:
            # why it was stopped: the control plane's instruction, or the worker's own
            # decision ("idle": an idle limit; "shutdown": handed back by --drain)
            rec.outcome["reason"] = rec.stop.get("reason")
        if save:
            self._save(rec)
        self.outbox_wake.set()
        log.info(
            "task %s (epoch %s) %s: exit code %s, signal %s%s",
            rec.task,
            rec.epoch,
            event,
            exit_code,
            sig,
            f" ({message})" if message else "",
        )

    def _open_tunnel(self, rec: TaskRecord) -> None:
        """A running session's tunnel to the control plane (its requests come through it)."""
        port = rec.lease.get("session_port")
        if port is not None and rec.key not in self.tunnels:
            self.tunnels[rec.key] = asyncio.get_running_loop().create_task(
                tunnel.run(self.client, rec.task, rec.epoch, int(port)), name=f"tunnel {rec.key}"
            )

    def _close_tunnel(self, rec: TaskRecord) -> None:
        t = self.tunnels.pop(rec.key, None)
        if t is not None:
            t.cancel()

    def _free_room(self, rec: TaskRecord) -> None:
        """A task is ending: its GPUs (or its CPU-only slot) are free again, or it no longer
        waits for them; the lease loop of that kind of room asks for work. A session's
        tunnel closes."""
        self._close_tunnel(rec)
        if rec.state == RUNNING and rec.gpus:
            self.alloc.release(rec.gpus, rec.milli)
        if rec.state in (RUNNING, STARTING):
            self._room_soon(self.cpu_room if rec.milli == 0 else self.room)

    def _room_soon(self, room: asyncio.Event) -> None:
        """The lease loop asks for the freed room with the report of the end (``_flush_all``
        sets both rooms just before it sends a batch with an end), or after ``ROOM_AFTER_S``
        at the latest. A poll sent at the first end of a batch would be held with that one
        GPU as its room (a held poll keeps the room it was sent with), so the placements on
        the GPUs the rest of the batch frees would wait for another poll and another
        commit; sent with the report, it is held while the report is committed and gets
        every placement of the pass that follows, in that pass's commit."""
        try:
            asyncio.get_running_loop().call_later(ROOM_AFTER_S, room.set)
        except RuntimeError:  # no loop (load() before run): the first lease round asks
            room.set()

    # startup -----------------------------------------------------------------------------
    def load(self) -> None:
        """Reads the records an earlier run left; takes back the tasks that were running
        (their processes are watched by pid; their exits come from the wrapper's file),
        also those it started and was killed before recording (``_take_back_started``)."""
        # first of all: this process is the worker the tasks' wrappers watch now
        self.liveness.inherit()
        self.liveness.write()
        self.executor.settle()  # every start the earlier run asked for has left its mark
        for rec in self.state.load_all():
            self.records[rec.key] = rec
            if rec.state == STARTING and not rec.fenced:
                found = self.executor.started(rec.key)
                if found is not None:
                    self._take_back_started(found, rec)
            elif rec.state == RUNNING and rec.handle is not None:
                handle = self.executor.adopt(rec.handle)
                try:
                    self.alloc.take(rec.gpus, rec.milli)
                except Exception as exc:  # a changed --gpus list
                    log.warning(
                        "task %s: its GPUs %s cannot be taken back (%s)", rec.task, rec.gpus, exc
                    )
                self.handles[rec.key] = handle
                log.info(
                    "taking back task %s (epoch %s, pid %s)",
                    rec.task,
                    rec.epoch,
                    rec.handle.get("pid"),
                )
                self._supervise(rec)
                self._open_tunnel(rec)
            elif rec.state == RUNNING:  # the worker died between start and its record
                self._end(rec, "failed", message="the worker restarted while starting the task")
        for key in self.executor.started_keys():  # started, never recorded, still running
            if key not in self.records:
                found = self.executor.started(key)
                if found is not None and found.mark is not None:
                    self._take_back_started(found, None, only_running=True)
        self.state.prune_logs(self.cfg.log_retention_s, set(self.records))

    def _take_back_started(
        self, found: Started, rec: TaskRecord | None, only_running: bool = False
    ) -> TaskRecord | None:
        """A task an earlier run of this worker started and was killed before recording
        (its record still ``starting``, or none at all): its wrapper ran, so it is taken
        back like any running task (its start reported, its end read from its exit file),
        never started a second time. The record comes from ``rec`` or from the mark the
        start carried. ``only_running``: only if its wrapper still runs (a leftover marker
        of a task long reported is not a task)."""
        if rec is None:
            if found.mark is None:
                return None
            try:
                rec = TaskRecord.from_json(found.mark)
            except TypeError:
                return None
            rec.log_path = rec.log_path or str(self.state.log_path(rec))
        handle = self.executor.adopt(found.handle)
        if only_running and isinstance(self.executor.poll(handle), Exited):
            return None
        if found.mark is not None and found.mark.get("task") == rec.task:
            rec.gpus = [int(i) for i in found.mark.get("gpus") or []]
        rec.state, rec.handle = RUNNING, found.handle
        rec.started_at = found.started_at or now_rfc3339()
        rec.started_reported = False
        try:
            self.alloc.take(rec.gpus, rec.milli)
        except Exception as exc:  # a changed --gpus list
            log.warning("task %s: its GPUs %s cannot be taken back (%s)", rec.task, rec.gpus, exc)
        self.records[rec.key] = rec
        self.handles[rec.key] = handle
        self._save(rec)
        log.warning(
            "task %s (epoch %s): started by the earlier run of this worker (wrapper pid %s), "
            "which was stopped before it recorded the start: taken back, not started again",
            rec.task,
            rec.epoch,
            found.handle.get("pid"),
        )
        self._supervise(rec)
        self._open_tunnel(rec)
        return rec

    def register_body(self) -> dict:
        body = {
            "worker_id": self.worker_id,
            "hostname": self.cfg.hostname or socket.gethostname(),
            "pool": self.cfg.pool,
            "executor": self.executor.name,
            "gpus": [g.to_json() for g in self.gpus],
            "version": __version__,
        }
        if self.apps is not None:
            body["apps"] = self.apps
        return body

    async def register(self) -> None:
        """Registers (until it works) and reconciles the control plane's `running` list with
        the records."""
        async with self._register_lock:
            self.registered.clear()
            backoff = Backoff(maximum=self.cfg.retry_max_s)
            while not self.shutdown.is_set():
                try:
                    sent_at = time.monotonic()
                    answer = await self.client.register(self.register_body())
                    break
                except Unreachable as exc:
                    delay = backoff.next()
                    self._unreachable("register", exc, delay)
                    await self._sleep(delay)
                except ApiError as exc:
                    delay = max(backoff.next(), 5.0)
                    log.error(
                        "the control plane refuses to register this worker: %s; retrying in %.0fs",
                        exc,
                        delay,
                    )
                    await self._sleep(delay)
            else:
                return
            self._reachable()
            self.ttl_s = float(answer.get("heartbeat_ttl_s") or self.ttl_s)
            self.poll_wait_s = float(answer.get("poll_wait_s") or self.poll_wait_s)
            self._contact(sent_at)
            self.reconcile(answer.get("running") or [])
            log.info(
                "registered as %s in pool %s with %d GPUs (heartbeat TTL %.0fs)",
                self.worker_id,
                self.cfg.pool,
                len(self.gpus),
                self.ttl_s,
            )
            if answer.get("settings"):
                log.info(
                    "pool settings (each lease carries those in force): %s",
                    ", ".join(f"{k}={v}" for k, v in sorted(answer["settings"].items())),
                )
                self._unread_settings(answer)
            self.registered.set()
            self.room.set()
            self.cpu_room.set()
            self._place_pending()

    def reconcile(self, running: list[dict]) -> None:
        listed = {(str(r["task"]), int(r["epoch"])) for r in running}
        newest: dict[str, int] = {}
        for task, epoch in listed:
            newest[task] = max(epoch, newest.get(task, epoch))
        for rec in list(self.records.values()):
            if rec.fenced or rec.state == ENDED:
                continue  # the outbox reports the recorded end; fencing answers the rest
            if (rec.task, rec.epoch) in listed:
                continue
            if newest.get(rec.task, -1) > rec.epoch:
                self._fence(rec, f"the control plane runs it at epoch {newest[rec.task]}")
            else:
                self._request_stop(
                    rec,
                    "unlisted",
                    "the control plane no longer lists this task for this worker",
                    None,
                )
        for task, epoch in sorted(listed):
            if self._find(task, epoch):
                continue
            probe = TaskRecord(task=task, epoch=epoch, lease={"task": task, "epoch": epoch})
            found = self.executor.started(probe.key)
            if found is not None and self._take_back_started(found, None) is not None:
                continue  # started and killed before its record: taken back, reported
            log.warning(
                "the control plane lists task %s (epoch %s) on this worker, which "
                "has no record of it: reporting it as failed",
                task,
                epoch,
            )
            rec = TaskRecord(task=task, epoch=epoch, lease={"task": task, "epoch": epoch})
            rec.log_path = str(self.state.log_path(rec))
            self.records[rec.key] = rec
            self._end(
                rec,
                "failed",
                message="worker-lost: the worker restarted and has "
                "no record of this task (its state dir was lost or the lease never "
                "reached it)",
            )

    # leases ------------------------------------------------------------------------------
    def accept(self, lease: dict) -> None:
        task, epoch = str(lease["task"]), int(lease["epoch"])
        if self._find(task, epoch):
            return  # the same lease again: nothing to do
        for older in self._find(task):
            if older.epoch < epoch and not older.fenced and older.state != ENDED:
                self._fence(older, f"leased again at epoch {epoch}")
        self._unread_settings(lease)
        rec = TaskRecord(
            task=task, epoch=epoch, lease=lease, milli=gpus_to_milli(lease.get("gpus"))
        )
        rec.log_path = str(self.state.log_path(rec))
        self.records[rec.key] = rec
        self._unwritten.add(rec.key)  # on disk once the lease round placed it (_write_waiting)
        command = shlex.join(lease.get("command") or []) or "(no command)"
        log.info(
            "leased task %s (epoch %s, %s GPUs): %s",
            task,
            epoch,
            lease.get("gpus"),
            command if len(command) <= 200 else command[:197] + "...",
        )
        if self.cannot_work is not None:
            self._give_back(rec)
        elif rec.milli == 0 and self.cfg.cpu_tasks <= 0:
            self._end(
                rec,
                "failed",
                message=f"worker {self.worker_id} runs no CPU-only tasks (--cpu-tasks 0)",
            )
        elif not self.alloc.fits_ever(rec.milli):
            self._end(
                rec,
                "failed",
                message=f"the task needs {lease.get('gpus')} GPUs and "
                f"worker {self.worker_id} has {len(self.gpus)}",
            )

    def _unread_settings(self, lease: dict) -> None:
        """A pool setting this worker's executor does not read is ignored, with one warning
        per key (a typo, or a setting for another scheduler: docs/executors.md)."""
        for key in PoolSettings.from_lease(lease).unread_by(self.executor.name):
            self.executor.warn_once(
                f"unread:{key}",
                f"pool {self.cfg.pool}: settings.{key} means nothing to the "
                f"{self.executor.name} executor: ignored",
            )

    def _give_back(self, rec: TaskRecord) -> None:
        """A lease this worker cannot run now (its state dir cannot be written): reported
        ``stopped`` with reason ``cannot-work``, which the control plane requeues at the
        front without counting a loss."""
        log.error(
            "task %s (epoch %s): lease given back, this worker cannot work: %s",
            rec.task,
            rec.epoch,
            self.cannot_work,
        )
        rec.stop = {
            "reason": "cannot-work",
            "text": self.cannot_work or "",
            "grace_s": 0.0,
            "at": now_rfc3339(),
        }
        self._end(rec, "stopped", message=self._stop_text(rec))

    def _place_pending(self) -> None:
        """Starts every leased task that has room now, oldest lease first, in one batch
        (``_start_all``)."""
        if not self.registered.is_set():
            return
        batch: list[tuple[TaskRecord, list[int]]] = []
        cpu_slots = self.cfg.cpu_tasks - self._cpu_running()
        for rec in sorted(self.records.values(), key=lambda r: r.leased_at):
            if rec.state != STARTING or rec.fenced:
                continue
            if self.cannot_work is not None and rec.stop is None:
                self._give_back(rec)
                continue
            if rec.stop is not None:
                self._end(rec, "stopped", message=self._stop_text(rec))
                continue
            if rec.milli == 0:
                if cpu_slots <= 0:
                    continue  # waits for a CPU-only slot
                cpu_slots -= 1
                batch.append((rec, []))
                continue
            gpus = self.alloc.place(rec.milli)
            if gpus is None:
                continue  # waits for GPUs (a task being stopped frees them)
            batch.append((rec, gpus))
        if batch:
            self._start_all(batch)

    def _start_all(self, batch: list[tuple[TaskRecord, list[int]]]) -> None:
        """Starts the batch's tasks (their GPUs taken) with one ``start_many`` of the
        executor: the process executor's fork server forks them all before it waits for
        any, where one start after the other cost a round of the scheduler each (10 to 25
        ms a task on a busy machine, with this event loop blocked). Each record is on disk
        (``accept``) before its start, and written with its handle after, as before."""
        starts: list[Start] = []
        for rec, gpus in batch:
            rec.gpus = gpus
            out_path = outputs.path_for(rec.log_path)
            outputs.remove(out_path)  # a file from an earlier attempt is not this one's
            checkpoints.prepare(rec.log_path)  # nor its checkpoint mark and notice
            env = {
                **(rec.lease.get("env") or {}),
                outputs.ENV: out_path,
                **checkpoints.task_env(rec.log_path),
            }
            if tunnel.is_session(rec.lease):  # its app listens on a local port of its own
                rec.lease = {**rec.lease, "session_port": tunnel.free_port()}
                env.update(tunnel.session_env(rec.task, rec.lease["session_port"]))
            mark = {k: getattr(rec, k) for k in MARK_FIELDS}
            starts.append(Start({**rec.lease, "env": env}, gpus, Path(rec.log_path), mark))
        results = self.executor.start_many(starts)
        if TEST_PAUSE_ENV in os.environ:
            _test_pause(os.environ[TEST_PAUSE_ENV], [rec.key for rec, _ in batch])
        for (rec, gpus), handle in zip(batch, results):
            if isinstance(handle, StartError):
                self.alloc.release(gpus, rec.milli)
                self._end(rec, "failed", message=str(handle))
                continue
            rec.state, rec.handle, rec.started_at = RUNNING, handle.to_record(), now_rfc3339()
            self.handles[rec.key] = handle
            self._save(rec)
            log.info("started task %s (epoch %s) on GPUs %s", rec.task, rec.epoch, gpus or "none")
            self._supervise(rec)
            self._open_tunnel(rec)
        self.outbox_wake.set()

    def _cpu_running(self) -> int:
        """CPU-only tasks holding a slot (running, or being stopped)."""
        return sum(r.milli == 0 and r.state == RUNNING for r in self.records.values())

    def _cpu_free(self) -> int:
        """CPU-only tasks this worker would start now: the cap less those running or leased
        and waiting."""
        waiting = sum(
            r.milli == 0 and r.state == STARTING and not r.fenced for r in self.records.values()
        )
        return max(0, self.cfg.cpu_tasks - self._cpu_running() - waiting)

    def _has_gpu_room(self) -> bool:
        """Whether to ask for GPU work: a GPU with room and no GPU task waiting for GPUs."""
        gpu_waiting = any(
            r.state == STARTING and not r.fenced and r.milli > 0 for r in self.records.values()
        )
        return self.alloc.has_room() and not gpu_waiting

    def _gpu_lease_body(self) -> dict:
        free = self.alloc.free()
        return {
            "free_gpus": self.alloc.fully_free(),
            # an extension agreed in docs/worker-protocol.md: room on shared GPUs
            "gpu_free": [{"index": i, "free": f / MILLI} for i, f in free.items() if f],
            # CPU-only work comes through the other loop's requests
            "cpu_free": 0,
        }

    def _cpu_lease_body(self) -> dict:
        """CPU-only slots only (--cpu-tasks): never GPU room, so that the two loops' polls,
        held at the same time, never lease the same room twice."""
        return {"free_gpus": [], "gpu_free": [], "cpu_free": self._cpu_free()}

    async def lease_loop(self, kind: str = "gpu") -> None:
        """Long-polls for one kind of room: GPU room, or CPU-only slots. Two loops, because
        a held poll is never cancelled (W13) and keeps the room it was sent with: a poll for
        CPU-only slots held while every GPU is busy must not delay the GPU work that a freed
        GPU can take at once."""
        if kind == "gpu":
            has_room, room, body = self._has_gpu_room, self.room, self._gpu_lease_body
        else:
            has_room, room, body = (
                (lambda: self._cpu_free() > 0),
                self.cpu_room,
                self._cpu_lease_body,
            )
        backoff = Backoff(maximum=self.cfg.retry_max_s)
        while not self.shutdown.is_set():
            await self.registered.wait()
            if self.cannot_work is not None:
                await self._wait(self.can_work)
                continue
            if not has_room():
                room.clear()
                await self._wait(room)
                continue
            try:
                sent_at = time.monotonic()
                leases = await self.client.lease(self.worker_id, body(), self.poll_wait_s)
            except Unreachable as exc:
                delay = backoff.next()
                self._unreachable("lease", exc, delay)
                await self._sleep(delay)
                continue
            except ApiError as exc:
                if exc.status == 404:
                    log.warning("the control plane does not know this worker: registering again")
                    await self.register()
                    continue
                delay = max(backoff.next(), 5.0)
                log.error("lease refused: %s; retrying in %.0fs", exc, delay)
                await self._sleep(delay)
                continue
            backoff.reset()
            self._reachable()
            self._contact(sent_at)
            try:
                for lease in leases:
                    try:
                        self.accept(lease)
                    except (KeyError, ValueError, TypeError) as exc:
                        log.error("ignoring a malformed lease %r: %s", lease, exc)
                self._place_pending()
            finally:
                self._write_waiting()

    def _write_waiting(self) -> None:
        """Writes the records of the leases just accepted that did not start (they wait for
        room): a restart must find them. A lease started at once was written with its pid
        right after its start (``_start_all``), and one that ended at once with its end: its
        first write, the lease alone, bought nothing (before the start nothing of it runs,
        and a worker killed there finds the control plane listing a task it has no record
        of, which it reports lost: requeued at the front), and it was a third of the
        records' renames, each one waiting on the file system's journal here."""
        for key in list(self._unwritten):
            rec = self.records.get(key)
            if rec is not None:
                self._save(rec)
        self._unwritten.clear()

    # heartbeats and stop instructions ----------------------------------------------------
    def running_list(self) -> list[dict]:
        out = []
        for rec in self.records.values():
            if rec.fenced:
                continue
            # an ended task not yet reported is listed "ended": only "running" tells the
            # control plane that it still ran (it charges its end no earlier than that)
            state = {STARTING: "starting", ENDED: "ended"}.get(rec.state, "running")
            item = {"task": rec.task, "epoch": rec.epoch, "state": state}
            if rec.checkpoint_at is not None and rec.state == RUNNING:
                item["checkpoint_at"] = rec.checkpoint_at  # the control plane keeps the newest
            out.append(item)
        return out

    def _look_for_checkpoint(self, rec: TaskRecord) -> None:
        """A new time on the task's checkpoint file (it checkpointed): recorded, and the
        heartbeat that relays it goes now rather than at its next turn (a preemption in
        between would count the work since the previous checkpoint as lost)."""
        ns = checkpoints.changed(rec.log_path, rec.checkpoint_ns)
        if ns is None:
            return
        rec.checkpoint_ns, rec.checkpoint_at = ns, checkpoints.rfc3339(ns)
        self._save(rec)
        log.info("task %s (epoch %s) checkpointed at %s", rec.task, rec.epoch, rec.checkpoint_at)
        self.heartbeat_wake.set()

    async def heartbeat_loop(self) -> None:
        while not self.shutdown.is_set():
            await self.registered.wait()
            interval = max(self.ttl_s / 3, 0.2)
            try:
                sent_at = time.monotonic()
                answer = await self.client.heartbeat(
                    self.worker_id,
                    self.running_list(),
                    timeout_s=max(interval, 2.0),
                    cannot_work=self.cannot_work,
                )
            except Unreachable as exc:
                self._unreachable("heartbeat", exc, interval)
            except ApiError as exc:
                if exc.status == 404:
                    log.warning(
                        "heartbeat: the control plane does not know this worker "
                        "(declared lost?): registering again"
                    )
                    await self.register()
                    continue
                log.error("heartbeat refused: %s", exc)
            else:
                self._reachable()
                if answer.get("ttl_s"):
                    self.ttl_s = float(answer["ttl_s"])
                self._contact(sent_at)
                for stop in answer.get("stop") or []:
                    self.on_stop_instruction(stop)
            self.heartbeat_wake.clear()
            await self._wait(self.heartbeat_wake, max(self.ttl_s / 3, 0.2))

    def on_stop_instruction(self, stop: dict) -> None:
        task, epoch = str(stop.get("task")), stop.get("epoch")
        recs = self._find(task, int(epoch) if epoch is not None else None)
        if not recs:
            log.debug("stop instruction for unknown task %s (epoch %s)", task, epoch)
        for rec in recs:
            if stop.get("reason") == "stale-epoch":  # proposed: fencing through a heartbeat
                self._fence(rec, f"stop instruction: stale epoch {stop.get('text') or ''}")
                continue
            self._request_stop(
                rec, stop.get("reason") or "stopped", stop.get("text") or "", stop.get("grace_s")
            )

    def _stop_text(self, rec: TaskRecord) -> str:
        s = rec.stop or {}
        return f"{s.get('reason')}: {s.get('text')}" if s.get("text") else str(s.get("reason"))

    def _request_stop(self, rec: TaskRecord, reason: str, text: str, grace_s) -> None:
        if rec.stop is not None or rec.state == ENDED or rec.fenced:
            return
        if grace_s is None:
            grace_s = rec.lease.get("grace_s", self.cfg.grace_s)
        rec.stop = {"reason": reason, "text": text, "grace_s": float(grace_s), "at": now_rfc3339()}
        self._save(rec)
        log.info(
            "stop task %s (epoch %s): %s; grace %.0fs",
            rec.task,
            rec.epoch,
            self._stop_text(rec),
            float(grace_s),
        )
        if rec.state == STARTING:
            self._end(rec, "stopped", message=self._stop_text(rec))
            self._place_pending()
        elif rec.key in self.stop_events:
            self.stop_events[rec.key].set()

    def _fence(self, rec: TaskRecord, why: str) -> None:
        """Stale epoch: kill the task at once and forget it; nothing more is reported."""
        if rec.fenced:
            return
        log.warning(
            "task %s (epoch %s) is fenced (%s): killing it at once", rec.task, rec.epoch, why
        )
        rec.fenced = True
        self._save(rec)
        if rec.state == RUNNING and rec.key in self.stop_events:
            self._task_log(rec, f"fenced: {why}; killing the task at once")
            self.stop_events[rec.key].set()
        else:
            if rec.state == STARTING:
                self._place_pending()
            self._forget(rec)

    # supervision -------------------------------------------------------------------------
    def _supervise(self, rec: TaskRecord) -> None:
        self.stop_events[rec.key] = event = asyncio.Event()
        if rec.stop is not None or rec.fenced:
            event.set()  # a stop requested before a restart is carried out
        self.supervisors[rec.key] = self._watch(
            asyncio.get_running_loop().create_task(
                self._supervisor(rec, self.handles[rec.key], event), name=f"task {rec.key}"
            )
        )

    async def _supervisor(self, rec: TaskRecord, handle: Handle, event: asyncio.Event) -> None:
        waiter = getattr(self.executor, "exit_waiter", None)
        exited = waiter(handle) if waiter is not None else None
        try:
            while True:
                if event.is_set():
                    if rec.fenced:
                        result = await self.executor.stop(handle, 0)
                    else:
                        grace = float((rec.stop or {}).get("grace_s", self.cfg.grace_s))
                        self._notify(rec, grace)
                        self._task_log(
                            rec,
                            f"stop ({self._stop_text(rec)}): SIGTERM now, "
                            f"SIGKILL after {grace:g}s if still running",
                        )
                        result = await self.executor.stop(handle, grace)
                    break
                polled = self.executor.poll(handle)
                if isinstance(polled, Exited):
                    result = polled
                    break
                self._look_for_checkpoint(rec)
                idle.watch(self, rec, handle)  # session idle limits (workers/idle.py)
                stop_wait = asyncio.ensure_future(event.wait())
                waits = {stop_wait}
                if exited is not None and not exited.done():
                    waits.add(exited)
                try:
                    await asyncio.wait(waits, timeout=0.25, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    stop_wait.cancel()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never let one task take the worker down
            log.exception("task %s: supervision failed", rec.task)
            result = Exited(None, None, f"the worker could not watch the task: {exc}")
        finally:
            if exited is not None:
                exited.cancel()
        self._finish(rec, result)

    def _notify(self, rec: TaskRecord, grace_s: float) -> None:
        """The stop's notice in ``$KLIQUE_PREEMPT_FILE``, before the SIGTERM: the task's
        handler reads why and until when (klique_util/taskfiles.py). A notice that cannot
        be written does not hold the stop back."""
        s = rec.stop or {}
        try:
            checkpoints.write_notice(
                rec.log_path, str(s.get("reason") or "stopped"), str(s.get("text") or ""), grace_s
            )
        except OSError as exc:
            log.warning(
                "task %s: cannot write its preemption notice (%s); SIGTERM only", rec.task, exc
            )

    def _finish(self, rec: TaskRecord, result: Exited) -> None:
        if rec.fenced:
            self._free_room(rec)
            log.info("fenced task %s (epoch %s) is gone; forgotten", rec.task, rec.epoch)
            self._forget(rec)
            self._place_pending()
            return
        message: str | None
        if rec.stop is not None:
            event = "stopped"
            message = self._stop_text(rec)
            ended = (
                f"exit code {result.exit_code}"
                if result.signal is None
                else f"signal {result.signal}"
            )
            self._task_log(rec, f"stopped ({ended})")
        elif (result.message or "").startswith("worker-lost"):
            # its wrapper stopped it because this worker was gone too long (an orphan,
            # workers/liveness.py): lost, so that the control plane runs it again
            event, message = "failed", result.message
        elif result.exit_code == 0 and result.signal is None:
            event, message = "finished", result.message
        else:
            event, message = "failed", result.message
        # the exit is in the wrapper's exit file (fsync'ed by it), the stop in the record
        # already: a restart before the report adopts the record, finds the wrapper gone,
        # and ends the task the same way, so the end's record write bought nothing but a
        # rename that waits on the journal (issue 29)
        self._end(
            rec,
            event,
            result.exit_code,
            result.signal,
            message,
            result.ended_at,
            save=not result.recorded or rec.handle is None,
        )
        self._place_pending()

    # reports and logs --------------------------------------------------------------------
    async def outbox_loop(self) -> None:
        backoff = Backoff(maximum=self.cfg.retry_max_s)
        while not self.shutdown.is_set():
            await self.registered.wait()
            self.outbox_wake.clear()
            try:
                await self._flush_all()
            except Unreachable as exc:
                delay = backoff.next()
                self._unreachable("report", exc, delay)
                await self._sleep(delay)
                continue
            backoff.reset()
            busy = any(r.state != STARTING for r in self.records.values())
            await self._wait(
                self.outbox_wake, self.cfg.log_interval_s if busy else max(self.ttl_s, 5)
            )

    def _reportable(self) -> list[TaskRecord]:
        return [
            r
            for r in sorted(self.records.values(), key=lambda r: r.leased_at)
            if not r.fenced and r.state != STARTING
        ]

    async def _flush_all(self) -> None:
        """Uploads the logs, then sends every report due in one request."""
        if not self._batch_reports:
            for rec in self._reportable():
                await self._flush(rec)
            return
        items: list[tuple[TaskRecord, dict]] = []
        for rec in self._reportable():
            try:
                await self._upload_log(rec)
            except ApiError as exc:
                self._refused(rec, exc)
                continue
            if rec.key not in self.records or rec.fenced:
                continue
            if rec.started_at and not rec.started_reported:
                items.append(
                    (
                        rec,
                        {
                            "event": "started",
                            "at": rec.started_at,
                            "exit_code": None,
                            "signal": None,
                            "message": None,
                        },
                    )
                )
            outcome = rec.outcome
            if rec.state == ENDED and outcome and outcome.get("event"):
                items.append((rec, dict(outcome)))
        if not items:
            return
        await self._make_durable()
        if any(body["event"] != "started" for _, body in items):
            self.room.set()  # the lease loops ask for what these ends free (``_room_soon``)
            self.cpu_room.set()
        try:
            sent_at = time.monotonic()
            answers = await self.client.reports(
                self.worker_id, [{"task": r.task, "epoch": r.epoch, **b} for r, b in items]
            )
        except ApiError as exc:
            if (
                exc.status in (404, 405)
                and exc.code != "unknown-worker"
                and "worker" not in exc.message
            ):
                log.info(
                    "the control plane has no batch report endpoint (%s): one report a request", exc
                )
                self._batch_reports = False
                return await self._flush_all()
            if exc.status == 404:
                log.warning(
                    "reports: the control plane does not know this worker: registering again"
                )
                await self.register()
                return
            raise Unreachable(str(exc)) from exc
        self._contact(sent_at)
        for (rec, body), answer in zip(items, answers):
            if rec.key not in self.records or rec.fenced:
                continue
            status = int(answer.get("status", 200))
            if 200 <= status < 300:
                if body["event"] == "started":
                    # not written: a restart reports the start again, which the control
                    # plane acknowledges as a repeat (a rename less a task: issue 29)
                    rec.started_reported = True
                else:
                    log.info("task %s (epoch %s): %s reported", rec.task, rec.epoch, body["event"])
                    self._forget(rec)
                continue
            err = answer.get("error") or {}
            code, message = err.get("code", f"http-{status}"), err.get("message", "")
            if status >= 500 or status in (408, 429):
                continue  # retried with the next round
            exc_cls = StaleEpoch if status == 409 and code == "stale-epoch" else ApiError
            self._refused(rec, exc_cls(status, code, message))

    def _refused(self, rec: TaskRecord, exc: ApiError) -> None:
        if isinstance(exc, StaleEpoch):
            self._fence(rec, f"409 stale-epoch from the control plane: {exc.message}")
        elif exc.status == 404:
            log.warning(
                "the control plane does not know task %s: stopping and forgetting it", rec.task
            )
            self._fence(rec, "the control plane does not know the task")
        else:
            log.error("task %s: report refused (%s); giving up on it", rec.task, exc)
            if rec.state == ENDED:
                self._forget(rec)
            else:
                rec.started_reported = True
                self._save(rec)

    async def _flush(self, rec: TaskRecord) -> None:
        if rec.fenced or rec.state == STARTING or rec.key not in self.records:
            return
        try:
            if rec.started_at and not rec.started_reported:
                await self._make_durable()
                await self._report(
                    rec,
                    {
                        "event": "started",
                        "at": rec.started_at,
                        "exit_code": None,
                        "signal": None,
                        "message": None,
                    },
                )
                rec.started_reported = True
                self._save(rec)
            await self._upload_log(rec)
            outcome = rec.outcome
            if rec.state == ENDED and outcome and outcome.get("event"):
                await self._make_durable()
                await self._report(rec, dict(outcome))
                log.info("task %s (epoch %s): %s reported", rec.task, rec.epoch, outcome["event"])
                self._forget(rec)
        except ApiError as exc:
            self._refused(rec, exc)

    async def _report(self, rec: TaskRecord, body: dict) -> None:
        body = {"epoch": rec.epoch, **body}
        await self.client.report(rec.task, body)

    async def _upload_log(self, rec: TaskRecord) -> None:
        if rec.log_broken:
            return
        try:
            size = os.path.getsize(rec.log_path)
        except OSError:
            return
        for _ in range(8):  # at most 2 MiB a round per task, so that others get their turn
            if rec.log_uploaded >= size:
                return
            with open(rec.log_path, "rb") as fh:
                fh.seek(rec.log_uploaded)
                chunk = fh.read(LOG_CHUNK)
            try:
                new = await self.client.upload_log(rec.task, rec.epoch, rec.log_uploaded, chunk)
            except StaleEpoch:
                raise
            except ApiError as exc:
                if exc.status == 404:
                    raise
                rec.log_broken = str(exc)
                log.error("task %s: log upload refused (%s); no more log is sent", rec.task, exc)
                self._save(rec)
                return
            rec.log_uploaded = max(0, new)
            self._save(rec)

    # running -----------------------------------------------------------------------------
    async def _sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self.shutdown.wait(), seconds)
        except asyncio.TimeoutError:
            pass

    async def _wait(self, event: asyncio.Event, timeout: float | None = None) -> None:
        waits = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(self.shutdown.wait())]
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def liveness_loop(self) -> None:
        """Rewrites the liveness file every second: the tasks' wrappers see this worker alive
        (and its last contact with the control plane, from which they count)."""
        while not self.shutdown.is_set():
            try:
                self.liveness.write()
            except OSError as exc:  # kept fresh in place (liveness.py); the fault is told
                self._state_fault(exc)
            self.retry_state()
            await self._sleep(WRITE_EVERY_S)

    async def drain(self) -> None:
        """``--drain``: stops every task (SIGTERM, grace, SIGKILL), reports them ``stopped``
        with ``reason: "shutdown"`` (the control plane requeues them at the front without
        counting a loss), then deregisters (``DELETE /workers/{id}``). A second signal, or
        the control plane staying away for a minute, ends the wait; what is left is taken
        back at the next start as after any stop."""
        log.info(
            "draining: stopping %d task(s) and handing them back",
            sum(r.state != ENDED and not r.fenced for r in self.records.values()),
        )
        for rec in list(self.records.values()):
            if rec.state != ENDED and not rec.fenced:
                self._request_stop(rec, "shutdown", "the worker is shutting down (--drain)", None)
        await asyncio.gather(*list(self.supervisors.values()), return_exceptions=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                await self._flush_all()
            except Unreachable as exc:
                log.warning("draining: reports not sent yet (%s)", exc)
                await asyncio.sleep(1)
                continue
            if not any(not r.fenced for r in self.records.values()):
                break
            await asyncio.sleep(0.2)
        try:
            await self.client.deregister(self.worker_id)
            log.info("deregistered %s", self.worker_id)
        except (Unreachable, ApiError) as exc:
            log.warning(
                "deregistering failed (%s): the control plane declares this worker "
                "lost after its TTL",
                exc,
            )

    def _watch(self, t: asyncio.Task, *, returns: bool = True) -> asyncio.Task:
        """Notices a loop or supervisor that dies: one that raised (or, with ``returns``
        False, that returned) while the worker runs. The worker then stops, exit code 1: a
        worker that heartbeats on without its lease, report or supervision loops holds GPUs
        for ever (issue 26); its supervisor (systemd) restarts it, and the restart takes the
        tasks back from their records and exit files."""

        def done(t: asyncio.Task) -> None:
            if t.cancelled() or self.shutdown.is_set():
                return
            exc = t.exception()
            if exc is None and returns:
                return
            self.failure = f"{t.get_name()}: " + (
                f"{type(exc).__name__}: {exc}" if exc else "returned"
            )
            log.critical(
                "the worker's %s failed (%s); stopping with exit code 1, so that "
                "its supervisor restarts it (the restart takes the tasks back)",
                t.get_name(),
                self.failure,
                exc_info=exc,
            )
            self.shutdown.set()

        t.add_done_callback(done)
        return t

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self.shutdown.set)
            except (NotImplementedError, RuntimeError):  # pragma: no cover
                pass
        log.info(
            "klique-worker %s starting: id %s, pool %s, control plane %s, state %s",
            __version__,
            self.worker_id,
            self.cfg.pool,
            self.client.base,
            self.state.root,
        )
        self.load()
        loops = [
            self._watch(loop.create_task(self.register(), name="register")),
            *(
                self._watch(loop.create_task(coro, name=name), returns=False)
                for coro, name in (
                    (self.lease_loop("gpu"), "lease loop"),
                    (self.lease_loop("cpu"), "cpu-only lease loop"),
                    (self.heartbeat_loop(), "heartbeat loop"),
                    (self.outbox_loop(), "report loop"),
                    (self.liveness_loop(), "liveness loop"),
                )
            ),
        ]
        try:
            await self.shutdown.wait()
            if self.cfg.drain and self.failure is None:
                await self.drain()
        finally:
            for t in loops:
                t.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            for t in [*self.supervisors.values(), *self.tunnels.values()]:
                t.cancel()
            await asyncio.gather(*self.tunnels.values(), return_exceptions=True)
            await asyncio.gather(*self.supervisors.values(), return_exceptions=True)
            close = getattr(self.executor, "close", None)
            if close is not None:
                close()
            self._janitor.shutdown(wait=True)  # the forgotten tasks' files are gone
            await self.client.close()
            alive = sum(r.state == RUNNING for r in self.records.values())
            log.info(
                "klique-worker stopped; %d task(s) keep running and are taken back when "
                "the worker starts again with the same --state-dir",
                alive,
            )


def _test_pause(path: str, keys: list[str]) -> None:
    """``TEST_PAUSE_ENV``: says which records were started, then blocks the worker (a
    test kills it here)."""
    write_atomic(Path(path), "\n".join(keys) + "\n")
    time.sleep(3600)


def _remove_files(record: Path, log_path: str, leftovers: list[Path]) -> None:
    """A forgotten task's record, outputs, checkpoint directories and what its executor
    left (the wrapper's start marker): the janitor's job."""
    try:
        record.unlink(missing_ok=True)
        for path in leftovers:
            path.unlink(missing_ok=True)
        if log_path:
            outputs.remove(outputs.path_for(log_path))
            checkpoints.clear(log_path)
    except OSError as exc:  # a full or read-only disk: the start's pruning retries
        log.warning("cannot remove the files of %s: %s", record.stem, exc)
