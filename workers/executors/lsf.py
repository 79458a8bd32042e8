"""The LSF executor (IBM Spectrum LSF 10.1): each lease becomes one ``bsub`` job.

    bsub -J klique-<task> -o /dev/null -cwd WORKDIR [-gpu num=N] [ARGS] [-q QUEUE]
         [-P ACCOUNT]   (queue and account: the pool's settings, else the worker's --queue)
         (the script on stdin; it appends the command's output to the task's log itself;
          LSF passes the submission environment on by default)

- **Job id**: ``Job <1234> is submitted to queue <gpu>.``
- **State**: ``bjobs -a -json -o "jobid stat exit_code start_time finish_time" JOB...``
  (``-a``: finished jobs too, while mbatchd keeps them, CLEAN_PERIOD). ``STAT`` PEND, PROV,
  WAIT, PSUSP (waiting), RUN, USUSP, SSUSP, UNKWN (running, suspended, its host not
  answering) hold the job; DONE (exit 0), EXIT and ZOMBI end it. ``EXIT_CODE`` of an EXIT job
  above 128 is the signal ``EXIT_CODE - 128`` (the shell's convention, which LSF reports),
  else the exit code. A job bjobs reports ``not found`` ended; the worker's exit file, when
  it is there, says how.
- **Stop**: a job not started is killed while pending (``bkill``: it never runs); a running
  one gets ``bkill -s TERM`` (every process of the job; the script traps it and keeps
  waiting), then after the grace ``bkill -s KILL``, then ``bkill -r`` (removed from LSF
  even if its host does not answer) if it is still listed.

Tested against recorded outputs of bsub, bjobs and bkill (tests/workers/recorded/lsf,
written from IBM's LSF command reference: no LSF cluster runs here).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from klique_util.poolsettings import PoolSettings
from workers.executors.process import _signal_name as _signal_name_of
from workers.executors.batch import BatchExecutor, JobStatus, Scheduler, job_name

ACTIVE = frozenset({"PEND", "PROV", "WAIT", "PSUSP", "RUN", "USUSP", "SSUSP", "UNKWN"})
STARTED = frozenset({"RUN", "USUSP", "SSUSP", "UNKWN", "DONE", "EXIT", "ZOMBI"})
SUBMITTED_RE = re.compile(r"Job <(\d+(?:\[\d+\])?)> is submitted")
FIELDS = "jobid stat exit_code start_time finish_time"


class Lsf(Scheduler):
    name = "lsf"

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
        """The pool's ``queue`` (``-q``) and ``account`` (``-P``: LSF's project, what its
        accounting charges) come after ``extra``, so the pool's win; ``queue`` (the worker's
        ``--queue``) only when the pool names none."""
        ps = PoolSettings.from_lease(lease)
        cmd = ["bsub", "-J", job_name(lease["task"]), "-o", "/dev/null", "-cwd", workdir]
        if queue and not ps.queue:
            cmd += ["-q", queue]
        if gpus:
            cmd += ["-gpu", f"num={gpus}"]
        cmd += list(extra)
        if ps.queue:
            cmd += ["-q", ps.queue]
        if ps.account:
            cmd += ["-P", ps.account]
        return cmd

    def job_id(self, stdout: str) -> str | None:
        m = SUBMITTED_RE.search(stdout)
        return m.group(1) if m else None

    def status(self, job_ids: list[str]) -> list[str]:
        return ["bjobs", "-a", "-json", "-o", FIELDS, *job_ids]

    def unknown_job(self, stderr: str) -> bool:
        return "is not found" in stderr

    def parse_status(self, stdout: str) -> dict[str, JobStatus]:
        text = stdout.strip()
        if not text:
            return {}
        out = {}
        for rec in json.loads(text).get("RECORDS") or []:
            if rec.get("ERROR") or not rec.get("JOBID"):
                continue  # "Job <123> is not found"
            state = str(rec.get("STAT", ""))
            code = sig = None
            if state == "DONE":
                code = 0
            elif state in ("EXIT", "ZOMBI"):
                raw = str(rec.get("EXIT_CODE") or "").strip()
                if raw.isdigit():
                    n = int(raw)
                    if n > 128:
                        sig = _signal_name_of(n - 128)
                    else:
                        code = n
            detail = []
            if rec.get("START_TIME") and rec["START_TIME"] != "-":
                detail.append(f"started {rec['START_TIME']}")
            if rec.get("FINISH_TIME") and rec["FINISH_TIME"] != "-" and state not in ACTIVE:
                detail.append(f"ended {rec['FINISH_TIME']}")
            out[str(rec["JOBID"])] = JobStatus(
                state, state in ACTIVE, state in STARTED, code, sig, ", ".join(detail)
            )
        return out

    def cancel(self, job_id: str) -> list[str]:
        return ["bkill", job_id]

    def signal(self, job_id: str, sig: str) -> list[str]:
        return ["bkill", "-s", sig, job_id]

    def kill(self, job_id: str) -> list[str]:
        return ["bkill", "-s", "KILL", job_id]

    def purge(self, job_id: str) -> list[str]:
        return ["bkill", "-r", job_id]


class LsfExecutor(BatchExecutor):
    name = "lsf"
    scheduler = Lsf()
