"""The tiny wrapper every task command runs under.

    python -I wrapper.py EXIT_FILE [--watch WORKER_FILE [--orphan-kill JSON]] [--mark JSON]
        [--hold FD] -- COMMAND...

It starts COMMAND as its child (same process group, same stdout/stderr: the task's log),
waits for it and writes its end to EXIT_FILE atomically:

    {"exit_code": 0 | null, "signal": "SIGTERM" | null, "pid": <child pid>, "ended_at": "...",
     "start": {"pid": <the wrapper's pid>, "start_ticks", "started_at", "mark"}}

and then exits with the child's code (128 + signal number for a signal). The worker reads
EXIT_FILE when the wrapper is gone, so a task whose worker restarted, and which is no longer
the worker's child, still reports its real exit code: its result is never lost.

**The start marker.** Before it runs COMMAND (in the fork server's child: before the server
may answer) the wrapper writes ``EXIT_FILE.reserve``: a JSON line ``{"pid", "start_ticks",
"started_at", "mark"}`` (``mark``: what the worker handed with the start, ``--mark JSON``:
the task's record) padded with NULs to ``RESERVE`` bytes, which are also the disk space kept
for the exit record (below). The exit record repeats that line as ``"start"``; the marker is removed
once the exit is recorded, by the wrapper, or by the worker that handed a mark once it has
reported the end. A worker
killed after the start and before it wrote the task's record finds one of the two at its
restart, so it takes the running wrapper back rather than starting the task a second time.
``--hold FD``: a descriptor (the worker's ``run/spawn.lock``, flock'ed) closed once the
marker is written; a restarted worker takes that lock before it reads the markers, so every
start still under way has left its marker by then.

The wrapper ignores SIGTERM/SIGINT/SIGHUP sent to the task's process group (the worker sends
SIGTERM to the group on a stop instruction; the command itself decides what to do with it),
so that it stays to record the exit. It installs Python handlers rather than SIG_IGN, so the
command starts with default dispositions. Standard library only, run with ``-I`` so that
neither the task's environment (PYTHONPATH, ...) nor its virtual env can break it.

**Orphans.** With ``--watch WORKER_FILE`` (the worker's liveness file, workers/liveness.py)
a thread of the wrapper watches its worker. While the worker runs (its pid, or a fresh
``alive_at``) nothing happens, even when the control plane is unreachable. Once the worker
is gone, the task gets SIGTERM (its process group, as a stop does) at the file's
``term_at`` and SIGKILL at ``kill_at``, both before the control plane can declare the worker
lost and requeue the task: two copies never run. A worker restarted before ``term_at``
rewrites the file and keeps the task. ``--orphan-kill`` is a command run just before the
SIGKILL (the container executor's ``docker kill NAME``: a container is not in the group).
The exit record then says ``"message": "worker-lost: ..."``, which the worker reports as a
lost task (requeued, not failed) if the control plane has not fenced it already.

**Fork server.** Starting a Python interpreter for every task costs tens of milliseconds
of CPU (measured here: ~90 ms wall for ``python -I wrapper.py ... true`` on a busy 2-core
machine), more than everything else a trivial task costs. So the worker keeps one

    python -I -S wrapper.py --serve

running (``ProcessExecutor``): it reads one JSON request a line on stdin (``{"exit_file",
"command", "env", "cwd", "log"}``, optionally ``"watch"``, ``"orphan_kill"`` and ``"mark"``; or a list
of those, answered with a list: the worker's batch, forked all before any is waited for),
forks,
and the forked child becomes exactly the wrapper above (a session and process group of its own, stdin ``/dev/null``, stdout and stderr
appended to ``log``, its start marker written, in ``cwd``, then ``run``: the same code as the
command-line form), and
answers ``{"pid", "start_ticks"}`` (or ``{"error"}``) on stdout. A fork of this small process
costs about a millisecond. The wrappers do not depend on the server once forked: if the
server or the worker dies, they keep running and still record the exit. The server reaps
its children and exits when its stdin closes (the worker is gone).
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: the fork server forks this process for every task,
    import threading  # and a smaller one forks faster (issue 29)


def _write_exit(path: str, record: dict) -> None:
    """Atomically, and durable before the rename: a temporary name of this process's own
    (its pid and the exit file's name: no other writer), not ``tempfile`` (whose import
    alone was a fifth of the fork server's memory, copied at every fork)."""
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    try:
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        try:
            os.write(fd, json.dumps(record).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


SIGNALS_DEFAULT = tuple(
    getattr(signal, name) for name in ("SIGPIPE", "SIGXFSZ") if hasattr(signal, name)
)
"""What Python ignores at its start and ``subprocess`` restores for a child
(``restore_signals``): the task starts with the default dispositions."""


def spawn_task(command: list[str], env: dict[str, str] | None) -> int:
    """Starts the task's command (``posix_spawn``: a vfork and an exec) and returns its pid,
    as ``subprocess.Popen(command, env=env)`` did: the program looked up on the ``PATH`` of
    ``env`` (the task's, which a virtual env changes) when its name has no ``/``; a name
    found nowhere raises ``FileNotFoundError``, one found but not runnable
    ``PermissionError``. Without ``subprocess`` this process is smaller to fork."""
    environ = os.environ if env is None else env
    program = command[0]
    if "/" not in program:
        found, denied = None, False
        for directory in os.get_exec_path(environ):
            path = os.path.join(directory, program)
            if os.path.isfile(path):
                if os.access(path, os.X_OK):
                    found = path
                    break
                denied = True
        if found is None:
            if denied:
                raise PermissionError(13, "Permission denied", program)
            raise FileNotFoundError(2, "No such file or directory", program)
        program = found
    return os.posix_spawn(program, command, environ, setsigdef=SIGNALS_DEFAULT)


def _wait_code(pid: int) -> int:
    """The child's end as ``Popen.returncode`` says it: the exit code, or minus the
    signal."""
    while True:
        try:
            _, status = os.waitpid(pid, 0)
        except InterruptedError:  # pragma: no cover - PEP 475 retries already
            continue
        return os.waitstatus_to_exitcode(status)


def _now() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"SIG{signum}"


def _read_json(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _alive(pid: object, start_ticks: object) -> bool:
    """The same live process (not a zombie, not a recycled pid)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read().decode("ascii", "replace")
    except OSError:
        try:
            os.kill(pid, 0)  # no /proc: whether the pid exists at all
        except ProcessLookupError:
            return False
        except OSError:
            return True
        return True
    rest = data[data.rindex(")") + 2 :].split()
    if rest[0] in ("Z", "X", "x"):
        return False
    return start_ticks is None or int(rest[19]) == start_ticks


def worker_gone(info: dict, now: float, stale_s: float = 5.0) -> bool:
    """Whether the worker of a liveness record (workers/liveness.py) is gone: its process
    ended, or it has not rewritten the file for ``stale_s`` (hung, stopped)."""
    alive_at = info.get("alive_at")
    if isinstance(alive_at, (int, float)) and now - alive_at > stale_s:
        return True
    return not _alive(info.get("pid"), info.get("start_ticks"))


def _group_kill(sig: int) -> None:
    """``sig`` to every process of the wrapper's group but the wrapper itself."""
    me, group = os.getpid(), os.getpgrp()
    try:
        names = os.listdir("/proc")
    except OSError:
        names = []
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                data = fh.read().decode("ascii", "replace")
            if int(data[data.rindex(")") + 2 :].split()[2]) == group:
                os.kill(int(name), sig)
        except (OSError, ValueError, IndexError):
            continue


class _ChildExit:
    """The child's end as ``watch_worker`` waits for it (``is_set``, ``wait``): a pidfd the
    wrapper's one thread polls between its looks at the liveness file, where a second
    thread blocked in ``wait()`` cost a thread's start a task (issue 29: most of a trivial
    task's wrapper). Linux 5.3+; ``of`` gives None elsewhere (then the thread, as before)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    @classmethod
    def of(cls, pid: int) -> "_ChildExit | None":
        try:
            return cls(os.pidfd_open(pid))
        except (AttributeError, OSError):
            return None

    def wait(self, timeout: float | None = None) -> bool:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        return bool(ready)

    def is_set(self) -> bool:
        return self.wait(0)

    def close(self) -> None:
        os.close(self.fd)


def watch_worker(
    watch: str,
    done: "threading.Event | _ChildExit",
    stopped: dict[str, str],
    orphan_kill: list[str] | None = None,
) -> None:
    """The orphan watch (see the module's docstring): returns when the task is done, or
    once it was killed. ``stopped["message"]`` says why it was stopped."""
    termed = False
    while not done.is_set():
        info = _read_json(watch)
        delay = 0.5
        if info is not None:
            term_at, kill_at = info.get("term_at"), info.get("kill_at")
            if isinstance(term_at, (int, float)) and isinstance(kill_at, (int, float)):
                delay = min(0.5, max(0.05, (kill_at - term_at) / 2))
                now = time.monotonic()
                if worker_gone(info, now):
                    if now >= kill_at:
                        if orphan_kill:
                            import subprocess  # rare: a container's kill by name

                            try:
                                subprocess.run(
                                    orphan_kill,
                                    stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL,
                                    timeout=10,
                                )
                            except (OSError, subprocess.SubprocessError):
                                pass
                        _group_kill(signal.SIGKILL)
                        return
                    if now >= term_at and not termed:
                        termed = True
                        stopped["message"] = (
                            f"worker-lost: its worker (pid {info.get('pid')}) is gone and its "
                            f"last contact with the control plane was "
                            f"{now - float(info.get('contact_at') or now):.1f}s ago; stopped "
                            f"before the control plane requeues it (heartbeat TTL "
                            f"{info.get('ttl_s')}s)"
                        )
                        sys.stderr.write(
                            f"[klique-worker {_now()}] {stopped['message']}: "
                            f"SIGTERM now, SIGKILL in "
                            f"{max(0.0, kill_at - now):.1f}s\n"
                        )
                        sys.stderr.flush()
                        _group_kill(signal.SIGTERM)
                    delay = max(0.01, min(delay, (kill_at if termed else term_at) - now))
        done.wait(delay)


def run(
    exit_file: str,
    command: list[str],
    env: dict[str, str] | None = None,
    watch: str | None = None,
    orphan_kill: list[str] | None = None,
    marked: "Marker | None" = None,
) -> int:
    """Runs ``command`` (in ``env``, else this process's environment), waits for it, records
    its end in ``exit_file``; returns the wrapper's own exit code. ``watch``: the worker's
    liveness file (stop the task when its worker is gone, see the module's docstring).
    ``marked``: the start marker, written already (``mark_start``); else none is written
    here (the command-line form writes it in ``main``)."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)
    start = marked.start if marked is not None else None
    reserve = marked.path if marked is not None and marked.reserved else None
    try:
        child = spawn_task(command, env)
    except OSError as exc:
        code = 127 if isinstance(exc, FileNotFoundError) else 126
        sys.stderr.write(f"[klique-worker] cannot run {command[0]!r}: {exc.strerror or exc}\n")
        sys.stderr.flush()
        _write_exit_reserved(
            exit_file,
            {
                "exit_code": code,
                "signal": None,
                "pid": None,
                "ended_at": _now(),
                "message": f"cannot run {command[0]!r}",
                "start": start,
            },
            reserve,
            marked,
        )
        return code
    stopped: dict[str, str] = {}
    exited = _ChildExit.of(child) if watch else None
    if watch and exited is not None:  # the watch in this thread, until the child ends
        try:
            watch_worker(watch, exited, stopped, orphan_kill)
        finally:
            exited.close()
        rc = _wait_code(child)
    elif watch:
        import threading  # no pidfd here: the watch on a thread of its own

        done = threading.Event()
        threading.Thread(
            target=watch_worker, args=(watch, done, stopped, orphan_kill), daemon=True
        ).start()
        rc = _wait_code(child)
        done.set()
    else:
        rc = _wait_code(child)
    record: dict[str, object]
    if rc < 0:
        record = {"exit_code": None, "signal": _signal_name(-rc)}
        code = 128 - rc
    else:
        record = {"exit_code": rc, "signal": None}
        code = rc
    record.update(pid=child, ended_at=_now(), start=start)
    if stopped.get("message"):
        record["message"] = stopped["message"]
    _write_exit_reserved(exit_file, record, reserve, marked)
    return code


RESERVE = 8192
"""Bytes set aside at the start beside the exit file (``EXIT_FILE.reserve``): on a full disk
they are given back just before the exit is recorded, so the task's true end is never lost
to ENOSPC (issue 26)."""


class Marker:
    """The start marker this wrapper wrote (``EXIT_FILE.reserve``): its ``start`` line, and
    whether the file also holds the ``RESERVE`` bytes (a full disk may leave the line only)."""

    def __init__(self, path: str, start: dict, reserved: bool) -> None:
        self.path, self.start, self.reserved = path, start, reserved

    def remove(self) -> None:
        try:
            os.unlink(self.path)
        except OSError:
            pass


def mark_start(exit_file: str, mark: object = None) -> Marker | None:
    """Writes the start marker (see the module's docstring): the line first, then the NULs
    that make it ``RESERVE`` bytes. Not fsync'ed: it is read by a worker restarted on this
    machine's running kernel (a crash of the machine ends the wrapper too), and the blocks
    are reserved by the write itself (delayed allocation accounts them then). None when not
    even the line could be written (the disk is full): the task still runs, unmarked."""
    path = exit_file + ".reserve"
    me = os.getpid()
    start = {"pid": me, "start_ticks": _start_ticks(me), "started_at": _now(), "mark": mark}
    line = json.dumps(start).encode() + b"\n"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    try:
        try:
            os.write(fd, line)
        except OSError:
            os.close(fd)
            fd = -1
            os.unlink(path)
            return None
        try:
            os.write(fd, b"\0" * max(0, RESERVE - len(line)))
            reserved = True
        except OSError:
            reserved = False
    finally:
        if fd >= 0:
            os.close(fd)
    return Marker(path, start, reserved)


def _write_exit_reserved(
    exit_file: str, record: dict, reserve: str | None, marked: Marker | None = None
) -> None:
    """Records the exit; if the disk is full, frees the reserve and tries once more. The
    marker goes once the exit is recorded (the exit record repeats its ``start``), unless a
    worker handed a mark: that worker removes it when it forgets the task, off the task's
    path (an unlink waits on the file system's journal, and the worker notices the end only
    once this process has exited)."""
    try:
        _write_exit(exit_file, record)
    except OSError:
        if reserve is None:
            raise
        os.unlink(reserve)
        reserve = None
        _write_exit(exit_file, record)
    finally:
        if marked is not None and marked.start.get("mark") is None:
            marked.remove()


def main(argv: list[str]) -> int:
    if argv == ["--serve"]:
        return serve()
    opts: dict[str, str] = {}
    rest = argv[1:]
    while len(rest) >= 2 and rest[0] in ("--watch", "--orphan-kill", "--mark", "--hold"):
        opts[rest[0]], rest = rest[1], rest[2:]
    if not argv or len(rest) < 2 or rest[0] != "--":
        sys.stderr.write(
            "usage: wrapper.py EXIT_FILE [--watch FILE [--orphan-kill JSON]] [--mark JSON] "
            "[--hold FD] -- COMMAND [ARGS...] | --serve\n"
        )
        return 2
    kill = json.loads(opts["--orphan-kill"]) if "--orphan-kill" in opts else None
    marked = mark_start(argv[0], json.loads(opts["--mark"]) if "--mark" in opts else None)
    if "--hold" in opts:  # the marker is on disk: a restarted worker may read it now
        try:
            os.close(int(opts["--hold"]))
        except (OSError, ValueError):
            pass
    return run(argv[0], rest[1:], watch=opts.get("--watch"), orphan_kill=kill, marked=marked)


# ------------------------------------------------------------------------- the fork server
def _start_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read().decode("ascii", "replace")
        return int(data[data.rindex(")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _close_fds_from(low: int) -> None:
    """Closes every descriptor from ``low`` up in a forked child: those ``/proc/self/fd``
    lists (a handful), not all 65,536 numbers one by one (``os.closerange`` here: about 3 ms
    a task, most of a spawn's cost). Without /proc, the whole range."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except (OSError, ValueError):
        os.closerange(low, 1 << 16)
        return
    for fd in fds:
        if fd >= low:
            try:
                os.close(fd)
            except OSError:  # the listing's own descriptor, closed already
                pass


def _reap(*_: object) -> None:
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _fork(req: dict, mask: set[int | signal.Signals]) -> tuple[int, int]:
    """Forks the wrapper of ``req`` (SIGCHLD blocked by the caller; ``mask``: the signal
    mask to give the child); returns its pid and the read end of a pipe that reaches EOF
    once the child leads its own session. Raises (nothing forked) for a bad request."""
    exit_file, command = str(req["exit_file"]), [str(a) for a in req["command"]]
    mark = req.get("mark")
    watch = str(req["watch"]) if req.get("watch") else None
    orphan_kill = [str(a) for a in req["orphan_kill"]] if req.get("orphan_kill") else None
    env = {str(k): str(v) for k, v in (req.get("env") or {}).items()}
    cwd = req.get("cwd")
    if cwd and not os.path.isdir(cwd):
        raise FileNotFoundError(2, "no such directory", cwd)
    # the task's log is private (0600) whatever the task's umask (kliqued/filemodes.py)
    log_fd = os.open(req["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        null_fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        os.close(log_fd)
        raise
    ready_r, ready_w = -1, -1
    try:
        ready_r, ready_w = os.pipe()  # closed by the child once it leads its own session
        pid = os.fork()
        if pid == 0:  # the wrapper
            code = 126
            try:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                os.setsid()
                os.dup2(null_fd, 0)
                os.dup2(log_fd, 1)
                os.dup2(log_fd, 2)
                # the marker before the answer: a worker killed from here on finds it
                marked = mark_start(exit_file, mark)
                # ready_w (the server may answer now) and the worker's spawn lock too
                _close_fds_from(3)
                if cwd:
                    os.chdir(cwd)
                code = run(exit_file, command, env, watch, orphan_kill, marked)
            except BaseException as exc:  # pragma: no cover - a broken child
                try:
                    os.write(2, f"[klique-worker] the task's wrapper failed: {exc}\n".encode())
                except OSError:
                    pass
            finally:
                try:
                    sys.stderr.flush()
                except Exception:
                    pass
                os._exit(code & 0xFF)
    except BaseException:
        if ready_r >= 0:
            os.close(ready_r)
        raise
    finally:
        if ready_w >= 0:
            os.close(ready_w)
        os.close(log_fd)
        os.close(null_fd)
    return pid, ready_r


def _refusal(exc: BaseException) -> dict:
    if isinstance(exc, OSError):
        return {
            "error": f"{type(exc).__name__}: {exc.strerror or exc}"
            + (f": {exc.filename}" if exc.filename else "")
        }
    return {"error": f"bad request: {exc}"}


def _spawn_many(reqs: list[dict]) -> list[dict]:
    """Forks every request's wrapper first, then waits for each to lead its session: one
    round of the children's start-up for the whole batch rather than one per task (on a
    busy machine each wait is a trip through the scheduler). Answers in request order:
    ``{"pid", "start_ticks"}`` or ``{"error"}``. SIGCHLD stays blocked until every child's
    start time is read: no child can be reaped (and its pid reused) before that."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    forked: list[tuple[int, int] | dict] = []
    try:
        for req in reqs:
            try:
                forked.append(_fork(req, old))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                forked.append(_refusal(exc))
        answers: list[dict] = []
        for i, item in enumerate(forked):
            if isinstance(item, dict):
                answers.append(item)
                continue
            pid, ready_r = item
            forked[i] = {}  # its pipe is closed below, whatever happens
            try:
                os.read(ready_r, 1)  # EOF once the child has its own session
            finally:
                os.close(ready_r)
            answers.append({"pid": pid, "start_ticks": _start_ticks(pid)})
        return answers
    finally:
        for item in forked:
            if isinstance(item, tuple):
                os.close(item[1])
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _spawn(req: dict) -> dict:
    """One wrapper (the command-line form's tests and callers): raises for a bad request."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    try:
        pid, ready_r = _fork(req, old)
        try:
            os.read(ready_r, 1)
        finally:
            os.close(ready_r)
        return {"pid": pid, "start_ticks": _start_ticks(pid)}
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def serve() -> int:
    signal.signal(signal.SIGCHLD, _reap)
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    while True:
        line = inp.readline()
        if not line:
            return 0  # the worker is gone; the wrappers live on
        answer: dict | list[dict]
        try:
            req = json.loads(line)
            if isinstance(req, list):  # a batch: a list of answers, in order
                answer = _spawn_many([r if isinstance(r, dict) else {} for r in req])
            else:
                answer = _spawn(req)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            answer = _refusal(exc)
        _reap()
        out.write(json.dumps(answer).encode() + b"\n")
        out.flush()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
