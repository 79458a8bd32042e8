"""The process executor: a task is a child process group on this machine.

Every command runs under ``wrapper.py`` (see there), in its own session and process group
(``start_new_session``), so that a stop reaches the command and everything it started, and
so that the task outlives a restart of the worker. The wrapper watches the worker's liveness
file (workers/liveness.py) and stops an orphaned task before the control plane requeues it.
The wrappers are forked by one long-lived ``wrapper.py --serve`` (a fork server: ~1 ms a
task instead of a Python start); when it cannot run, each task's wrapper is started as
``python -I wrapper.py`` as before.

A task's end is noticed at once: ``exit_waiter`` watches the wrapper's pid through a pidfd
(``os.pidfd_open``, Linux 5.3+) on the event loop; the exit file stays the record of the
exit code, so an adopted task (after the worker's restart) is watched the same way. The environment is the worker's own (or
``--venv``'s virtual env) plus the lease's ``env`` plus CUDA_VISIBLE_DEVICES and the
KLIQUE_* variables, which a lease cannot override.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from klique_util.filemodes import open_private, original_umask
from klique_util.units import gpus_to_milli
from workers.executors.base import (
    RUNNING,
    Executor,
    Exited,
    Handle,
    Running,
    Start,
    Started,
    StartError,
    klique_env,
)
from workers.executors.spawnlock import SpawnLock
from workers.errors import ConfigError
from workers.gpus import Gpu, memory_cap_env
from workers.liveness import path_in as liveness_path

WRAPPER = str(Path(__file__).with_name("wrapper.py"))
POLL_S = 0.05
SPAWN_TIMEOUT_S = 10.0
_log = logging.getLogger(__name__)
# After SIGKILL went to the command, the wrapper gets this long to record the exit.
WRAPPER_RECORD_S = 2.0


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, pgrp, start time in clock ticks) of a live pid from /proc, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read().decode("ascii", "replace")
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return None
    rest = data[data.rindex(")") + 2 :].split()
    # fields after "pid (comm)": state is field 3, pgrp field 5, starttime field 22
    return rest[0], int(rest[2]), int(rest[19])


def process_alive(pid: int, start_ticks: int | None) -> bool:
    """True if `pid` is the same live process (not a zombie, not a recycled pid)."""
    if not os.path.isdir("/proc/self"):  # pragma: no cover - not Linux
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    st = proc_stat(pid)
    if st is None:
        return False
    state, _, ticks = st
    if state in ("Z", "X", "x"):
        return False
    return start_ticks is None or ticks == start_ticks


def group_members(pgid: int) -> list[int]:
    pids: list[int] = []
    try:
        names = os.listdir("/proc")
    except OSError:  # pragma: no cover
        return pids
    for name in names:
        if not name.isdigit():
            continue
        st = proc_stat(int(name))
        if st and st[1] == pgid and st[0] not in ("Z", "X", "x"):
            pids.append(int(name))
    return pids


@dataclass
class ProcessHandle(Handle):
    pid: int  # the wrapper's pid, also the process group id
    pgid: int
    start_ticks: int | None
    exit_path: str
    popen: subprocess.Popen | None = field(default=None, repr=False)
    seen_alive: bool = False
    forked: bool = False  # started by the fork server (this run of the worker)
    killed_by: str | None = None  # the signal the executor sent last

    def to_record(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "pgid": self.pgid,
            "start_ticks": self.start_ticks,
            "exit_path": self.exit_path,
        }


class ForkServer:
    """The worker's ``wrapper.py --serve`` (see wrapper.py): one JSON line a request. It
    holds the worker's spawn lock (spawnlock.py), and so does each wrapper it forks until
    its start marker is written."""

    def __init__(self, spawn_lock: SpawnLock | None = None) -> None:
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()
        self.broken: str | None = None
        self.spawn_lock = spawn_lock

    def _ensure(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None:
            held = (self.spawn_lock.fd(),) if self.spawn_lock is not None else ()
            self.proc = subprocess.Popen(  # tasks get the umask the worker started with
                [sys.executable, "-I", "-S", WRAPPER, "--serve"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                start_new_session=True,
                close_fds=True,
                pass_fds=held,
                umask=original_umask(),
            )
            if self.spawn_lock is not None:
                self.spawn_lock.holder(self.proc.pid)
        return self.proc

    def _ask(self, req: bytes) -> Any:
        proc = self._ensure()
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(req)
        proc.stdin.flush()
        ready, _, _ = select.select([proc.stdout], [], [], SPAWN_TIMEOUT_S)
        if not ready:
            proc.kill()
            raise OSError("the fork server did not answer")
        line = proc.stdout.readline()
        if not line:
            raise OSError("the fork server is gone")
        return json.loads(line)

    def spawn(self, req: dict) -> dict:
        return self.spawn_many([req])[0]

    def spawn_many(self, reqs: list[dict]) -> list[dict]:
        """One request line for the whole batch (wrapper.py forks them all, then waits for
        each); an answer a request, in order."""
        data = json.dumps(reqs).encode() + b"\n"
        with self.lock:
            try:
                answers = self._ask(data)
            except (OSError, ValueError):
                self.close()
                answers = self._ask(data)  # once more with a new server
        if not isinstance(answers, list) or len(answers) != len(reqs):
            raise ValueError(f"the fork server answered {answers!r} to {len(reqs)} requests")
        return answers

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(2)
        except Exception:
            proc.kill()
        finally:
            if proc.stdout is not None:
                proc.stdout.close()


class ProcessExecutor(Executor[ProcessHandle]):
    name = "process"

    def __init__(
        self,
        state_dir: str | Path,
        venv: str | Path | None = None,
        workdir: str | Path | None = None,
        base_env: dict[str, str] | None = None,
        gpus: list[Gpu] | None = None,
        use_fork_server: bool = True,
    ):
        self.gpus = list(gpus or [])  # the worker's GPUs (their memory caps fractions)
        self.run_dir = Path(state_dir) / "run"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.venv = Path(venv).resolve() if venv else None
        if self.venv and not (self.venv / "bin").is_dir():
            raise ConfigError(f"--venv {venv}: no bin/ directory there; is it a virtual env?")
        self.workdir = str(workdir) if workdir else None
        self.base_env = dict(base_env if base_env is not None else os.environ)
        self.use_fork_server = use_fork_server
        self.spawn_lock = SpawnLock(self.run_dir)
        self.fork_server = ForkServer(self.spawn_lock)
        # the worker's liveness file: each wrapper stops its task once the worker is gone
        # for longer than the control plane waits before requeueing it (workers/liveness.py)
        self.watch = str(liveness_path(state_dir))

    def orphan_kill(self, lease: dict) -> list[str] | None:
        """A command the wrapper of an orphaned task runs before its SIGKILL, for what is
        not in its process group (a container); None for a plain process."""
        return None

    # environment -------------------------------------------------------------------------
    def _venv(self) -> Path | None:
        if self.venv is None and sys.prefix != sys.base_prefix:
            return Path(sys.prefix)  # the worker's own virtual env
        return self.venv

    def task_path(self) -> str:
        """The tasks' PATH: the virtual env's ``bin`` first, as :meth:`environment` sets."""
        path = self.base_env.get("PATH", os.defpath)
        venv = self._venv()
        return path if venv is None else f"{venv / 'bin'}{os.pathsep}{path}"

    def environment(self, lease: dict, gpu_indices: list[int]) -> dict[str, str]:
        env = dict(self.base_env)
        venv = self._venv()
        if venv is not None:
            env["VIRTUAL_ENV"] = str(venv)
            env["PATH"] = self.task_path()
            env.pop("PYTHONHOME", None)
        env.update(klique_env(lease))
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in gpu_indices)
        for key in ("KLIQUE_GPU_MEMORY_MB", "KLIQUE_GPU_MEMORY_FRACTION"):
            env.pop(key, None)  # only the worker sets a fraction's memory share
        env.update(memory_cap_env(self.gpus, gpu_indices, gpus_to_milli(lease.get("gpus"))))
        return env

    # Executor ----------------------------------------------------------------------------
    def settle(self) -> None:
        """Takes the spawn lock (spawnlock.py): once it is held, every start an earlier run
        of the worker asked for has left its marker or never happened."""
        self.spawn_lock.fd()

    def started(self, key: str) -> Started | None:
        """The wrapper of ``key`` ran if its exit record or its start marker exists
        (wrapper.py): its ``start`` line gives the handle. The exit record is read first and
        again after the marker, since the wrapper writes the one and then removes the
        other."""
        exit_path = self.run_dir / f"{key}.exit"
        start = _start_of_exit(exit_path)
        if start is None:
            start = _start_of_marker(Path(f"{exit_path}.reserve"))
        if start is None:
            start = _start_of_exit(exit_path)
        if start is None:
            return None
        pid, ticks = start.get("pid"), start.get("start_ticks")
        if not isinstance(pid, int) or pid <= 0:
            return None
        handle = ProcessHandle(
            pid=pid,
            pgid=pid,
            start_ticks=ticks if isinstance(ticks, int) else None,
            exit_path=str(exit_path),
        )
        at, mark = start.get("started_at"), start.get("mark")
        return Started(
            handle.to_record(),
            at if isinstance(at, str) else None,
            mark if isinstance(mark, dict) else None,
        )

    def leftovers(self, key: str) -> list[Path]:
        """The wrapper's start marker (with its reserve): kept until the end is reported."""
        return [self.run_dir / f"{key}.exit.reserve"]

    def started_keys(self) -> list[str]:
        suffix = ".exit.reserve"
        return sorted(p.name[: -len(suffix)] for p in self.run_dir.glob(f"*{suffix}"))

    def _request(
        self, lease: dict, gpu_indices: list[int], log_path: Path, mark: dict | None = None
    ) -> dict:
        """The fork server's request for a lease (its checks first: a ``StartError`` names
        what is wrong with it); the exit file of an earlier attempt removed."""
        command = lease.get("command")
        if not command:
            raise StartError(
                "the process executor runs commands and this task has none "
                "(a payload-only task needs an executor that understands it)"
            )
        if not isinstance(command, list) or not all(isinstance(a, str) for a in command):
            raise StartError(f"the task's command must be a list of strings, not {command!r}")
        exit_path = self.run_dir / f"{Path(log_path).stem}.exit"
        exit_path.unlink(missing_ok=True)
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        return {
            "exit_file": str(exit_path),
            "command": command,
            "env": self.environment(lease, gpu_indices),
            "cwd": self.workdir,
            "log": str(log_path),
            "watch": self.watch,
            "orphan_kill": self.orphan_kill(lease),
            "mark": mark,
        }

    def _forked(self, req: dict, answer: dict) -> ProcessHandle:
        if "error" in answer:
            raise StartError(f"cannot start the task's wrapper: {answer['error']}")
        pid = int(answer["pid"])
        return ProcessHandle(
            pid=pid,
            pgid=pid,
            start_ticks=answer.get("start_ticks"),
            exit_path=req["exit_file"],
            seen_alive=True,
            forked=True,
        )

    def _server_broken(self, exc: Exception) -> None:
        self.fork_server.broken = str(exc)
        _log.warning(
            "the wrappers' fork server cannot run (%s): every task's wrapper "
            "starts its own Python from now on",
            exc,
        )

    def start_many(self, starts: list[Start]) -> list[ProcessHandle | StartError]:
        """Every lease's wrapper from one request to the fork server, which forks them all
        before it waits for any (wrapper.py); one after the other without it, or for a
        subclass with a ``start`` of its own (the container executor)."""
        if (
            type(self).start is not ProcessExecutor.start
            or not self.use_fork_server
            or self.fork_server.broken is not None
        ):
            return self._one_by_one(starts)
        out: list[ProcessHandle | StartError | None] = []
        reqs: list[tuple[int, dict]] = []
        for s in starts:
            try:
                reqs.append((len(out), self._request(s.lease, s.gpu_indices, s.log_path, s.mark)))
                out.append(None)
            except StartError as exc:
                out.append(exc)
        if reqs:
            try:
                answers = self.fork_server.spawn_many([r for _, r in reqs])
            except (OSError, ValueError) as exc:
                self._server_broken(exc)
                for i, _ in reqs:
                    s = starts[i]
                    try:
                        out[i] = self.start(s.lease, s.gpu_indices, s.log_path, s.mark)
                    except StartError as err:
                        out[i] = err
            else:
                for (i, req), answer in zip(reqs, answers):
                    try:
                        out[i] = self._forked(req, answer)
                    except StartError as exc:
                        out[i] = exc
        return [h for h in out if h is not None]

    def _one_by_one(self, starts: list[Start]) -> list[ProcessHandle | StartError]:
        out: list[ProcessHandle | StartError] = []
        for s in starts:
            try:
                out.append(self.start(s.lease, s.gpu_indices, s.log_path, s.mark))
            except StartError as exc:
                out.append(exc)
        return out

    def start(
        self, lease: dict, gpu_indices: list[int], log_path: Path, mark: dict | None = None
    ) -> ProcessHandle:
        """``mark``: the task's record, written by the wrapper into its start marker before
        the task runs (wrapper.py), for a worker restarted before it recorded the start."""
        req = self._request(lease, gpu_indices, log_path, mark)
        if self.use_fork_server and self.fork_server.broken is None:
            try:
                answer = self.fork_server.spawn(req)
            except (OSError, ValueError) as exc:
                self._server_broken(exc)
            else:
                return self._forked(req, answer)
        exit_path = Path(req["exit_file"])
        command, env, orphan_kill = req["command"], req["env"], req["orphan_kill"]
        held = self.spawn_lock.fd()  # the wrapper holds it until its marker is written
        with open(open_private(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab") as log:
            try:
                popen = subprocess.Popen(
                    [
                        sys.executable,
                        "-I",
                        WRAPPER,
                        str(exit_path),
                        "--watch",
                        self.watch,
                        *(["--orphan-kill", json.dumps(orphan_kill)] if orphan_kill else []),
                        *(["--mark", json.dumps(mark)] if mark is not None else []),
                        "--hold",
                        str(held),
                        "--",
                        *command,
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                    pass_fds=(held,),
                    cwd=self.workdir,
                    env=env,
                    umask=original_umask(),
                )
            except OSError as exc:
                raise StartError(f"cannot start the task's wrapper: {exc}") from exc
        st = proc_stat(popen.pid)
        return ProcessHandle(
            pid=popen.pid,
            pgid=popen.pid,
            start_ticks=st[2] if st else None,
            exit_path=str(exit_path),
            popen=popen,
            seen_alive=True,
        )

    def adopt(self, record: dict[str, Any]) -> ProcessHandle:
        return ProcessHandle(
            pid=int(record["pid"]),
            pgid=int(record["pgid"]),
            start_ticks=record.get("start_ticks"),
            exit_path=str(record["exit_path"]),
        )

    def close(self) -> None:
        """Ends the fork server (the wrappers it forked live on) and lets the spawn lock go."""
        self.fork_server.close()
        self.spawn_lock.close()

    def exit_waiter(self, h: ProcessHandle) -> asyncio.Future | None:
        """A future done as soon as the task's wrapper is gone (a pidfd on the event loop),
        or None where pidfds do not exist (then the caller polls). Cancel it to stop
        watching."""
        if not hasattr(os, "pidfd_open"):
            return None
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()
        try:
            fd = os.pidfd_open(h.pid)
        except ProcessLookupError:
            fut.set_result(None)
            return fut
        except OSError:
            return None
        # the pid may have been reused before the pidfd was opened: check it is the wrapper
        if h.popen is None and not process_alive(h.pid, h.start_ticks):
            os.close(fd)
            fut.set_result(None)
            return fut
        closed = False

        def cleanup(_: object = None) -> None:
            nonlocal closed
            if not closed:
                closed = True
                loop.remove_reader(fd)
                os.close(fd)

        def ready() -> None:
            cleanup()
            if not fut.done():
                fut.set_result(None)

        loop.add_reader(fd, ready)
        fut.add_done_callback(cleanup)
        return fut

    def _alive(self, h: ProcessHandle) -> bool:
        if h.popen is not None:
            return h.popen.poll() is None
        return process_alive(h.pid, h.start_ticks)

    def poll(self, h: ProcessHandle) -> Running | Exited:
        if self._alive(h):
            h.seen_alive = True
            return RUNNING
        result = self._result(h)
        if h.seen_alive:
            # the wrapper is gone; anything the command left behind in its group goes too
            # (the group id cannot be reused while members remain)
            self._signal_group(h, signal.SIGKILL)
            h.seen_alive = False
        return result

    def _result(self, h: ProcessHandle) -> Exited:
        try:
            data = json.loads(Path(h.exit_path).read_text(encoding="utf-8"))
            ended_at = data.get("ended_at")
            return Exited(
                data.get("exit_code"),
                data.get("signal"),
                data.get("message"),
                ended_at if isinstance(ended_at, str) else None,
                recorded=True,
            )
        except (OSError, ValueError):
            pass
        if h.popen is not None and h.popen.returncode is not None:
            rc = h.popen.returncode
            if rc < 0:
                return Exited(None, _signal_name(-rc))
            return Exited(rc, None, "the wrapper ended without recording the task's exit")
        if h.killed_by:
            return Exited(None, h.killed_by)
        if h.forked:
            return Exited(None, None, "the wrapper ended without recording the task's exit")
        return Exited(
            None,
            None,
            "the task ended while the worker was down and its exit was "
            "not recorded (its wrapper was killed)",
        )

    def _signal_group(self, h: ProcessHandle, sig: int) -> None:
        try:
            os.killpg(h.pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _ended(self, h: ProcessHandle) -> Exited:
        """``poll`` of a task that was seen gone: its exit (it cannot come back)."""
        result = self.poll(h)
        if isinstance(result, Exited):
            return result
        return Exited(None, None, "the task was still running after it was stopped")

    async def stop(self, h: ProcessHandle, grace_s: float) -> Exited:
        if not self._alive(h):
            return self._ended(h)
        if grace_s > 0:
            h.killed_by = "SIGTERM"
            self._signal_group(h, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline:
                if not self._alive(h):
                    return self._ended(h)
                await asyncio.sleep(POLL_S)
        # SIGKILL to the command and whatever it started, but not to the wrapper, which then
        # records the exit; then the whole group, wrapper included.
        h.killed_by = "SIGKILL"
        for pid in group_members(h.pgid):
            if pid != h.pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        deadline = time.monotonic() + WRAPPER_RECORD_S
        while time.monotonic() < deadline and self._alive(h):
            await asyncio.sleep(POLL_S)
        self._signal_group(h, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self._alive(h):
            await asyncio.sleep(POLL_S)
        return self._ended(h)


def _start_of_exit(path: Path) -> dict | None:
    """The ``start`` line an exit record repeats (wrapper.py), or None."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    start = data.get("start") if isinstance(data, dict) else None
    return start if isinstance(start, dict) else None


def _start_of_marker(path: Path) -> dict | None:
    """The JSON line at the head of a start marker (wrapper.py), or None."""
    try:
        with open(path, "rb") as fh:
            head = fh.read()
        start = json.loads(head.split(b"\n", 1)[0])
    except (OSError, ValueError):
        return None
    return start if isinstance(start, dict) else None


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"SIG{signum}"
