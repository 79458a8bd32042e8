"""The Slurm executor: each lease becomes one sbatch job on the pool's partition. Slurm is
one scheduler of the batch executor (batch.py, beside PBS and LSF): ``Slurm`` gives its
command lines, job script and parsers, ``SlurmExecutor`` what only Slurm needs at run time
(SLURM_CONF, the ended job's record from scontrol, sacct or jobcomp, KillWait).

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
- **The task's files**: the checkpoint mark and the preemption notice are exported like
  every KLIQUE_* variable; the job sees them where it sees its log (batch.py).

The exit file and the log are in the worker's state dir: on a multi-node cluster that must
be a shared file system (or the end comes from scontrol/sacct/jobcomp, and the log is lost).
"""

from __future__ import annotations

import logging
import re
import shlex
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from klique_util.poolsettings import PoolSettings
from klique_util.units import gpus_to_milli
from workers.executors.batch import (
    BatchExecutor,
    BatchHandle,
    JobStatus,
    Scheduler,
    gres_count,
    job_name,
)
from workers.executors.process import WRAPPER, _signal_name
from workers.gpus import Gpu

__all__ = [
    "ACTIVE_STATES",
    "NOT_STARTED_STATES",
    "JobInfo",
    "Slurm",
    "SlurmExecutor",
    "SlurmHandle",
    "gres_count",
    "job_name",
    "job_script",
    "lease_nodes",
    "parse_exit_code",
    "parse_keyvalues",
    "sbatch_command",
]

log = logging.getLogger(__name__)

# squeue states in which the job still holds (or waits for) its resources
ACTIVE_STATES = {
    "PENDING",
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "SUSPENDED",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "RESIZING",
    "SIGNALING",
    "STAGE_OUT",
    "STOPPED",
    "RESV_DEL_HOLD",
}
NOT_STARTED_STATES = {
    "PENDING",
    "CONFIGURING",
    "REQUEUED",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "RESV_DEL_HOLD",
}
SlurmHandle = BatchHandle
"""A Slurm job's handle is the batch executor's (job id and exit file)."""


def _slurm_path(path: str | Path) -> str:
    """A path for sbatch's --output: `%` is a pattern character there (`%%` is one `%`)."""
    return str(path).replace("%", "%%")


def lease_nodes(lease: dict) -> int:
    """The nodes a lease spans: a gang's (issue 15), else 1."""
    n = lease.get("nodes")
    return n if isinstance(n, int) and n > 1 else 1


def sbatch_command(
    lease: dict,
    *,
    partition: str | None,
    log_path: str | Path,
    workdir: str | None,
    extra: list[str] | None = None,
) -> list[str]:
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
    cmd += [
        "--job-name",
        job_name(lease["task"]),
        "--output",
        _slurm_path(log_path),
        "--open-mode=append",
        "--export=ALL",
    ]
    if workdir:
        cmd += ["--chdir", str(workdir)]
    cmd += list(extra or [])
    for key in ("partition", "account", "qos"):
        if (value := ps.get(key)) is not None:
            cmd.append(f"--{key}={value}")
    return cmd


def job_script(
    lease: dict, exit_path: str | Path, python: str = sys.executable, wrapper: str = WRAPPER
) -> str:
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
        cmd = (
            f"srun --nodes {nodes} --ntasks-per-node 1 --kill-on-bad-exit=1 /bin/sh -c "
            "'RANK=$SLURM_NODEID NODE_RANK=$SLURM_NODEID LOCAL_RANK=0 "
            '&& export RANK NODE_RANK LOCAL_RANK && exec "$@"\' klique-rank ' + cmd
        )
    return f"""#!/bin/bash
# klique task {lease["task"]} (epoch {lease["epoch"]}), submitted by klique-worker.
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


@dataclass(frozen=True)
class JobInfo:
    """An ended job as scontrol, sacct or the jobcomp file recorded it."""

    state: str | None = None
    exit_code: str | None = None  # "code:signal"
    start: str | None = None
    end: str | None = None
    source: str = ""

    def status(self) -> JobStatus:
        """The batch executor's view of it: the state (shown only once the job is no longer
        active), its times, its exit."""
        active = self.state in ACTIVE_STATES
        start, end = _rfc3339(self.start), _rfc3339(self.end)
        detail = [f"started {start}"] if start is not None else []
        if end is not None and not active:
            detail.append(f"ended {end}")
        code, sig = parse_exit_code(self.exit_code)
        return JobStatus(
            self.state or "",
            active,
            start is not None,
            code,
            sig,
            ", ".join(detail),
            str(self.exit_code),
            self.source,
        )


def parse_scontrol_job(stdout: str) -> JobInfo | None:
    """``scontrol show job -o JOB``: None when it printed nothing."""
    if not stdout.strip():
        return None
    kv = parse_keyvalues(stdout)
    return JobInfo(
        kv.get("JobState"), kv.get("ExitCode"), kv.get("StartTime"), kv.get("EndTime"), "scontrol"
    )


def parse_sacct(stdout: str, job_id: str) -> JobInfo | None:
    """``sacct -X -P -n -o JobID,State,ExitCode,Start,End -j JOB``."""
    for line in stdout.splitlines():
        parts = line.split("|")
        if len(parts) == 5 and parts[0] == job_id:
            return JobInfo(parts[1].split()[0], parts[2], parts[3], parts[4], "sacct")
    return None


def parse_jobcomp(lines: Iterable[str], job_id: str) -> JobInfo | None:
    """The job's line in the jobcomp/filetxt file: the last one (ids restart with a new
    cluster)."""
    found = None
    for line in lines:
        if line.startswith(f"JobId={job_id} "):
            found = line
    if not found:
        return None
    kv = parse_keyvalues(found)
    return JobInfo(
        kv.get("JobState"), kv.get("ExitCode"), kv.get("StartTime"), kv.get("EndTime"), "jobcomp"
    )


def parse_config(stdout: str) -> dict[str, str]:
    """``scontrol show config``: ``Key = value`` lines."""
    out: dict[str, str] = {}
    for line in stdout.splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


class Slurm(Scheduler):
    """sbatch, squeue and scancel (the module's docstring)."""

    name = "slurm"
    queue_key, queue_flag = "partition", "--partition"
    max_ids = 200
    stop_poll_s = 0.2

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
        """``sbatch_command``: its GPUs per node from the lease (a gang's are split), so
        ``gpus`` is not used."""
        return sbatch_command(
            lease, partition=queue, log_path=log_path or "/dev/null", workdir=workdir, extra=extra
        )

    def script(
        self, lease: dict, exit_path: str | Path, log_path: str | Path, workdir: str, python: str
    ) -> str:
        """``job_script`` (sbatch writes the log and changes the directory itself)."""
        return job_script(lease, exit_path, python)

    def job_id(self, stdout: str) -> str | None:
        job = stdout.strip().split(";")[0]
        return job if job.isdigit() else None

    def status(self, job_ids: list[str]) -> list[str]:
        return ["squeue", "-h", "-t", "all", "-o", "%i|%T", "-j", ",".join(job_ids)]

    def unknown_job(self, stderr: str) -> bool:
        return "Invalid job id" in stderr

    def parse_status(self, stdout: str) -> dict[str, JobStatus]:
        out = {}
        for line in stdout.splitlines():
            job, _, text = line.strip().partition("|")
            state = text.split()[0] if text.split() else ""
            out[job] = JobStatus(state, state in ACTIVE_STATES, state not in NOT_STARTED_STATES)
        return out

    def cancel(self, job_id: str) -> list[str]:
        return ["scancel", job_id]

    def signal(self, job_id: str, sig: str) -> list[str]:
        """``--full``: plain ``--signal`` reaches job steps only, never the batch script."""
        return ["scancel", f"--signal={sig}", "--full", job_id]

    def kill(self, job_id: str) -> list[str]:
        """USR2 to the script, which SIGKILLs its process group at once (a SIGKILL through
        Slurm is TERM + KillWait + KILL)."""
        return ["scancel", "--batch", "--signal=USR2", job_id]

    def purge(self, job_id: str) -> list[str]:
        return ["scancel", job_id]

    def after_kill(self, job_id: str) -> list[str] | None:
        return ["scancel", job_id]  # the job's steps or strays, if any

    def describe(self, job_id: str, st: JobStatus | None) -> list[str]:
        parts = [f"slurm job {job_id}"]
        if st is not None:
            if st.state and not st.active:
                parts.append(st.state)
            if st.detail:
                parts.append(st.detail)
        return parts

    def outcome(
        self, st: JobStatus | None, *, cancelled_pending: bool, killed_by: str | None
    ) -> tuple[int | None, str | None, str]:
        if st is None or not st.source:
            return (
                None,
                killed_by,
                (
                    "the job is gone and its end is unknown (no exit file, "
                    "slurmctld no longer knows it, no accounting)"
                ),
            )
        if st.state == "CANCELLED" and (cancelled_pending or not st.started):
            return None, None, "cancelled before it started"
        code, sig = st.exit_code, st.signal
        if code is None and sig is None:
            sig = killed_by
        return code, sig, f"exit {st.exit_text} from {st.source}"


class SlurmExecutor(BatchExecutor):
    """Slurm's jobs as tasks; what the batch executor leaves to it: SLURM_CONF, the ended
    job's record, KillWait."""

    name = "slurm"
    scheduler = Slurm()

    def __init__(
        self,
        state_dir: str | Path,
        partition: str | None = None,
        slurm_conf: str | Path | None = None,
        venv: str | Path | None = None,
        workdir: str | Path | None = None,
        base_env: dict[str, str] | None = None,
        gpus: list[Gpu] | None = None,
        python: str | None = None,
        sbatch_args: list[str] | None = None,
        poll_interval_s: float = 1.0,
    ):
        super().__init__(
            state_dir,
            queue=partition,
            venv=venv,
            workdir=workdir,
            base_env=base_env,
            gpus=gpus,
            python=python,
            batch_args=sbatch_args,
            poll_interval_s=poll_interval_s,
        )
        self.partition = partition
        if slurm_conf:
            self.cmd_env["SLURM_CONF"] = str(Path(slurm_conf).resolve())
        self._config: dict[str, str] | None = None

    def environment(self, lease: dict, gpu_indices: list[int]) -> dict[str, str]:
        env = super().environment(lease, gpu_indices)  # CUDA_VISIBLE_DEVICES: from GRES
        for key in [k for k in env if k.startswith("SLURM_") and k != "SLURM_CONF"]:
            del env[key]  # the worker's own allocation, if any
        if "SLURM_CONF" in self.cmd_env:
            env["SLURM_CONF"] = self.cmd_env["SLURM_CONF"]
        return env

    def config(self) -> dict[str, str]:
        """``scontrol show config`` (AccountingStorageType, JobCompType, JobCompLoc,
        KillWait), read once."""
        if self._config is None:
            try:
                p = self._run(["scontrol", "show", "config"])
            except (OSError, subprocess.SubprocessError):
                return {}
            self._config = parse_config(p.stdout)
        return self._config

    def job_info(self, job_id: str) -> JobInfo | None:
        """State, ``code:signal`` and times of an ended job: scontrol (slurmctld's memory),
        else sacct (slurmdbd), else the jobcomp/filetxt file."""
        try:
            p = self._run(["scontrol", "show", "job", "-o", job_id])
            if p.returncode == 0 and (info := parse_scontrol_job(p.stdout)) is not None:
                return info
        except (OSError, subprocess.SubprocessError):
            pass
        conf = self.config()
        if conf.get("AccountingStorageType", "").endswith("slurmdbd"):
            try:
                p = self._run(
                    [
                        "sacct",
                        "-X",
                        "-P",
                        "-n",
                        "-o",
                        "JobID,State,ExitCode,Start,End",
                        "-j",
                        job_id,
                    ]
                )
                if (info := parse_sacct(p.stdout, job_id)) is not None:
                    return info
            except (OSError, subprocess.SubprocessError):
                pass
        if conf.get("JobCompType", "").endswith("filetxt") and conf.get("JobCompLoc"):
            try:
                with open(conf["JobCompLoc"], encoding="utf-8", errors="replace") as fh:
                    return parse_jobcomp(fh, job_id)
            except OSError:
                pass
        return None

    def _end_status(self, h: BatchHandle, st: JobStatus | None) -> JobStatus | None:
        """Slurm's record of the job (squeue shows only its state): even with an exit file,
        for its state and times in the task's message."""
        info = self.job_info(h.job_id)
        return info.status() if info is not None else None

    def _kill_waits(self) -> tuple[float, float]:
        """2 s for the script's SIGKILL of its process group; after the hard scancel,
        Slurm's KillWait and some."""
        try:
            kill_wait = float(self.config().get("KillWait", "30 sec").split()[0])
        except ValueError:
            kill_wait = 30.0
        return 2.0, kill_wait + 15
