"""The Slurm executor: each lease becomes one sbatch job on the pool's partition.

    sbatch --parsable --gres=gpu:N --job-name klique-<task> --output <log> \\
           --open-mode=append --export=ALL --chdir <workdir> [--sbatch-arg ...] \\
           --partition=P --account=A --qos=Q        (the pool's settings; script on stdin)

The job's script (``job_script``) runs the command under the worker's exit wrapper
(``wrapper.py``, which writes the command's exit code or signal to ``STATE_DIR/run/<key>.exit``)
in the ``cmd & wait`` pattern, so that it sees signals while it waits, and it never exits
before the command is gone (an orphaned command would escape proctrack/linuxproc).

- **Start**: the environment is the worker's (its virtual env first on PATH) plus the lease's
  ``env`` plus the KLIQUE_* variables, passed to sbatch and exported to the job
  (``--export=ALL``); CUDA_VISIBLE_DEVICES comes from Slurm's GRES, not from the worker. A
  fraction asks for ``--gres=gpu:1`` (Slurm cannot split a GRES GPU) and gets the memory-cap
  variables of workers/gpus.py.
- **State**: the exit file first (exact: exit code or signal); else one ``squeue -t all`` for
  all of the worker's jobs at most every ``poll_interval_s``. A job no longer pending or
  running without an exit file ended some other way: its ``ExitCode`` (``code:signal``),
  state and times come from ``scontrol show job`` (while slurmctld keeps it, MinJobAge), else
  ``sacct`` (accounting through slurmdbd), else the ``jobcomp/filetxt`` file.
- **Stop**: ``scancel --signal=TERM --full JOB`` (plain ``--signal=TERM`` signals only job
  steps, never a batch script and its children); the task gets SIGTERM, the script keeps
  waiting. After the grace: ``scancel --batch --signal=USR2 JOB``, on which the script
  SIGKILLs its process group at once (Slurm itself turns a SIGKILL into TERM + KillWait +
  KILL), then a hard ``scancel JOB`` for anything left. A pending job is just cancelled.
- **Adopt**: by job id after the worker's restart (the handle's record).

The exit file and the log are in the worker's state dir: on a multi-node cluster that must
be a shared file system (or the end comes from scontrol/sacct/jobcomp, and the log is lost).
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
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from klique_util.filemodes import open_private, original_umask
from klique_util.poolsettings import PoolSettings
from klique_util.units import gpus_to_milli
from workers.executors.base import RUNNING, Executor, Exited, Handle, Running, StartError
from workers.executors.process import WRAPPER, ProcessExecutor, _signal_name
from workers.gpus import MILLI, Gpu

log = logging.getLogger(__name__)

# squeue states in which the job still holds (or waits for) its resources
ACTIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
                 "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT",
                 "STOPPED", "RESV_DEL_HOLD"}
NOT_STARTED_STATES = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
                      "RESV_DEL_HOLD"}
CMD_TIMEOUT_S = 30.0


def _slurm_path(path: str | Path) -> str:
    """A path for sbatch's --output: `%` is a pattern character there (`%%` is one `%`)."""
    return str(path).replace("%", "%%")


def job_name(task: str) -> str:
    return "klique-" + re.sub(r"[^A-Za-z0-9._-]", "_", str(task))[:100]


def gres_count(milli: int) -> int:
    """GRES GPUs a task of `milli` milli-GPUs asks for: a fraction takes a whole one."""
    if milli <= 0:
        return 0
    return max(1, math.ceil(milli / MILLI))


def lease_nodes(lease: dict) -> int:
    """The nodes a lease spans: a gang's (issue 15), else 1."""
    n = lease.get("nodes")
    return n if isinstance(n, int) and n > 1 else 1


def sbatch_command(lease: dict, *, partition: str | None, log_path: str | Path,
                   workdir: str | None, extra: list[str] | None = None) -> list[str]:
    """The sbatch command line of a lease (the script goes to sbatch's stdin). A gang over
    N nodes asks for ``--nodes N --ntasks-per-node 1 --gpus-per-node G`` (its GPUs split
    evenly, as the control plane placed it): Slurm's own multi-node placement.

    The pool's settings (the lease's ``settings``) give ``--partition``, ``--account`` and
    ``--qos``; they come after ``extra`` (``--sbatch-arg``), so sbatch, which takes the last
    of a repeated option, keeps the pool's. ``partition`` (``--partition`` of the worker)
    is used only when the pool names none."""
    ps = PoolSettings.from_lease(lease)
    nodes = lease_nodes(lease)
    n = gres_count(gpus_to_milli(lease.get("gpus")) // nodes)
    cmd = ["sbatch", "--parsable"]
    if nodes > 1:
        cmd += ["--nodes", str(nodes), "--ntasks-per-node", "1"]
        if n:
            cmd += ["--gpus-per-node", str(n)]
    elif n:
        cmd.append(f"--gres=gpu:{n}")
    if partition and not ps.partition:
        cmd += ["--partition", partition]
    cmd += ["--job-name", job_name(lease["task"]), "--output", _slurm_path(log_path),
            "--open-mode=append", "--export=ALL"]
    if workdir:
        cmd += ["--chdir", str(workdir)]
    cmd += list(extra or [])
    for key in ("partition", "account", "qos"):
        if (value := ps.get(key)) is not None:
            cmd.append(f"--{key}={value}")
    return cmd


def job_script(lease: dict, exit_path: str | Path, python: str = sys.executable,
               wrapper: str = WRAPPER) -> str:
    """The batch script of a lease (see the module's docstring); its command was checked to
    be a list of strings (``start``)."""
    cmd = shlex.join(lease["command"])
    py, wr, ex = shlex.quote(python), shlex.quote(wrapper), shlex.quote(str(exit_path))
    nodes = lease_nodes(lease)
    rendezvous = ""
    if nodes > 1:
        # One step task per node runs the command, with the names torchrun and DeepSpeed
        # read; the wrapper records srun's exit (non-zero when any node's command fails).
        rendezvous = f"""# A gang over {nodes} nodes: rank 0's node is the master.
_klique_first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_ADDR=$(scontrol show node "$_klique_first" -o | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)
export MASTER_ADDR="${{MASTER_ADDR:-$_klique_first}}"
export MASTER_PORT="${{MASTER_PORT:-29500}}" WORLD_SIZE="$SLURM_JOB_NUM_NODES" LOCAL_WORLD_SIZE=1
"""
        cmd = (f"srun --nodes {nodes} --ntasks-per-node 1 --kill-on-bad-exit=1 /bin/sh -c "
               "'RANK=$SLURM_NODEID NODE_RANK=$SLURM_NODEID LOCAL_RANK=0 "
               "&& export RANK NODE_RANK LOCAL_RANK && exec \"$@\"' klique-rank " + cmd)
    return f"""#!/bin/bash
# klique task {lease['task']} (epoch {lease['epoch']}), submitted by klique-worker.
# A stop is `scancel --signal=TERM --full` (the task gets SIGTERM; this script keeps waiting
# for it), then after the grace `scancel --batch --signal=USR2` (SIGKILL to the task's process
# group, this script included) and a hard `scancel`.
trap ':' TERM INT HUP
trap 'kill -KILL 0' USR2
{rendezvous}if [ -x {py} ] && [ -r {wr} ]; then
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


def parse_exit_code(text: str | None) -> tuple[int | None, str | None]:
    """Slurm's ``code:signal`` → (exit code, signal name); a signal wins."""
    if not text or ":" not in text:
        return None, None
    code, sig = text.split(":", 1)
    try:
        code_i, sig_i = int(code), int(sig)
    except ValueError:
        return None, None
    if sig_i:
        return None, _signal_name(sig_i)
    return code_i, None


def parse_keyvalues(line: str) -> dict[str, str]:
    """``A=1 B=x y=2`` lines of scontrol -o and of the jobcomp/filetxt file."""
    out: dict[str, str] = {}
    for m in re.finditer(r"(\w+)=(\S*)", line):
        out.setdefault(m.group(1), m.group(2))
    return out


def _rfc3339(slurm_time: str | None) -> str | None:
    """Slurm's local ``2026-11-29T09:14:24`` → RFC 3339 with the offset; None if unknown."""
    if not slurm_time or slurm_time in ("Unknown", "None", "N/A"):
        return None
    try:
        return datetime.strptime(slurm_time, "%Y-%m-%dT%H:%M:%S").astimezone().isoformat()
    except ValueError:
        return slurm_time


@dataclass
class JobInfo:
    state: str | None = None
    exit_code: str | None = None     # "code:signal"
    start: str | None = None
    end: str | None = None
    source: str = ""


@dataclass
class SlurmHandle(Handle):
    job_id: str
    exit_path: str
    submitted_at: float = 0.0         # time.monotonic() of sbatch (0: adopted)
    state: str | None = field(default=None, repr=False)
    killed_by: str | None = None      # the last signal a stop sent
    cancelled_pending: bool = False   # a stop cancelled it before it started
    result: Exited | None = field(default=None, repr=False)

    def to_record(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "exit_path": self.exit_path}


class SlurmExecutor(Executor[SlurmHandle]):
    name = "slurm"

    def __init__(self, state_dir: str | Path, partition: str | None = None,
                 slurm_conf: str | Path | None = None, venv: str | Path | None = None,
                 workdir: str | Path | None = None, base_env: dict[str, str] | None = None,
                 gpus: list[Gpu] | None = None, python: str | None = None,
                 sbatch_args: list[str] | None = None, poll_interval_s: float = 1.0):
        self.run_dir = Path(state_dir) / "run"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.partition = partition
        self.workdir = str(Path(workdir).resolve()) if workdir else os.getcwd()
        self.python = python or sys.executable
        self.sbatch_args = list(sbatch_args or [])
        self.poll_interval_s = poll_interval_s
        self._env_builder = ProcessExecutor(state_dir, venv=venv, workdir=workdir,
                                            base_env=base_env, gpus=gpus)
        env = dict(base_env if base_env is not None else os.environ)
        if slurm_conf:
            env["SLURM_CONF"] = str(Path(slurm_conf).resolve())
        self.cmd_env = env                       # for sbatch, squeue, scancel, ...
        self._active: dict[str, SlurmHandle] = {}
        self._snap: dict[str, str] = {}
        self._snap_at = -1.0
        self._snap_ok = True
        self._warned_at = 0.0
        self._config: dict[str, str] | None = None

    # commands ----------------------------------------------------------------------------
    def _run(self, cmd: list[str], stdin: str | None = None,
             timeout: float = CMD_TIMEOUT_S) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, input=stdin, capture_output=True, text=True,
                              env=self.cmd_env, timeout=timeout)

    def config(self) -> dict[str, str]:
        """``scontrol show config`` (AccountingStorageType, JobCompType, JobCompLoc,
        KillWait), read once."""
        if self._config is None:
            out: dict[str, str] = {}
            try:
                p = self._run(["scontrol", "show", "config"])
                for line in p.stdout.splitlines():
                    if "=" in line:
                        k, v = line.split("=", 1)
                        out[k.strip()] = v.strip()
            except (OSError, subprocess.SubprocessError):
                return {}
            self._config = out
        return self._config

    def environment(self, lease: dict, gpu_indices: list[int]) -> dict[str, str]:
        env = self._env_builder.environment(lease, gpu_indices)
        env.pop("CUDA_VISIBLE_DEVICES", None)        # Slurm sets it from the job's GRES
        for key in [k for k in env if k.startswith("SLURM_") and k != "SLURM_CONF"]:
            del env[key]                              # the worker's own allocation, if any
        if "SLURM_CONF" in self.cmd_env:
            env["SLURM_CONF"] = self.cmd_env["SLURM_CONF"]
        return env

    # Executor ----------------------------------------------------------------------------
    def start(self, lease: dict, gpu_indices: list[int], log_path: Path) -> SlurmHandle:
        command = lease.get("command")
        if not command:
            raise StartError("the Slurm executor runs commands and this task has none")
        if not isinstance(command, list) or not all(isinstance(a, str) for a in command):
            raise StartError(f"the task's command must be a list of strings, not {command!r}")
        exit_path = self.run_dir / f"{Path(log_path).stem}.exit"
        exit_path.unlink(missing_ok=True)
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        self.setting(lease, "partition", "--partition", self.partition)  # warns on a clash
        cmd = sbatch_command(lease, partition=self.partition, log_path=log_path,
                             workdir=self.workdir, extra=self.sbatch_args)
        script = job_script(lease, exit_path, self.python)
        # Slurm appends to the log (--open-mode=append): made 0600 here, it stays private;
        # the job itself gets the umask the worker started with (sbatch passes its own on)
        os.close(open_private(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT))
        try:
            p = subprocess.run(cmd, input=script, capture_output=True, text=True,
                               env=self.environment(lease, gpu_indices), timeout=CMD_TIMEOUT_S,
                               umask=original_umask())
        except (OSError, subprocess.SubprocessError) as exc:
            raise StartError(f"sbatch failed: {exc}") from exc
        job = p.stdout.strip().split(";")[0]
        if p.returncode != 0 or not job.isdigit():
            raise StartError(f"sbatch refused the job: {(p.stderr or p.stdout).strip()}")
        h = SlurmHandle(job_id=job, exit_path=str(exit_path), submitted_at=time.monotonic())
        self._active[job] = h
        log.debug("task %s: slurm job %s", lease["task"], job)
        return h

    def adopt(self, record: dict[str, Any]) -> SlurmHandle:
        h = SlurmHandle(job_id=str(record["job_id"]), exit_path=str(record["exit_path"]))
        self._active[h.job_id] = h
        return h

    # state -------------------------------------------------------------------------------
    def _exit_file(self, h: SlurmHandle) -> dict | None:
        try:
            return json.loads(Path(h.exit_path).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def _refresh(self, ids: list[str]) -> None:
        """One squeue for the given jobs: their states (jobs it does not know are absent)."""
        snap: dict[str, str] = {}
        ok = True
        for i in range(0, len(ids), 200):
            chunk = ids[i:i + 200]
            try:
                p = self._run(["squeue", "-h", "-t", "all", "-o", "%i|%T",
                               "-j", ",".join(chunk)])
            except (OSError, subprocess.SubprocessError) as exc:
                ok, err = False, str(exc)
                break
            if p.returncode != 0:
                if "Invalid job id" in p.stderr:
                    continue                       # none of them is known any more
                ok, err = False, p.stderr.strip()
                break
            for line in p.stdout.splitlines():
                job, _, state = line.strip().partition("|")
                snap[job] = state.split()[0] if state else ""
        if not ok:
            now = time.monotonic()
            if now - self._warned_at > 60:
                self._warned_at = now
                log.warning("squeue failed (%s): Slurm jobs are taken as still running", err)
        self._snap_ok = ok
        if ok:
            self._snap.update(snap)
            for job in ids:
                if job not in snap:
                    self._snap.pop(job, None)
        self._snap_at = time.monotonic()

    def _state(self, h: SlurmHandle, fresh: bool = False) -> str | None:
        """The job's squeue state, "" if squeue does not know it, None if squeue failed."""
        if fresh:
            self._refresh([h.job_id])
        elif self._snap_at < max(h.submitted_at, time.monotonic() - self.poll_interval_s):
            self._refresh(sorted(j for j, a in self._active.items() if a.result is None)
                          or [h.job_id])
        if not self._snap_ok:
            return None
        return self._snap.get(h.job_id, "")

    def poll(self, h: SlurmHandle, fresh: bool = False) -> Running | Exited:
        if h.result is not None:
            return h.result
        if (rec := self._exit_file(h)) is not None:
            return self._ended(h, rec)
        state = self._state(h, fresh)
        if state is None or state in ACTIVE_STATES:
            if state:
                h.state = state
            return RUNNING
        return self._ended(h, self._exit_file(h))

    def job_info(self, job_id: str) -> JobInfo | None:
        """State, ``code:signal`` and times of an ended job: scontrol (slurmctld's memory),
        else sacct (slurmdbd), else the jobcomp/filetxt file."""
        try:
            p = self._run(["scontrol", "show", "job", "-o", job_id])
            if p.returncode == 0 and p.stdout.strip():
                kv = parse_keyvalues(p.stdout)
                return JobInfo(kv.get("JobState"), kv.get("ExitCode"), kv.get("StartTime"),
                               kv.get("EndTime"), "scontrol")
        except (OSError, subprocess.SubprocessError):
            pass
        conf = self.config()
        if conf.get("AccountingStorageType", "").endswith("slurmdbd"):
            try:
                p = self._run(["sacct", "-X", "-P", "-n", "-o",
                               "JobID,State,ExitCode,Start,End", "-j", job_id])
                for line in p.stdout.splitlines():
                    parts = line.split("|")
                    if len(parts) == 5 and parts[0] == job_id:
                        return JobInfo(parts[1].split()[0], parts[2], parts[3], parts[4],
                                       "sacct")
            except (OSError, subprocess.SubprocessError):
                pass
        if conf.get("JobCompType", "").endswith("filetxt") and conf.get("JobCompLoc"):
            found = None
            try:
                with open(conf["JobCompLoc"], encoding="utf-8", errors="replace") as fh:
                    for line in fh:
                        if line.startswith(f"JobId={job_id} "):
                            found = line          # the last one: ids restart with a new cluster
            except OSError:
                pass
            if found:
                kv = parse_keyvalues(found)
                return JobInfo(kv.get("JobState"), kv.get("ExitCode"), kv.get("StartTime"),
                               kv.get("EndTime"), "jobcomp")
        return None

    def _ended(self, h: SlurmHandle, rec: dict | None) -> Exited:
        info = self.job_info(h.job_id)
        parts = [f"slurm job {h.job_id}"]
        if info is not None:
            if info.state and info.state not in ACTIVE_STATES:
                parts.append(info.state)
            if (start := _rfc3339(info.start)) is not None:
                parts.append(f"started {start}")
            if (end := _rfc3339(info.end)) is not None and info.state not in ACTIVE_STATES:
                parts.append(f"ended {end}")
        if rec is not None:
            code, sig = rec.get("exit_code"), rec.get("signal")
            extra = rec.get("message")
        elif info is not None:
            code, sig = parse_exit_code(info.exit_code)
            extra = f"exit {info.exit_code} from {info.source}"
            if info.state == "CANCELLED" and (h.cancelled_pending
                                              or _rfc3339(info.start) is None):
                code, sig, extra = None, None, "cancelled before it started"
            elif code is None and sig is None:
                sig = h.killed_by
        else:
            code, sig = None, h.killed_by
            extra = ("the job is gone and its end is unknown (no exit file, slurmctld no "
                     "longer knows it, no accounting)")
        message = ", ".join(parts) + (f" ({extra})" if extra else "")
        h.result = Exited(code, sig, message)
        self._active.pop(h.job_id, None)
        return h.result

    # stop --------------------------------------------------------------------------------
    def _scancel(self, *args: str) -> None:
        try:
            p = self._run(["scancel", *args])
            if p.returncode != 0 and p.stderr.strip():
                log.debug("scancel %s: %s", " ".join(args), p.stderr.strip())
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("scancel %s failed: %s", " ".join(args), exc)

    async def _wait_end(self, h: SlurmHandle, seconds: float) -> Exited | None:
        deadline = time.monotonic() + seconds
        last_squeue = 0.0
        while True:
            if (rec := self._exit_file(h)) is not None:
                return self._ended(h, rec)
            now = time.monotonic()
            if now - last_squeue >= 0.2:
                last_squeue = now
                result = self.poll(h, fresh=True)
                if isinstance(result, Exited):
                    return result
            if now >= deadline:
                return None
            await asyncio.sleep(0.05)

    async def stop(self, h: SlurmHandle, grace_s: float) -> Exited:
        result = self.poll(h, fresh=True)
        if isinstance(result, Exited):
            return result
        if h.state in NOT_STARTED_STATES:
            h.cancelled_pending = True
            self._scancel(h.job_id)
            return await self._wait_end(h, 30) or self._ended(h, None)
        if grace_s > 0:
            h.killed_by = "SIGTERM"
            self._scancel("--signal=TERM", "--full", h.job_id)
            if (ended := await self._wait_end(h, grace_s)) is not None:
                return ended
        h.killed_by = "SIGKILL"
        self._scancel("--batch", "--signal=USR2", h.job_id)
        if (ended := await self._wait_end(h, 2.0)) is not None:
            self._scancel(h.job_id)     # the job's steps or strays, if any
            return ended
        self._scancel(h.job_id)
        try:
            kill_wait = float(self.config().get("KillWait", "30 sec").split()[0])
        except ValueError:
            kill_wait = 30.0
        return await self._wait_end(h, kill_wait + 15) or self._ended(h, None)
