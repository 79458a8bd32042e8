"""The PBS executor (PBS Professional / OpenPBS): each lease becomes one ``qsub`` job.

    qsub -N klique-<task> -V -j oe -o /dev/null [-l select=1:ngpus=N] [ARGS] [-q QUEUE]
         [-A ACCOUNT]   (queue and account: the pool's settings, else the worker's --queue)
         (the script on stdin; it appends the command's output to the task's log itself)

- **Job id**: qsub's one line, ``<sequence>.<server>`` (``1234.pbs01``).
- **State**: ``qstat -f -x -F json JOB...`` (``-x``: finished jobs too, while the server keeps
  job history; ``-F json``: PBS Pro 14.1 or later). ``job_state`` Q, H, W, T, S, U, M, B
  (queued, held, waiting, in transit, suspended, moved, array begun) and R, E (running,
  exiting) hold the job; F (finished) and X (expired subjob) end it. ``Exit_status``:
  0..255 is the script's exit code, above 256 the signal ``Exit_status - 256`` that killed
  it, below 0 a PBS failure to run it (``JOB_EXEC_*``, named in the message).
  A job qstat no longer knows (``Unknown Job Id``: history off or expired) ended; the
  worker's exit file, when it is there, says how.
- **Stop**: a job not started is deleted (``qdel``); a running one gets ``qsig -s TERM``
  (MoM signals every process of the job; the script traps it and keeps waiting), then
  after the grace ``qsig -s KILL``, then ``qdel -W force`` if it is still listed.

Torque's qstat has no ``-F json`` (its ``-x`` is XML): Torque is not supported.
Tested against recorded outputs of qsub, qstat, qsig and qdel (tests/workers/recorded/pbs,
written from PBS Professional's reference guide: no PBS server runs here).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from klique_util.poolsettings import PoolSettings
from workers.executors.process import _signal_name as _signal_name_of
from workers.executors.batch import BatchExecutor, JobStatus, Scheduler, job_name

ACTIVE = frozenset("QHWTSUMBRE")
STARTED = frozenset("RESU")
JOB_ID_RE = re.compile(r"^\d+(\[\d*\])?(\.[A-Za-z0-9._-]+)?$")
EXEC_FAILURES = {
    -1: "JOB_EXEC_FAIL1: the job could not start (before its files)",
    -2: "JOB_EXEC_FAIL2: the job could not start (after its files)",
    -3: "JOB_EXEC_RETRY: the start failed and will be retried",
    -4: "JOB_EXEC_INITABT: the job was aborted at MoM's initialisation",
    -5: "JOB_EXEC_INITRST: aborted at initialisation, checkpoint kept",
    -6: "JOB_EXEC_INITRMG: aborted at initialisation, migratable",
    -7: "JOB_EXEC_BADRESRT: the restart failed",
    -10: "JOB_EXEC_FAILUID: the user has no account on the execution host",
    -11: "JOB_EXEC_RERUN: the job was requeued (rerun)",
    -15: "JOB_EXEC_QUERST: the MoM could not start the job",
    -20: "JOB_EXEC_KILL_NCPUS_SUM: killed for using more CPUs than asked",
    -25: "JOB_EXEC_KILL_MEM: killed for using more memory than asked",
    -29: "JOB_EXEC_KILL_WALLTIME: killed at its walltime",
}


class Pbs(Scheduler):
    name = "pbs"

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
        """The pool's ``queue`` and ``account`` (``-q``, ``-A``) come after ``extra``, so the
        pool's win; ``queue`` (the worker's ``--queue``) only when the pool names none."""
        ps = PoolSettings.from_lease(lease)
        cmd = ["qsub", "-N", job_name(lease["task"]), "-V", "-j", "oe", "-o", "/dev/null"]
        if queue and not ps.queue:
            cmd += ["-q", queue]
        if gpus:
            cmd += ["-l", f"select=1:ngpus={gpus}"]
        cmd += list(extra)
        if ps.queue:
            cmd += ["-q", ps.queue]
        if ps.account:
            cmd += ["-A", ps.account]
        return cmd

    def job_id(self, stdout: str) -> str | None:
        line = stdout.strip().splitlines()[-1].strip() if stdout.strip() else ""
        return line if JOB_ID_RE.match(line) else None

    def status(self, job_ids: list[str]) -> list[str]:
        return ["qstat", "-f", "-x", "-F", "json", *job_ids]

    def unknown_job(self, stderr: str) -> bool:
        return "Unknown Job Id" in stderr

    def parse_status(self, stdout: str) -> dict[str, JobStatus]:
        """qstat prints nothing but its errors for unknown jobs; the JSON lists the rest."""
        text = stdout.strip()
        if not text:
            return {}
        jobs = json.loads(text).get("Jobs") or {}
        out = {}
        for job, attrs in jobs.items():
            state = str(attrs.get("job_state", ""))
            code = sig = None
            detail = []
            if attrs.get("stime"):
                detail.append(f"started {attrs['stime']}")
            if attrs.get("obittime") and state not in ACTIVE:
                detail.append(f"ended {attrs['obittime']}")
            status = attrs.get("Exit_status")
            if isinstance(status, int) and state not in ACTIVE:
                if status > 256:
                    sig = _signal_name_of(status - 256)
                elif status >= 0:
                    code = status
                else:
                    detail.append(
                        f"Exit_status {status}, "
                        + EXEC_FAILURES.get(status, "PBS could not run the job")
                    )
            started = state in STARTED or bool(attrs.get("stime"))
            out[job] = JobStatus(state, state in ACTIVE, started, code, sig, ", ".join(detail))
        return out

    def cancel(self, job_id: str) -> list[str]:
        return ["qdel", job_id]

    def signal(self, job_id: str, sig: str) -> list[str]:
        return ["qsig", "-s", sig, job_id]

    def kill(self, job_id: str) -> list[str]:
        return ["qsig", "-s", "KILL", job_id]

    def purge(self, job_id: str) -> list[str]:
        return ["qdel", "-W", "force", job_id]


class PbsExecutor(BatchExecutor):
    name = "pbs"
    scheduler = Pbs()
