"""What the Slurm, PBS and LSF executors share: a lease becomes one batch job, submitted with
its script on the submit command's stdin, watched by one status query for all of the worker's
jobs, stopped by a signal and then by force (slurm.py, pbs.py, lsf.py).

A scheduler is described by a ``Scheduler`` (its command lines, its job script and the
parsers of its outputs, pure functions tested against the real Slurm here and against
recorded outputs of the real commands: tests/workers/recorded/pbs, lsf) and run by
``BatchExecutor``:

- **Start**: ``Scheduler.submit(...)`` with ``Scheduler.script(...)`` on stdin, in the
  worker's environment plus the lease's (the scheduler exports it to the job); the job id
  from ``Scheduler.job_id(stdout)``. The script appends the command's output to the task's
  log (Slurm: sbatch's ``--output``) and runs it under the worker's exit wrapper, which
  writes the exact exit code or signal to ``STATE_DIR/run/<key>.exit`` (state dir and log
  on a file system the execution hosts share).
- **The task's files**: the checkpoint mark, the preemption notice and the outputs file sit
  beside the log (workers/checkpoints.py, outputs.py); their paths reach the job in the
  exported environment (``KLIQUE_CHECKPOINT_FILE``, ``KLIQUE_PREEMPT_FILE``,
  ``KLIQUE_OUTPUTS_FILE``), so a job sees them wherever it sees its log: on the worker's
  host, or on a file system the execution hosts share. The worker writes the notice before
  the stop's SIGTERM and watches the checkpoint mark, as for a process.
- **State**: the exit file first; else one ``Scheduler.status`` query for every job of the
  worker (``Scheduler.max_ids`` at a time) at most every ``poll_interval_s``; a job the
  scheduler shows ended (or no longer knows) without an exit file ends with the
  scheduler's exit status, if it gives one (``_end_status``: Slurm asks scontrol, sacct,
  its jobcomp file), as ``Scheduler.outcome`` reads it.
- **Stop**: a queued job is cancelled. A running one gets SIGTERM (``Scheduler.signal``:
  every process of the job); after the grace, ``Scheduler.kill``, and ``Scheduler.purge``
  if the job is still listed a while later (``_kill_waits``); ``Scheduler.after_kill``,
  if any, once a killed job has ended.
- **Adopt**: by job id after the worker's restart.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import re
import shlex
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from klique_util.filemodes import open_private, original_umask
from klique_util.units import gpus_to_milli
from workers.executors.base import RUNNING, Executor, Exited, Handle, Running, StartError
from workers.executors.process import WRAPPER, ProcessExecutor
from workers.gpus import MILLI, Gpu

log = logging.getLogger(__name__)

CMD_TIMEOUT_S = 30.0


def job_name(task: str) -> str:
    """The job's name in the scheduler's listings: ``klique-<task>``, in the characters
    every one of them accepts."""
    return "klique-" + re.sub(r"[^A-Za-z0-9._-]", "_", str(task))[:100]


def gres_count(milli: int) -> int:
    """GPUs a task of `milli` milli-GPUs asks a scheduler for: a fraction takes a whole one."""
    if milli <= 0:
        return 0
    return max(1, math.ceil(milli / MILLI))


@dataclass(frozen=True)
class JobStatus:
    """One job as the scheduler shows it."""

    state: str  # the scheduler's own word (R, Q, F; RUN, PEND, EXIT)
    active: bool  # still queued or running: it holds or waits for resources
    started: bool  # it has started (a stop signals it rather than cancels)
    exit_code: int | None = None  # once ended, if the scheduler says
    signal: str | None = None
    detail: str = ""  # times, the scheduler's reason: for the task's message
    exit_text: str = ""  # the exit status in the scheduler's words (Slurm: 7:0)
    source: str = ""  # where an ended job's status came from (Slurm: scontrol)


class Scheduler(ABC):
    """A batch system's commands and the parsers of their outputs (no I/O here)."""

    name: str
    queue_key = "queue"  # the pool setting (and worker flag) naming the job's queue
    queue_flag = "--queue"
    max_ids: int | None = None  # job ids one status query takes (None: any number)
    stop_poll_s = 0.5  # how often a stop asks whether the job has ended

    @abstractmethod
    def submit(
        self,
        lease: dict,
        *,
        gpus: int,
        queue: str | None,
        workdir: str,
        extra: list[str],
        log_path: str | Path | None = None,
    ) -> list[str]:
        """The submit command line; the script goes to its stdin."""

    def script(
        self, lease: dict, exit_path: str | Path, log_path: str | Path, workdir: str, python: str
    ) -> str:
        """The job script the submit command gets on its stdin."""
        return batch_script(lease, exit_path, log_path, workdir, self.name, python)

    @abstractmethod
    def job_id(self, stdout: str) -> str | None:
        """The job id in the submit command's output, None if there is none."""

    @abstractmethod
    def status(self, job_ids: list[str]) -> list[str]:
        """The status query for these jobs."""

    @abstractmethod
    def parse_status(self, stdout: str) -> dict[str, JobStatus]:
        """Job id -> status, from the status query's output (absent: unknown to it)."""

    @abstractmethod
    def cancel(self, job_id: str) -> list[str]:
        """Removes a job that has not started."""

    @abstractmethod
    def signal(self, job_id: str, sig: str) -> list[str]:
        """Sends ``sig`` (``TERM``) to every process of a running job."""

    @abstractmethod
    def kill(self, job_id: str) -> list[str]:
        """Ends a running job by force."""

    @abstractmethod
    def purge(self, job_id: str) -> list[str]:
        """Removes a job the kill did not end (its host does not answer)."""

    def unknown_job(self, stderr: str) -> bool:
        """The status query failed only because it knows none of the jobs (its stderr and
        stdout: bjobs -json says so in its JSON)."""
        return False

    def after_kill(self, job_id: str) -> list[str] | None:
        """A command for what a killed job may leave behind, run once it has ended."""
        return None

    def describe(self, job_id: str, st: JobStatus | None) -> list[str]:
        """The first words of an ended task's message: the job and what the scheduler
        shows of it."""
        parts = [f"{self.name} job {job_id}"]
        if st is not None:
            parts.append(st.state + (f", {st.detail}" if st.detail else ""))
        return parts

    def outcome(
        self, st: JobStatus | None, *, cancelled_pending: bool, killed_by: str | None
    ) -> tuple[int | None, str | None, str]:
        """(exit code, signal, explanation) of a job that ended without an exit file."""
        if cancelled_pending:
            return None, None, "cancelled before it started"
        if st is not None and (st.exit_code is not None or st.signal is not None):
            return st.exit_code, st.signal, f"exit status from {self.name}"
        return (
            None,
            killed_by,
            (
                "the job is gone and its end is unknown (no exit file, the "
                "scheduler no longer shows it)"
            ),
        )


def batch_script(
    lease: dict,
    exit_path: str | Path,
    log_path: str | Path,
    workdir: str,
    scheduler: str,
    python: str = sys.executable,
    wrapper: str = WRAPPER,
) -> str:
    """The job script of a lease: output appended to the task's log, the command under the
    exit wrapper as ``cmd & wait`` with ``trap ':' TERM`` (the script outlives its command,
    which gets the scheduler's SIGTERM itself and may checkpoint)."""
    cmd = shlex.join(lease["command"])
    py, wr, ex = shlex.quote(python), shlex.quote(wrapper), shlex.quote(str(exit_path))
    return f"""#!/bin/bash
# klique task {lease["task"]} (epoch {lease["epoch"]}), submitted by klique-worker ({scheduler}).
exec >>{shlex.quote(str(log_path))} 2>&1
cd {shlex.quote(workdir)} || exit 1
trap ':' TERM INT HUP
if [ -x {py} ] && [ -r {wr} ]; then
    {py} -I {wr} {ex} -- {cmd} &
else
    {cmd} &
fi
_klique_pid=$!
while :; do
    wait "$_klique_pid"; _klique_rc=$?
    kill -0 "$_klique_pid" 2>/dev/null || break
done
exit "$_klique_rc"
"""


@dataclass
class BatchHandle(Handle):
    job_id: str
    exit_path: str
    submitted_at: float = 0.0  # time.monotonic() of the submission (0: adopted)
    status: JobStatus | None = field(default=None, repr=False)
    killed_by: str | None = None
    cancelled_pending: bool = False
    result: Exited | None = field(default=None, repr=False)

    @property
    def state(self) -> str | None:
        """The scheduler's word for the job while it was last seen active (None: not yet)."""
        return self.status.state if self.status is not None else None

    def to_record(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "exit_path": self.exit_path}


class BatchExecutor(Executor[BatchHandle]):
    """A ``Scheduler``'s jobs as tasks (module docstring)."""

    scheduler: Scheduler

    def __init__(
        self,
        state_dir: str | Path,
        queue: str | None = None,
        venv: str | Path | None = None,
        workdir: str | Path | None = None,
        base_env: dict[str, str] | None = None,
        gpus: list[Gpu] | None = None,
        python: str | None = None,
        batch_args: list[str] | None = None,
        poll_interval_s: float = 1.0,
        kill_wait_s: float = 30.0,
    ):
        self.run_dir = Path(state_dir) / "run"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.queue = queue
        self.workdir = str(Path(workdir).resolve()) if workdir else os.getcwd()
        self.python = python or sys.executable
        self.batch_args = list(batch_args or [])
        self.poll_interval_s, self.kill_wait_s = poll_interval_s, kill_wait_s
        self._env_builder = ProcessExecutor(
            state_dir, venv=venv, workdir=workdir, base_env=base_env, gpus=gpus
        )
        self.cmd_env = dict(base_env if base_env is not None else os.environ)
        self._active: dict[str, BatchHandle] = {}
        self._snap: dict[str, JobStatus] = {}
        self._snap_at = -1.0
        self._snap_ok = True
        self._warned_at = 0.0

    def _run(
        self, cmd: list[str], stdin: str | None = None, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            cmd,
            input=stdin,
            capture_output=True,
            text=True,
            env=env or self.cmd_env,
            timeout=CMD_TIMEOUT_S,
            umask=original_umask(),
        )

    def environment(self, lease: dict, gpu_indices: list[int]) -> dict[str, str]:
        env = self._env_builder.environment(lease, gpu_indices)
        env.pop("CUDA_VISIBLE_DEVICES", None)  # the scheduler sets it from the job's GPUs
        return env

    # Executor ----------------------------------------------------------------------------
    def start(self, lease: dict, gpu_indices: list[int], log_path: Path) -> BatchHandle:
        sched = self.scheduler.name
        command = lease.get("command")
        if not command:
            raise StartError(f"the {sched} executor runs commands and this task has none")
        if not isinstance(command, list) or not all(isinstance(a, str) for a in command):
            raise StartError(f"the task's command must be a list of strings, not {command!r}")
        exit_path = self.run_dir / f"{Path(log_path).stem}.exit"
        exit_path.unlink(missing_ok=True)
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        os.close(open_private(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT))
        self.setting(
            lease, self.scheduler.queue_key, self.scheduler.queue_flag, self.queue
        )  # warns on a clash
        cmd = self.scheduler.submit(
            lease,
            gpus=gres_count(gpus_to_milli(lease.get("gpus"))),
            queue=self.queue,
            workdir=self.workdir,
            extra=self.batch_args,
            log_path=log_path,
        )
        script = self.scheduler.script(lease, exit_path, log_path, self.workdir, self.python)
        try:
            p = self._run(cmd, stdin=script, env=self.environment(lease, gpu_indices))
        except (OSError, subprocess.SubprocessError) as exc:
            raise StartError(f"{cmd[0]} failed: {exc}") from exc
        job = self.scheduler.job_id(p.stdout)
        if p.returncode != 0 or job is None:
            raise StartError(f"{cmd[0]} refused the job: {(p.stderr or p.stdout).strip()}")
        h = BatchHandle(job_id=job, exit_path=str(exit_path), submitted_at=time.monotonic())
        self._active[job] = h
        log.debug("task %s: %s job %s", lease["task"], sched, job)
        return h

    def adopt(self, record: dict[str, Any]) -> BatchHandle:
        h = BatchHandle(job_id=str(record["job_id"]), exit_path=str(record["exit_path"]))
        self._active[h.job_id] = h
        return h

    def _exit_file(self, h: BatchHandle) -> dict | None:
        try:
            return json.loads(Path(h.exit_path).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def _refresh(self, ids: list[str]) -> None:
        """The status of these jobs (absent from the snapshot: unknown to the scheduler), in
        queries of at most ``Scheduler.max_ids``; a failed query keeps the old snapshot."""
        snap: dict[str, JobStatus] = {}
        ok, err = True, ""
        step = self.scheduler.max_ids or max(1, len(ids))
        for i in range(0, len(ids), step):
            try:
                p = self._run(self.scheduler.status(ids[i : i + step]))
                ok = p.returncode == 0 or self.scheduler.unknown_job(p.stderr + p.stdout)
                err = p.stderr.strip()
            except (OSError, subprocess.SubprocessError) as exc:
                ok, err = False, str(exc)
            if not ok:
                break
            snap.update(self.scheduler.parse_status(p.stdout))
        if ok:
            for job in ids:
                if job in snap:
                    self._snap[job] = snap[job]
                else:
                    self._snap.pop(job, None)
        else:
            now = time.monotonic()
            if now - self._warned_at > 60:
                self._warned_at = now
                log.warning(
                    "%s status query failed (%s): its jobs are taken as still running",
                    self.scheduler.name,
                    err,
                )
        self._snap_ok = ok
        self._snap_at = time.monotonic()

    def _status(self, h: BatchHandle, fresh: bool = False) -> tuple[bool, JobStatus | None]:
        """(whether the query answered, the job's status: None if the scheduler does not
        know the job)."""
        if fresh:
            self._refresh([h.job_id])
        elif self._snap_at < max(h.submitted_at, time.monotonic() - self.poll_interval_s):
            self._refresh(
                sorted(j for j, a in self._active.items() if a.result is None) or [h.job_id]
            )
        return self._snap_ok, self._snap.get(h.job_id)

    def poll(self, h: BatchHandle, fresh: bool = False) -> Running | Exited:
        if h.result is not None:
            return h.result
        if (rec := self._exit_file(h)) is not None:
            return self._ended(h, rec, h.status)
        answered, st = self._status(h, fresh)
        if not answered:
            return RUNNING
        if st is not None and st.active:
            h.status = st
            return RUNNING
        return self._ended(h, self._exit_file(h), st)

    def _end_status(self, h: BatchHandle, st: JobStatus | None) -> JobStatus | None:
        """What the scheduler says of an ended job: by default its last status query's
        answer (Slurm asks more: slurm.py)."""
        return st

    def _ended(self, h: BatchHandle, rec: dict | None, st: JobStatus | None) -> Exited:
        st = self._end_status(h, st)
        parts = self.scheduler.describe(h.job_id, st)
        if rec is not None:
            code, sig, extra = rec.get("exit_code"), rec.get("signal"), rec.get("message")
        else:
            code, sig, extra = self.scheduler.outcome(
                st, cancelled_pending=h.cancelled_pending, killed_by=h.killed_by
            )
        message = ", ".join(parts) + (f" ({extra})" if extra else "")
        h.result = Exited(code, sig, message)
        self._active.pop(h.job_id, None)
        return h.result

    # stop --------------------------------------------------------------------------------
    def _command(self, cmd: list[str]) -> None:
        try:
            p = self._run(cmd)
            if p.returncode != 0 and p.stderr.strip():
                log.debug("%s: %s", shlex.join(cmd), p.stderr.strip())
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("%s failed: %s", shlex.join(cmd), exc)

    async def _wait_end(self, h: BatchHandle, seconds: float) -> Exited | None:
        deadline = time.monotonic() + seconds
        last = 0.0
        while True:
            if (rec := self._exit_file(h)) is not None:
                return self._ended(h, rec, h.status)
            now = time.monotonic()
            if now - last >= self.scheduler.stop_poll_s:
                last = now
                result = self.poll(h, fresh=True)
                if isinstance(result, Exited):
                    return result
            if now >= deadline:
                return None
            await asyncio.sleep(0.05)

    async def stop(self, h: BatchHandle, grace_s: float) -> Exited:
        result = self.poll(h, fresh=True)
        if isinstance(result, Exited):
            return result
        if h.status is not None and not h.status.started:
            h.cancelled_pending = True
            self._command(self.scheduler.cancel(h.job_id))
            return await self._wait_end(h, 30) or self._ended(h, None, h.status)
        if grace_s > 0:
            h.killed_by = "SIGTERM"
            self._command(self.scheduler.signal(h.job_id, "TERM"))
            if (ended := await self._wait_end(h, grace_s)) is not None:
                return ended
        h.killed_by = "SIGKILL"
        self._command(self.scheduler.kill(h.job_id))
        kill_wait, purge_wait = self._kill_waits()
        if (ended := await self._wait_end(h, kill_wait)) is not None:
            if (cleanup := self.scheduler.after_kill(h.job_id)) is not None:
                self._command(cleanup)
            return ended
        self._command(self.scheduler.purge(h.job_id))
        return await self._wait_end(h, purge_wait) or self._ended(h, None, h.status)

    def _kill_waits(self) -> tuple[float, float]:
        """How long a stop waits for the job after the kill, then after the purge."""
        return self.kill_wait_s, min(5.0, self.kill_wait_s)
