"""Fixtures of the worker tests: the protocol's reference peer and real worker processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.workers.protocol_peer import ProtocolPeer
from tests.harness.procs import pid_alive  # noqa: F401  (used here and by tests)
from tests.harness.wait import wait_for as wait_until  # noqa: F401  (the old name)
from tests.harness.typed import present

REPO = Path(__file__).resolve().parents[2]


class WorkerProcess:
    """A real `klique-worker` process against the peer; its stderr goes to a file that a
    failing test prints."""

    def __init__(
        self, peer: ProtocolPeer, state_dir: Path, gpus: str = "0,1", extra: list[str] | None = None
    ):
        self.peer, self.state_dir, self.gpus, self.extra = peer, state_dir, gpus, extra or []
        self.token_file = state_dir.parent / "worker.token"
        self.token_file.write_text(peer.token + "\n")
        self.proc: subprocess.Popen | None = None
        self.runs = 0

    @property
    def log_file(self) -> Path:
        return self.state_dir.parent / f"worker-{self.runs}.stderr"

    def start(self) -> "WorkerProcess":
        self.runs += 1
        self._stderr = open(self.log_file, "w")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "workers.cli",
                "--url",
                self.peer.url,
                "--pool",
                self.peer.pool,
                "--token-file",
                str(self.token_file),
                "--state-dir",
                str(self.state_dir),
                "--gpus",
                self.gpus,
                "--grace",
                "1s",
                "--retry-max",
                "0.5s",
                "--log-interval",
                "0.2s",
                "--log-level",
                "debug",
                *self.extra,
            ],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
        )
        return self

    def kill9(self) -> None:
        present(self.proc).send_signal(signal.SIGKILL)
        present(self.proc).wait(5)
        self._stderr.close()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._stderr.close()

    def stderr(self) -> str:
        return "\n".join(
            p.read_text(errors="replace")
            for p in sorted(self.state_dir.parent.glob("worker-*.stderr"))
        )


@pytest.fixture
def peer():
    p = ProtocolPeer()
    yield p
    p.close()


@pytest.fixture
def worker(peer, tmp_path, request):
    started: list[WorkerProcess] = []

    def make(gpus: str = "0,1", extra: list[str] | None = None) -> WorkerProcess:
        w = WorkerProcess(peer, tmp_path / "state", gpus, extra)
        started.append(w)
        return w.start()

    yield make
    for w in started:
        w.stop()
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        for w in started:
            sys.stderr.write(w.stderr())
    # a stopped worker leaves its tasks running (by design): none may outlive its test
    for path in (tmp_path / "state" / "tasks").glob("*.json"):
        handle = json.loads(path.read_text()).get("handle") or {}
        if handle.get("pgid"):
            try:
                os.killpg(handle["pgid"], signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


def kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
