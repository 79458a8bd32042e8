"""The daemon in the test's own process: the tests' second way to run ``kliqued serve``, for
the tests that put no process boundary under test (API semantics, access rules, validation,
views, the SDK and CLI against the API).

Why: a subprocess costs an interpreter, the imports and a replay before its first answer,
seconds on 2 cores, paid by every test that starts its own daemon. Here the same program
runs on a thread: ``kliqued.daemon.server.serve`` itself (the composition root: the real
``Store`` on a DuckDB file in the test's directory, the replay, the estate, the sequencer,
``make_app`` with the dashboard installed as ``kliqued serve``'s command installs it, the
sessions' listener), given through ``server.Embedded`` what a process would own. The tests
still talk HTTP to it on a loopback port (``call``, ``ok``, ``token`` are
:class:`~tests.harness.daemon.Server`'s), so a test body does not change when its fixture
does.

What it cannot be: a process. A test about kill -9, signals, a restart that replays another
process's file, HA, real workers, browsers, or the daemon's own stderr keeps the subprocess
(CONTRIBUTING.md, "Which daemon"). Its clock is the test's: :meth:`InProcServer.step` moves
the daemon's time (wall and monotonic together, so it is time passing, not a clock step)
instead of sleeping through a TTL.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Self

from kliqued.daemon import clock as daemon_clock
from kliqued.daemon.logsetup import RedactFilter
from kliqued.daemon.server import Embedded, Options, Serving, serve
from kliqued.cli import build_parser
from kliqued.commands import serve as serve_command
from tests.harness.daemon import ADMIN, SMALL_ESTATE, Server

STOP_TIMEOUT_S = 20.0


class SteppedClock:
    """The daemon's wall and monotonic clocks, both ahead of the system's by what the test
    stepped: a step is elapsed time to the daemon (its ``Clock`` sees no wall-clock step;
    TTLs, budgets and cron move on). Kept across a restart of the same server, as the
    system's clock is."""

    def __init__(self) -> None:
        self.offset_ns = 0

    def step(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time passes forwards: step a positive number of seconds")
        self.offset_ns += int(seconds * 1_000_000_000)

    def wall_ms(self) -> int:
        return daemon_clock.wall_ms() + self.offset_ns // 1_000_000

    def mono_ns(self) -> int:
        return daemon_clock.mono_ns() + self.offset_ns

    def mono_s(self) -> float:
        return time.monotonic() + self.offset_ns / 1e9

    def make(self) -> daemon_clock.Clock:
        return daemon_clock.Clock(wall=self.wall_ms, mono=self.mono_ns)


class _ThreadLog(logging.Handler):
    """The daemon's log lines, written to the server's log file as ``kliqued serve`` writes
    them to its stderr: only the records of the daemon's threads (several daemons, and the
    test itself, log in one process), redacted as the daemon's own handler redacts them."""

    def __init__(self, path: Path, prefix: str) -> None:
        super().__init__(logging.INFO)
        self.prefix = prefix
        self.stream = open(path, "a", encoding="utf-8")
        self.setFormatter(logging.Formatter("%(asctime)s kliqued %(levelname)s %(message)s"))
        self.addFilter(RedactFilter())

    def emit(self, record: logging.LogRecord) -> None:
        if not record.threadName or not record.threadName.startswith(self.prefix):
            return
        try:
            self.stream.write(self.format(record) + "\n")
            self.stream.flush()
        except Exception:
            self.handleError(record)

    def close(self) -> None:
        try:
            self.stream.close()
        finally:
            super().close()


class _ServeThread:
    """``proc`` for the helpers that ask whether the daemon still runs (``proc.poll()``):
    None while ``serve`` runs on its thread, then its exit code (1 if it raised)."""

    def __init__(self, server: "InProcServer") -> None:
        self.server = server

    @property
    def returncode(self) -> int | None:
        return self.poll()

    def poll(self) -> int | None:
        thread = self.server.thread
        if thread is not None and thread.is_alive():
            return None
        code = self.server.exit_code
        return 1 if code is None else code


class InProcServer(Server):
    """:class:`Server`'s interface (``url``, ``call``, ``ok``, ``token``, ``admin``,
    ``start``, ``stop``, ``log``) on a daemon served by a thread of the test process.
    DuckDB only; ``kill`` (no process to kill) refuses, naming the harness to use."""

    running: list["InProcServer"] = []
    """Servers started and not stopped: the root conftest stops them at session end and
    fails the run, as it does for a leftover process."""

    def __init__(
        self,
        tmp: Path,
        estate: Path | None = SMALL_ESTATE,
        db: Path | str | None = None,
        admin: str | None = ADMIN,
        workers: bool = False,
        extra: list[str] | None = None,
    ) -> None:
        if db is not None and str(db).startswith(("postgresql://", "postgres://")):
            raise ValueError("the in-process harness runs on DuckDB: use Server for PostgreSQL")
        super().__init__(tmp, estate, db, admin, workers, extra)
        self.clock = SteppedClock()
        self.thread: threading.Thread | None = None
        self.serving: Serving | None = None
        self.exit_code: int | None = None
        self.failure: BaseException | None = None
        self._handler: _ThreadLog | None = None

    def options(self) -> Options:
        """What ``kliqued serve`` runs for :meth:`Server.argv` (the same flags, ``extra``
        too), read by its own parser and turned into options by its own command's code,
        the dashboard installed as that command installs it."""
        argv = Server.argv(self)
        args = build_parser("serve").parse_args(argv[argv.index("serve") :])
        return serve_command.options(args)

    def start(self, wait: bool | str = True, timeout: float = 30) -> Self:
        if self.thread is not None and self.thread.is_alive():
            raise RuntimeError("this in-process daemon is already running")
        self.starts += 1
        name = f"inproc-kliqued-{self.port}"
        ready = threading.Event()
        self.serving, self.exit_code, self.failure = None, None, None

        def serving(handle: Serving) -> None:
            self.serving = handle
            ready.set()

        embedded = Embedded(
            admin_token=self.admin,
            clock=self.clock.make,
            mono=self.clock.mono_s,
            serving=serving,
        )

        def run() -> None:
            try:
                self.exit_code = serve(self.options(), embedded)
            except BaseException as exc:  # reported by start or stop, in the test's thread
                self.failure = exc
            finally:
                ready.set()

        with open(self.log_path, "a") as log:
            log.write(f"--- start {self.starts} (in process)\n")
        self._handler = _ThreadLog(self.log_path, name)
        logging.getLogger().addHandler(self._handler)
        ours = logging.getLogger("kliqued")
        if ours.getEffectiveLevel() > logging.INFO:
            ours.setLevel(logging.INFO)  # as logsetup.setup() sets it in kliqued serve
        self.thread = threading.Thread(target=run, name=name, daemon=True)
        self.proc = _ServeThread(self)  # type: ignore[assignment]  # poll() and returncode only
        self.thread.start()
        InProcServer.running.append(self)
        if not ready.wait(timeout) or self.serving is None:
            self._ended()
            raise RuntimeError(
                f"the in-process daemon did not start (exit {self.exit_code}, "
                f"{self.failure!r}):\n{self.log()}"
            ) from self.failure
        if wait:
            self.wait_ready(timeout, wait if isinstance(wait, str) else "ok")
        return self

    def step(self, seconds: float) -> None:
        """Time passes for the daemon: ``seconds`` more on its wall and monotonic clocks
        (a token's TTL, a worker's, a budget's charge) without the test sleeping."""
        self.clock.step(seconds)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """As SIGTERM does for ``kliqued serve``: stop, finish requests in flight, close the
        store; the exit code. Nothing of the daemon is left: its thread has ended (the
        event loop, its tasks and executor with it) and its log file is closed."""
        assert self.thread is not None, "never started"
        if self.serving is not None and self.thread.is_alive():
            self.serving.request_stop()
        self.thread.join(timeout)
        alive = self.thread.is_alive()
        self._ended()
        if alive:
            raise TimeoutError(f"the in-process daemon did not stop in {timeout} s:\n{self.log()}")
        if self.failure is not None:
            raise RuntimeError(f"the in-process daemon failed:\n{self.log()}") from self.failure
        assert self.exit_code is not None
        return self.exit_code

    def _ended(self) -> None:
        if self._handler is not None:
            logging.getLogger().removeHandler(self._handler)
            self._handler.close()
            self._handler = None
        if self in InProcServer.running and not (self.thread and self.thread.is_alive()):
            InProcServer.running.remove(self)

    def kill(self) -> None:
        raise NotImplementedError("kill -9 needs a process: use tests.harness.daemon.Server")

    def wait_ready(self, timeout: float = 30, status: str = "ok") -> None:
        if self.thread is not None and not self.thread.is_alive():
            raise RuntimeError(f"the in-process daemon ended ({self.exit_code}):\n{self.log()}")
        super().wait_ready(timeout, status)


def stop_leftovers() -> list[str]:
    """Stops every in-process daemon a test left running (session end); their URLs."""
    left = [s.url for s in InProcServer.running]
    for s in list(InProcServer.running):
        try:
            s.stop(5)
        except Exception:
            pass
    InProcServer.running.clear()
    return left
