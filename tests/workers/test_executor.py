"""The process executor with real processes: environment, logs, exit codes and signals,
stops (SIGTERM, grace, SIGKILL), the wrapper's exit record for an adopted process."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from tests.harness.typed import present
from tests.harness.wait import wait_for
from tests.workers.conftest import pid_alive
from workers.executors import RUNNING, Exited, StartError
from workers.executors.base import Start
from workers.executors.process import ProcessExecutor


def lease(command, task="t-1", epoch=1, **extra):
    return {
        "task": task,
        "epoch": epoch,
        "command": command,
        "gpus": 1.0,
        "user": "alice",
        "project": "llm",
        "resource": "team-a/standard",
        **extra,
    }


def wait_exit(ex, handle, timeout=10.0) -> Exited:
    return wait_for(lambda: (r := ex.poll(handle)) is not RUNNING and r, timeout, "exit")


PY = sys.executable


def test_runs_the_command_with_its_environment_and_captures_the_log(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    ex = ProcessExecutor(tmp_path / "state", venv=venv, workdir=tmp_path)
    log = tmp_path / "state" / "logs" / "t-1.e4.log"
    script = (
        "import os, sys\n"
        "for k in ('CUDA_VISIBLE_DEVICES', 'KLIQUE_TASK_ID', 'KLIQUE_EPOCH', "
        "'VIRTUAL_ENV', 'KLIQUE_USER', 'FROM_LEASE'):\n"
        "    print(k, os.environ.get(k))\n"
        "print('PATH0', os.environ['PATH'].split(os.pathsep)[0])\n"
        "print('CWD', os.getcwd())\n"
        "print('to stderr', file=sys.stderr)\n"
        "sys.exit(3)\n"
    )
    h = ex.start(
        lease([PY, "-c", script], epoch=4, env={"FROM_LEASE": "yes", "KLIQUE_TASK_ID": "forged"}),
        [2, 3],
        log,
    )
    assert os.getpgid(h.pid) == h.pid != os.getpgid(0)  # its own process group
    assert wait_exit(ex, h) == Exited(3, None)
    text = log.read_text()
    assert "CUDA_VISIBLE_DEVICES 2,3" in text
    assert "KLIQUE_TASK_ID t-1" in text  # a lease cannot override KLIQUE_*
    assert "KLIQUE_EPOCH 4" in text
    assert f"VIRTUAL_ENV {venv.resolve()}" in text
    assert f"PATH0 {venv.resolve() / 'bin'}" in text
    assert "KLIQUE_USER alice" in text and "FROM_LEASE yes" in text
    assert f"CWD {tmp_path}" in text
    assert "to stderr" in text


def test_exit_by_signal_and_command_not_found(tmp_path):
    ex = ProcessExecutor(tmp_path)
    h = ex.start(lease(["sh", "-c", "kill -USR1 $$"]), [0], tmp_path / "a.log")
    assert wait_exit(ex, h) == Exited(None, "SIGUSR1")
    h = ex.start(lease(["no-such-command-klique"], task="t-2"), [0], tmp_path / "b.log")
    result = wait_exit(ex, h)
    assert result.exit_code == 127
    assert "cannot run 'no-such-command-klique'" in (tmp_path / "b.log").read_text()
    with pytest.raises(StartError, match="has none"):
        ex.start(lease(None, task="t-3"), [0], tmp_path / "c.log")


TRAPS_TERM = """
import signal, sys, time
def on_term(*_):
    open(sys.argv[1], "w").write("checkpointed")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
time.sleep(60)
"""

IGNORES_TERM = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(60)
"""


def _ready(log: Path) -> bool:
    return log.exists() and "ready" in log.read_text()


def test_stop_sends_sigterm_and_a_trapping_child_checkpoints_and_exits_0(tmp_path):
    ex = ProcessExecutor(tmp_path)
    marker, log = tmp_path / "marker", tmp_path / "t.log"
    h = ex.start(lease([PY, "-c", TRAPS_TERM, str(marker)]), [0], log)
    wait_for(lambda: _ready(log), 10, "child ready")
    t0 = time.monotonic()
    result = asyncio.run(ex.stop(h, 5.0))
    assert result == Exited(0, None)
    assert time.monotonic() - t0 < 3
    assert marker.read_text() == "checkpointed"


def test_a_child_ignoring_sigterm_is_sigkilled_after_the_grace(tmp_path):
    ex = ProcessExecutor(tmp_path)
    log = tmp_path / "t.log"
    # the command starts a grandchild in its group: the stop reaches it too
    h = ex.start(
        lease(
            ["sh", "-c", f"{PY} -c 'import time; time.sleep(60)' & exec {PY} -c '{IGNORES_TERM}'"]
        ),
        [0],
        log,
    )
    wait_for(lambda: _ready(log), 10, "child ready")
    from workers.executors.process import group_members

    members = group_members(h.pgid)
    assert len(members) >= 3  # wrapper, command, grandchild
    t0 = time.monotonic()
    result = asyncio.run(ex.stop(h, 1.0))
    elapsed = time.monotonic() - t0
    assert result == Exited(None, "SIGKILL")
    assert 0.9 <= elapsed < 4
    wait_for(lambda: not any(pid_alive(p) for p in members), 5, "group gone")


@pytest.mark.parametrize("fork_server", [True, False])
def test_the_wrapper_records_the_exit_of_an_adopted_process(tmp_path, fork_server):
    first = ProcessExecutor(tmp_path, use_fork_server=fork_server)
    h = first.start(lease(["sh", "-c", "sleep 0.6; exit 7"]), [0], tmp_path / "t.log")
    record = h.to_record()
    # a new executor (a restarted worker) takes it back by its record: not its child
    again = ProcessExecutor(tmp_path)
    adopted = again.adopt(record)
    assert adopted.popen is None
    assert again.poll(adopted) is RUNNING
    assert wait_exit(again, adopted) == Exited(7, None)
    if h.popen is not None:
        h.popen.wait()  # reap it for the first "worker" (the test's own child)
    assert h.forked == fork_server

    # ended by a signal while nobody watched: the wrapper knows
    h = first.start(
        lease(["sh", "-c", "sleep 0.3; kill -TERM $$"], task="t-2"), [0], tmp_path / "u.log"
    )
    record = h.to_record()
    if h.popen is not None:
        h.popen.wait()
    wait_for(lambda: not pid_alive(h.pid), 10, "the wrapper gone")
    assert wait_exit(ProcessExecutor(tmp_path), first.adopt(record)) == Exited(None, "SIGTERM")


def test_a_recycled_pid_is_not_taken_for_the_task(tmp_path):
    ex = ProcessExecutor(tmp_path)
    record = {
        "pid": os.getpid(),
        "pgid": os.getpgid(0),
        "start_ticks": 1,
        "exit_path": str(tmp_path / "missing.exit"),
    }
    result = ex.poll(ex.adopt(record))  # alive pid, other start time: not our task
    assert isinstance(result, Exited) and result.exit_code is None and result.message


def test_exit_waiter_notices_the_end_at_once(tmp_path):
    """The pidfd future is done as soon as the wrapper is gone (no polling delay), for a
    task of this run and for an adopted one; the exit code still comes from the exit file."""
    ex = ProcessExecutor(tmp_path)

    async def main() -> tuple[float, Exited, Exited]:
        h = ex.start(lease(["sh", "-c", "sleep 0.2; exit 5"]), [0], tmp_path / "t.log")
        fut = ex.exit_waiter(h)
        assert fut is not None and not fut.done()
        t0 = time.monotonic()
        await asyncio.wait_for(fut, 10)
        took = time.monotonic() - t0
        first = ex.poll(h)
        h2 = ex.start(lease(["true"], task="t-2"), [0], tmp_path / "u.log")
        adopted = ProcessExecutor(tmp_path).adopt(h2.to_record())
        await asyncio.wait_for(present(ProcessExecutor(tmp_path).exit_waiter(adopted)), 10)
        return took, first, ex.poll(adopted)

    took, first, second = asyncio.run(main())
    assert took < 0.5
    assert first == Exited(5, None)
    assert second == Exited(0, None)
    ex.close()


def test_fork_server_wrapper_keeps_the_semantics(tmp_path):
    """Exit 130 is an exit code, SIGINT a signal; a missing command is 127; the task's
    environment and cwd are the lease's, not the fork server's."""
    ex = ProcessExecutor(tmp_path, workdir=tmp_path)
    cases = [
        (["sh", "-c", "exit 130"], Exited(130, None)),
        (["sh", "-c", "kill -INT $$"], Exited(None, "SIGINT")),
        (["no-such-command-klique"], Exited(127, None, "cannot run 'no-such-command-klique'")),
        (
            [
                PY,
                "-c",
                "import signal, sys; sys.exit(0 if signal.getsignal(signal.SIGINT) "
                "is signal.default_int_handler and signal.getsignal(signal.SIGTERM) "
                "== signal.SIG_DFL else 9)",
            ],
            Exited(0, None),
        ),
    ]
    for i, (cmd, want) in enumerate(cases):
        h = ex.start(lease(cmd, task=f"t-{i}"), [0], tmp_path / f"{i}.log")
        assert h.forked
        assert wait_exit(ex, h) == want, (cmd, (tmp_path / f"{i}.log").read_text())
    with pytest.raises(StartError):
        ProcessExecutor(tmp_path, workdir=tmp_path / "missing").start(
            lease(["true"], task="t-x"), [0], tmp_path / "x.log"
        )
    ex.close()


def test_a_batch_of_starts_is_forked_together_each_with_its_own_outcome(tmp_path):
    """``start_many`` (the worker's batch, issue 29): one request to the fork server for
    every lease; each gets its own wrapper, process group and exit record, in order, and a
    lease that cannot start is that item's StartError without holding the others back."""
    ex = ProcessExecutor(tmp_path)
    starts = [
        Start(lease(["sh", "-c", f"exit {i}"], task=f"t-{i}"), [i], tmp_path / f"{i}.log")
        for i in range(5)
    ]
    starts[2] = Start(lease([], task="t-2"), [2], tmp_path / "2.log")  # no command
    handles = ex.start_many(starts)
    assert isinstance(handles[2], StartError)
    ok = [h for h in handles if not isinstance(h, StartError)]
    assert len(ok) == 4 and all(h.forked for h in ok)
    assert len({h.pgid for h in ok}) == 4  # a process group each
    assert [wait_exit(ex, h) for h in ok] == [Exited(i, None) for i in (0, 1, 3, 4)]
    ex.close()


def test_the_forked_wrapper_closes_every_inherited_descriptor():
    """The fork server's child closes every descriptor from 3 up before it runs the task
    (now those /proc/self/fd lists, not 65,536 numbers one by one: issue 29), including
    ones left open without close-on-exec."""
    from workers.executors import wrapper

    extra = [os.open(os.devnull, os.O_RDONLY) for _ in range(3)]
    extra.append(os.dup2(extra[0], 200))  # a gap: not only the lowest numbers
    try:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 2
            try:
                wrapper._close_fds_from(3)
                left = {int(f) for f in os.listdir("/proc/self/fd")}
                code = 0 if left <= {0, 1, 2, 3} else 1  # 3: the listing's own
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        for fd in extra:
            os.close(fd)


@pytest.mark.parametrize("fork_server", [True, False])
def test_a_start_leaves_its_marker_until_its_exit_records_it(tmp_path, fork_server):
    """Issue 29: the wrapper marks its start (``run/<key>.exit.reserve``: its pid and the
    worker's mark) before the task runs, and its exit record repeats it; ``started`` reads
    either, so a worker killed before it recorded the start takes the wrapper back."""
    ex = ProcessExecutor(tmp_path, use_fork_server=fork_server)
    mark = {"task": "t-1", "epoch": 1, "gpus": [0]}
    log = tmp_path / "logs" / "t-1.e1.log"
    gate = tmp_path / "gate"
    (h,) = ex.start_many(
        [
            Start(
                lease(["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done; exit 3"]),
                [0],
                log,
                mark,
            )
        ]
    )
    assert not isinstance(h, StartError)
    assert ex.started("t-2.e1") is None  # never started
    running = wait_for(lambda: ex.started("t-1.e1"), 10, "the marker")
    assert running.handle["pid"] == h.pid and running.mark == mark
    assert (tmp_path / "run" / "t-1.e1.exit.reserve").stat().st_size >= 8192  # the reserve
    adopted = ProcessExecutor(tmp_path).adopt(running.handle)
    assert ex.poll(adopted) is RUNNING
    gate.touch()
    assert wait_exit(ex, h) == Exited(3, None)
    # the worker that handed a mark removes the marker once it forgot the task
    marker = tmp_path / "run" / "t-1.e1.exit.reserve"
    assert marker.exists() and ex.leftovers("t-1.e1") == [marker]
    marker.unlink()
    ended = ex.started("t-1.e1")  # from the exit record now
    assert ended is not None and ended.handle["pid"] == h.pid and ended.mark == mark
    assert ended.started_at == running.started_at
    assert wait_exit(ex, ex.adopt(ended.handle)) == Exited(3, None)
    if h.popen is not None:
        h.popen.wait()
    # without a mark (a batch job's wrapper) the wrapper removes its marker itself
    (h2,) = ex.start_many(
        [Start(lease(["true"], task="t-3"), [0], tmp_path / "logs" / "t-3.e1.log")]
    )
    assert not isinstance(h2, StartError)
    wait_exit(ex, h2)
    assert ex.started("t-3.e1") is not None
    assert not (tmp_path / "run" / "t-3.e1.exit.reserve").exists()
    ex.close()


def _locked(path: Path) -> bool:
    import fcntl

    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_a_restart_waits_until_the_fork_server_of_the_killed_worker_is_done(tmp_path):
    """The spawn lock (workers/executors/spawnlock.py): the fork server holds it while it
    lives, so a worker killed while a start request was under way leaves it held until the
    server has forked (and the wrappers marked) everything asked of it."""
    import threading

    first = ProcessExecutor(tmp_path)
    h = first.start(lease(["true"]), [0], tmp_path / "t.log")
    wait_exit(first, h)
    lock = tmp_path / "run" / "spawn.lock"
    first.spawn_lock.close()  # the worker is gone; its fork server is not
    assert _locked(lock)
    again = ProcessExecutor(tmp_path)
    settled = threading.Thread(target=again.settle)
    settled.start()
    try:
        assert settled.is_alive()
        first.fork_server.close()  # the server reads EOF (the worker's pipe) and exits
        settled.join(10)
        assert not settled.is_alive()
    finally:
        first.fork_server.close()
        settled.join(10)
    assert again.spawn_lock._fd is not None
    again.close()
    assert not _locked(lock)


def test_a_restart_ends_a_fork_server_that_never_lets_the_lock_go(tmp_path, monkeypatch):
    import signal

    from workers.executors import spawnlock

    first = ProcessExecutor(tmp_path)
    wait_exit(first, first.start(lease(["true"]), [0], tmp_path / "t.log"))
    server = present(first.fork_server.proc)
    first.spawn_lock.close()
    os.kill(server.pid, signal.SIGSTOP)  # hung
    monkeypatch.setattr(spawnlock, "WAIT_S", 0.3)
    try:
        again = ProcessExecutor(tmp_path)
        again.settle()  # ends the recorded server, then takes the lock
        assert server.wait(5) == -signal.SIGKILL
        again.close()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def test_the_wrapper_looks_the_program_up_on_the_tasks_own_path(tmp_path):
    """``spawn_task`` (posix_spawn, issue 29) finds a program as ``subprocess`` did with
    ``env``: on the task's ``PATH`` (a virtual env's ``bin/`` first), not the wrapper's; a
    program found but not runnable is a PermissionError (126), one found nowhere a
    FileNotFoundError (127)."""
    from workers.executors import wrapper

    own, other = tmp_path / "own", tmp_path / "other"
    own.mkdir()
    other.mkdir()
    (own / "klique-probe").write_text("#!/bin/sh\nexit 5\n")
    (own / "klique-probe").chmod(0o755)
    (other / "klique-probe").write_text("#!/bin/sh\nexit 6\n")  # first, but not runnable
    (other / "klique-probe").chmod(0o644)
    (other / "klique-noexec").write_text("")
    env = {"PATH": f"{other}:{own}"}
    assert wrapper._wait_code(wrapper.spawn_task(["klique-probe"], env)) == 5
    with pytest.raises(PermissionError):
        wrapper.spawn_task(["klique-noexec"], env)
    with pytest.raises(FileNotFoundError):
        wrapper.spawn_task(["klique-probe"], {"PATH": str(tmp_path)})
    # SIGPIPE at its default in the task (Python ignores it in the wrapper)
    code = wrapper._wait_code(
        wrapper.spawn_task(["sh", "-c", "kill -PIPE $$"], {"PATH": os.environ["PATH"]})
    )
    assert code == -13
