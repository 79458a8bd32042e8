"""The PBS and LSF executors against recorded outputs of their commands
(tests/workers/recorded/pbs, lsf; README there): no PBS or LSF can run here.

Stand-ins for qsub/qstat/qsig/qdel and bsub/bjobs/bkill are put first on PATH: each records
its call (arguments, stdin, the KLIQUE_* environment) and answers with the recorded output
the test chose, so the executors' real subprocess calls, command lines and parsers run.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import sys
from pathlib import Path

import pytest

from workers.errors import StartError
from workers.executors import make_executor
from workers.executors.base import RUNNING, Exited
from workers.executors.lsf import Lsf, LsfExecutor
from workers.executors.pbs import Pbs, PbsExecutor

RECORDED = Path(__file__).parent / "recorded"
STANDIN = """#!{python}
import json, os, sys
d = os.environ["STANDIN_DIR"]
name = os.path.basename(sys.argv[0])
stdin = sys.stdin.read() if name in ("qsub", "bsub") else ""
with open(os.path.join(d, "calls.jsonl"), "a") as f:
    f.write(json.dumps({{"cmd": name, "argv": sys.argv[1:], "stdin": stdin,
                        "env": {{k: v for k, v in os.environ.items()
                                if k.startswith(("KLIQUE_", "CUDA_"))}}}}) + "\\n")
answer = os.path.join(d, name + ".json")
a = json.load(open(answer)) if os.path.exists(answer) else {{}}
sys.stdout.write(open(a["out"]).read() if a.get("out") else "")
sys.stderr.write(open(a["err"]).read() if a.get("err") else "")
sys.exit(a.get("rc", 0))
"""
COMMANDS = ("qsub", "qstat", "qsig", "qdel", "bsub", "bjobs", "bkill")


class Standins:
    def __init__(self, root: Path):
        self.dir = root / "bin"
        self.dir.mkdir()
        for name in COMMANDS:
            p = self.dir / name
            p.write_text(STANDIN.format(python=sys.executable))
            p.chmod(p.stat().st_mode | stat.S_IXUSR)

    def answer(self, cmd: str, out: str | None = None, err: str | None = None, rc: int = 0) -> None:
        """``cmd`` answers with the recorded files ``out`` (stdout) and ``err``."""
        (self.dir / f"{cmd}.json").write_text(
            json.dumps(
                {
                    "out": str(RECORDED / out) if out else None,
                    "err": str(RECORDED / err) if err else None,
                    "rc": rc,
                }
            )
        )

    def calls(self, cmd: str | None = None) -> list[dict]:
        path = self.dir / "calls.jsonl"
        if not path.exists():
            return []
        calls = [json.loads(line) for line in path.read_text().splitlines()]
        return [c for c in calls if cmd is None or c["cmd"] == cmd]

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "PATH": f"{self.dir}:{os.environ['PATH']}",
            "STANDIN_DIR": str(self.dir),
        }


@pytest.fixture
def standins(tmp_path):
    return Standins(tmp_path)


def lease(task="t-000017", gpus=2, command=None, **more):
    return {
        "task": task,
        "epoch": 3,
        "gpus": gpus,
        "command": command or ["python", "train.py", "--lr", "3e-4"],
        "env": {"WANDB_MODE": "offline"},
        "user": "ana",
        "project": "vision",
        "resource": "team-a/a100",
        **more,
    }


def executor(kind, tmp_path, standins, **kw):
    cls = PbsExecutor if kind == "pbs" else LsfExecutor
    return cls(
        tmp_path / "state",
        queue="gpu",
        workdir=tmp_path,
        base_env=standins.env(),
        batch_args=["-P", "ml"],
        poll_interval_s=0,
        kill_wait_s=0.3,
        **kw,
    )


def test_make_executor_knows_pbs_and_lsf(tmp_path):
    assert isinstance(make_executor("pbs", state_dir=tmp_path, queue="q"), PbsExecutor)
    assert isinstance(make_executor("lsf", state_dir=tmp_path, batch_args=["-P", "x"]), LsfExecutor)


# command lines and job ids ----------------------------------------------------------------
def test_pbs_submits_with_qsub_and_reads_the_job_id(tmp_path, standins):
    standins.answer("qsub", out="pbs/qsub.out")
    ex = executor("pbs", tmp_path, standins)
    log = tmp_path / "state" / "logs" / "t-000017.e3.log"
    h = ex.start(lease(), [0, 1], log)
    assert h.job_id == "1234.pbs01"
    (call,) = standins.calls("qsub")
    assert call["argv"] == [
        "-N",
        "klique-t-000017",
        "-V",
        "-j",
        "oe",
        "-o",
        "/dev/null",
        "-q",
        "gpu",
        "-l",
        "select=1:ngpus=2",
        "-P",
        "ml",
    ]
    script = call["stdin"]
    assert script.startswith("#!/bin/bash\n") and f"exec >>{log} 2>&1" in script
    assert "python train.py --lr 3e-4 &" in script and f"{h.exit_path}" in script
    assert f"cd {tmp_path}" in script
    assert call["env"]["KLIQUE_TASK_ID"] == "t-000017"
    assert "CUDA_VISIBLE_DEVICES" not in call["env"]  # PBS gives the job its GPUs
    assert oct(log.stat().st_mode & 0o777) == "0o600"
    assert ex.adopt(h.to_record()).job_id == "1234.pbs01"


def test_lsf_submits_with_bsub_and_reads_the_job_id(tmp_path, standins):
    standins.answer("bsub", out="lsf/bsub.out")
    ex = executor("lsf", tmp_path, standins)
    h = ex.start(lease(gpus=0.5), [0], tmp_path / "t.log")
    assert h.job_id == "5678"
    (call,) = standins.calls("bsub")
    assert call["argv"] == [
        "-J",
        "klique-t-000017",
        "-o",
        "/dev/null",
        "-cwd",
        str(tmp_path),
        "-q",
        "gpu",
        "-gpu",
        "num=1",
        "-P",
        "ml",
    ]  # a fraction: 1 GPU
    assert call["env"]["KLIQUE_GPU_MEMORY_FRACTION"] == "0.5"


@pytest.mark.parametrize(
    "kind, cmd, err, rc, message",
    [
        (
            "pbs",
            "qsub",
            "pbs/qsub-unknown-queue.err",
            170,
            "qsub refused the job: qsub: Unknown queue",
        ),
        (
            "lsf",
            "bsub",
            "lsf/bsub-unknown-queue.err",
            255,
            "bsub refused the job: gpux: No such queue. Job not submitted.",
        ),
    ],
)
def test_a_refused_submission_fails_the_start_with_the_schedulers_words(
    tmp_path, standins, kind, cmd, err, rc, message
):
    standins.answer(cmd, err=err, rc=rc)
    with pytest.raises(StartError, match=message):
        executor(kind, tmp_path, standins).start(lease(), [0], tmp_path / "t.log")


def test_no_command_or_a_bad_one_is_refused_before_submitting(tmp_path, standins):
    ex = executor("pbs", tmp_path, standins)
    with pytest.raises(StartError, match="runs commands"):
        ex.start({**lease(), "command": None}, [0], tmp_path / "t.log")
    with pytest.raises(StartError, match="list of strings"):
        ex.start({**lease(), "command": "rm -rf /"}, [0], tmp_path / "t.log")
    assert standins.calls() == []


def test_job_id_parsers():
    assert Pbs().job_id("1234.pbs01\n") == "1234.pbs01"
    assert Pbs().job_id("77[].server.example.org\n") == "77[].server.example.org"
    assert Pbs().job_id("qsub: would exceed queue limit\n") is None
    assert Lsf().job_id("Job <5678> is submitted to default queue <normal>.\n") == "5678"
    assert Lsf().job_id("Request aborted by esub. Job not submitted.\n") is None


# states ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "fixture, state, active, started, code, sig",
    [
        ("pbs/qstat-queued.json", "Q", True, False, None, None),
        ("pbs/qstat-running.json", "R", True, True, None, None),
        ("pbs/qstat-finished-0.json", "F", False, True, 0, None),
        ("pbs/qstat-finished-3.json", "F", False, True, 3, None),
        ("pbs/qstat-finished-sigkill.json", "F", False, True, None, "SIGKILL"),
        ("pbs/qstat-exec-fail.json", "F", False, False, None, None),
    ],
)
def test_pbs_states(fixture, state, active, started, code, sig):
    (st,) = Pbs().parse_status((RECORDED / fixture).read_text()).values()
    assert (st.state, st.active, st.started, st.exit_code, st.signal) == (
        state,
        active,
        started,
        code,
        sig,
    )


@pytest.mark.parametrize(
    "fixture, state, active, started, code, sig",
    [
        ("lsf/bjobs-pend.json", "PEND", True, False, None, None),
        ("lsf/bjobs-run.json", "RUN", True, True, None, None),
        ("lsf/bjobs-done.json", "DONE", False, True, 0, None),
        ("lsf/bjobs-exit-3.json", "EXIT", False, True, 3, None),
        ("lsf/bjobs-exit-sigkill.json", "EXIT", False, True, None, "SIGKILL"),
    ],
)
def test_lsf_states(fixture, state, active, started, code, sig):
    (st,) = Lsf().parse_status((RECORDED / fixture).read_text()).values()
    assert (st.state, st.active, st.started, st.exit_code, st.signal) == (
        state,
        active,
        started,
        code,
        sig,
    )
    assert Lsf().parse_status((RECORDED / "lsf/bjobs-notfound.json").read_text()) == {}


@pytest.mark.parametrize(
    "kind, submit, query, fixture, expect",
    [
        (
            "pbs",
            "pbs/qsub.out",
            "qstat",
            "pbs/qstat-finished-3.json",
            Exited(
                3,
                None,
                "pbs job 1234.pbs01, F, started Mon Dec  1 10:00:05 2026, ended Mon Dec"
                "  1 10:20:05 2026 (exit status from pbs)",
            ),
        ),
        (
            "pbs",
            "pbs/qsub.out",
            "qstat",
            "pbs/qstat-finished-sigkill.json",
            Exited(
                None,
                "SIGKILL",
                "pbs job 1234.pbs01, F, started Mon Dec  1 10:00:05 2026, ended "
                "Mon Dec  1 10:20:05 2026 (exit status from pbs)",
            ),
        ),
        (
            "pbs",
            "pbs/qsub.out",
            "qstat",
            "pbs/qstat-exec-fail.json",
            Exited(
                None,
                None,
                "pbs job 1234.pbs01, F, ended Mon Dec  1 10:20:05 2026, Exit_status "
                "-1, JOB_EXEC_FAIL1: the job could not start (before its files) (the "
                "job is gone and its end is unknown (no exit file, the scheduler no "
                "longer shows it))",
            ),
        ),
        (
            "lsf",
            "lsf/bsub.out",
            "bjobs",
            "lsf/bjobs-exit-sigkill.json",
            Exited(
                None,
                "SIGKILL",
                "lsf job 5678, EXIT, started Dec  1 10:00, ended Dec  1 10:20 L "
                "(exit status from lsf)",
            ),
        ),
        (
            "lsf",
            "lsf/bsub.out",
            "bjobs",
            "lsf/bjobs-done.json",
            Exited(
                0,
                None,
                "lsf job 5678, DONE, started Dec  1 10:00, ended Dec  1 10:20 L (exit "
                "status from lsf)",
            ),
        ),
    ],
)
def test_an_end_without_the_exit_file_comes_from_the_scheduler(
    tmp_path, standins, kind, submit, query, fixture, expect
):
    standins.answer("qsub" if kind == "pbs" else "bsub", out=submit)
    ex = executor(kind, tmp_path, standins)
    h = ex.start(lease(), [0], tmp_path / "t.log")
    running = "pbs/qstat-running.json" if kind == "pbs" else "lsf/bjobs-run.json"
    standins.answer(query, out=running)
    assert ex.poll(h) is RUNNING
    standins.answer(query, out=fixture)
    assert ex.poll(h) == expect
    assert ex.poll(h) == expect  # kept: no second query
    q = standins.calls(query)[-1]["argv"]
    assert q == (
        ["-f", "-x", "-F", "json", "1234.pbs01"]
        if kind == "pbs"
        else ["-a", "-json", "-o", "jobid stat exit_code start_time finish_time", "5678"]
    )


@pytest.mark.parametrize("kind", ["pbs", "lsf"])
def test_the_exit_file_wins_and_a_forgotten_job_ends(tmp_path, standins, kind):
    standins.answer(
        "qsub" if kind == "pbs" else "bsub", out="pbs/qsub.out" if kind == "pbs" else "lsf/bsub.out"
    )
    ex = executor(kind, tmp_path, standins)
    h = ex.start(lease(), [0], tmp_path / "t.log")
    Path(h.exit_path).write_text(json.dumps({"exit_code": 0, "signal": None}))
    r = ex.poll(h)
    assert isinstance(r, Exited) and r.exit_code == 0 and r.signal is None
    # a job the scheduler no longer knows, with no exit file: ended, unknown how
    h2 = ex.start(lease(task="t-2"), [0], tmp_path / "t2.log")
    if kind == "pbs":
        standins.answer("qstat", err="pbs/qstat-unknown.err", rc=153)
    else:
        standins.answer("bjobs", out="lsf/bjobs-notfound.json", rc=255)
    r = ex.poll(h2)
    assert isinstance(r, Exited) and (r.exit_code, r.signal) == (None, None)
    assert "its end is unknown" in r.message


@pytest.mark.parametrize("kind", ["pbs", "lsf"])
def test_a_failing_status_query_keeps_the_job_running(tmp_path, standins, kind):
    standins.answer(
        "qsub" if kind == "pbs" else "bsub", out="pbs/qsub.out" if kind == "pbs" else "lsf/bsub.out"
    )
    ex = executor(kind, tmp_path, standins)
    h = ex.start(lease(), [0], tmp_path / "t.log")
    standins.answer("qstat" if kind == "pbs" else "bjobs", rc=1)  # server down
    assert ex.poll(h) is RUNNING


# stop --------------------------------------------------------------------------------------
def test_pbs_stop_of_a_queued_job_deletes_it(tmp_path, standins):
    standins.answer("qsub", out="pbs/qsub.out")
    ex = executor("pbs", tmp_path, standins)
    h = ex.start(lease(), [0], tmp_path / "t.log")
    standins.answer("qstat", out="pbs/qstat-queued.json")
    assert ex.poll(h) is RUNNING
    standins.answer("qdel")
    (standins.dir / "qdel.json").write_text(json.dumps({"rc": 0}))

    async def stop():
        task = asyncio.ensure_future(ex.stop(h, grace_s=5))
        await asyncio.sleep(0.3)
        standins.answer("qstat", err="pbs/qstat-unknown.err", rc=153)  # deleted
        return await task

    r = asyncio.run(stop())
    assert [c["argv"] for c in standins.calls("qdel")] == [["1234.pbs01"]]
    assert standins.calls("qsig") == []
    assert r.message.endswith("(cancelled before it started)")


def test_lsf_stop_sends_term_then_the_task_ends_within_the_grace(tmp_path, standins):
    standins.answer("bsub", out="lsf/bsub.out")
    ex = executor("lsf", tmp_path, standins)
    h = ex.start(lease(), [0], tmp_path / "t.log")
    standins.answer("bjobs", out="lsf/bjobs-run.json")
    standins.answer("bkill", out="lsf/bkill-signal.out")

    async def stop():
        task = asyncio.ensure_future(ex.stop(h, grace_s=5))
        await asyncio.sleep(0.3)  # the task checkpoints and exits 0 on SIGTERM
        Path(h.exit_path).write_text(json.dumps({"exit_code": 0, "signal": None}))
        return await task

    r = asyncio.run(stop())
    assert [c["argv"] for c in standins.calls("bkill")] == [["-s", "TERM", "5678"]]
    assert r.exit_code == 0


@pytest.mark.parametrize(
    "kind, query, running, kill",
    [
        (
            "pbs",
            "qstat",
            "pbs/qstat-running.json",
            [
                ("qsig", ["-s", "TERM", "1234.pbs01"]),
                ("qsig", ["-s", "KILL", "1234.pbs01"]),
                ("qdel", ["-W", "force", "1234.pbs01"]),
            ],
        ),
        (
            "lsf",
            "bjobs",
            "lsf/bjobs-run.json",
            [
                ("bkill", ["-s", "TERM", "5678"]),
                ("bkill", ["-s", "KILL", "5678"]),
                ("bkill", ["-r", "5678"]),
            ],
        ),
    ],
)
def test_a_job_ignoring_term_is_killed_after_the_grace_then_purged(
    tmp_path, standins, kind, query, running, kill
):
    standins.answer(
        "qsub" if kind == "pbs" else "bsub", out="pbs/qsub.out" if kind == "pbs" else "lsf/bsub.out"
    )
    ex = executor(kind, tmp_path, standins)
    h = ex.start(lease(), [0], tmp_path / "t.log")
    standins.answer(query, out=running)  # never ends: the host is gone
    r = asyncio.run(ex.stop(h, grace_s=0.3))
    sent = [
        (c["cmd"], c["argv"]) for c in standins.calls() if c["cmd"] in ("qsig", "qdel", "bkill")
    ]
    assert sent == kill
    assert r.signal == "SIGKILL" and "its end is unknown" in r.message


# a whole worker ----------------------------------------------------------------------------
def test_a_whole_pbs_worker_runs_a_lease_and_reports_pbs_s_end(peer, worker, standins, monkeypatch):
    """``klique-worker --executor pbs --queue gpu --batch-arg ...`` against the protocol's
    reference peer: the lease becomes a qsub, the job's states come from qstat's recorded
    outputs, and its end (exit 3 from PBS, no exit file) is the task's report."""
    for k, v in standins.env().items():
        monkeypatch.setenv(k, v)
    standins.answer("qsub", out="pbs/qsub.out")
    standins.answer("qstat", out="pbs/qstat-running.json")
    w = worker("0,1", ["--executor", "pbs", "--queue", "gpu", "--batch-arg=-P", "--batch-arg=ml"])
    tid = peer.submit(["python", "train.py"])
    peer.wait_for(lambda: "started" in peer.events(tid), 20, "the task's start")
    (call,) = standins.calls("qsub")
    assert call["argv"][-6:] == ["-q", "gpu", "-l", "select=1:ngpus=1", "-P", "ml"]
    assert call["env"]["KLIQUE_TASK_ID"] == tid
    assert next(iter(peer.workers.values()))["executor"] == "pbs"
    standins.answer("qstat", out="pbs/qstat-finished-3.json")
    end = peer.wait_for(lambda: peer.end(tid), 20, "the task's end")
    assert end["event"] == "failed" and end["exit_code"] == 3, w.stderr()
    assert "pbs job 1234.pbs01, F" in end["message"]
