"""Helpers of the worker and GitOps tests: a real ``kliqued serve`` with short worker TTLs, a
small estate with one bare-metal pool of 2 GPUs shared by two teams, a plain-HTTP worker
(the protocol driven by hand: a real client, no mocks) and real ``klique-worker`` processes.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from tests.harness.daemon import ROOT, Server
from tests.harness.procs import pid_alive  # noqa: F401  (used here and by tests)
from tests.harness.wait import wait_for  # noqa: F401  (the old import path of tests)

PY = sys.executable

ESTATE = {
    "settings.yaml": """\
version: 1
settings:
  pass_interval: 1s
  low_watermark: 15m
  currency: EUR
""",
    "pools.yaml": """\
pools:
  - name: bare
    kind: baremetal
    capacity: 2
    gpu_type: l40s-48gb
  - name: other
    kind: baremetal
    capacity: 2
    gpu_type: l40s-48gb
""",
    "groups.yaml": """\
groups:
  - name: lab
    admins: [walter]
  - name: team-a
    parent: lab
    users: [alice]
    admins: [alice]
  - name: team-b
    parent: lab
    users: [erin, bob]
    admins: [erin]
""",
    "policies.yaml": """\
policies:
  - name: team-a
    group: team-a
    reservation: 2
    limit: 2
  - name: team-b
    group: team-b
    reservation: 0
    limit: 2
""",
    "profiles.yaml": """\
profiles:
  - name: one
    gpus: 1
    pools: [bare]
    policies: [team-a, team-b]
  - name: elsewhere
    gpus: 1
    pools: [other]
    policies: [team-a]
""",
    "pricing.yaml": """\
pricing:
  - gpu_type: l40s-48gb
    per_gpu_hour: 1.0
    effective_from: "2026-01-01T00:00:00Z"
""",
}


def now_rfc3339() -> str:
    """The time as a worker's report gives it."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def write_estate(where: Path, files: dict[str, str] | None = None) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    for name, text in (files or ESTATE).items():
        (where / name).write_text(text)
    return where


class FleetServer(Server):
    """``kliqued serve`` with worker flags (a short TTL), or following a git repository."""

    def __init__(
        self,
        tmp: Path,
        estate: Path | None = None,
        extra: list[str] | None = None,
        ttl: str = "1.5s",
        **kw: Any,
    ) -> None:
        if estate is None and not any(a == "--git" for a in extra or []):
            estate = write_estate(Path(tmp) / "estate")
        kw.setdefault("workers", True)  # pools need a live worker, as in production
        super().__init__(tmp, estate=estate, **kw)
        self.extra = [
            "--worker-ttl",
            ttl,
            "--poll-wait",
            "2s",
            "--stop-grace",
            "2s",
            *(extra or []),
        ]  # Server.argv appends them

    def events(self, task: str | None = None, kind: str | None = None) -> list[dict]:
        q = "&".join(f"{k}={v}" for k, v in (("task", task), ("kind", kind)) if v)
        return self.ok("GET", f"/v1/events?limit=1000&{q}")["events"]

    def task(self, tid: str) -> dict:
        return self.ok("GET", f"/v1/tasks/{tid}")

    def submit(self, token: str, resource: str, command: list[str], **kw: Any) -> str:
        return self.ok(
            "POST", "/v1/tasks", {"resource": resource, "command": command, **kw}, token, expect=201
        )["id"]

    def sql(self, sql: str) -> list[list]:
        return self.ok("POST", "/v1/ledger/sql", {"sql": sql})["rows"]


class HttpWorker:
    """The worker protocol spoken by hand, over real HTTP."""

    def __init__(
        self,
        server: Server,
        token: str,
        wid: str,
        pool: str = "bare",
        gpus: int = 2,
        key: str | None = None,
    ) -> None:
        self.s, self.token, self.id, self.pool, self.gpus = server, token, wid, pool, gpus
        self.at: str | None = None
        """The end time its reports give (a worker's clock); None: the time of sending."""
        self.key = key or secrets.token_urlsafe(32)
        """Its worker key (X-Klique-Worker-Key): what tells it from the pool's other
        workers, which share the token."""

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        raw: bytes | None = None,
        timeout: float = 30,
    ) -> tuple[int, Any]:
        return self.s.call(
            method,
            path,
            body,
            self.token,
            raw=raw,
            timeout=timeout,
            headers={"X-Klique-Worker-Key": self.key},
        )

    def register(self) -> dict:
        st, body = self.call(
            "POST",
            "/v1/workers/register",
            {
                "worker_id": self.id,
                "hostname": "test",
                "pool": self.pool,
                "executor": "process",
                "version": "test",
                "gpus": [
                    {"index": i, "uuid": f"declared-{i}", "memory_mb": None}
                    for i in range(self.gpus)
                ],
            },
        )
        assert st == 200, body
        return body

    def lease(self, free: list[int] | None = None, wait: float = 0) -> list[dict]:
        st, body = self.call(
            "POST",
            f"/v1/workers/{self.id}/lease?wait={wait}",
            {"free_gpus": list(range(self.gpus)) if free is None else free},
        )
        assert st == 200, body
        return body["leases"]

    def heartbeat(self, running: list[tuple[str, int]]) -> dict:
        st, body = self.call(
            "POST",
            f"/v1/workers/{self.id}/heartbeat",
            {"running": [{"task": t, "epoch": e, "state": "running"} for t, e in running]},
        )
        assert st == 200, body
        return body

    def report(
        self,
        task: str,
        epoch: int,
        event: str,
        exit_code: int | None = None,
        signal_name: str | None = None,
        message: str | None = None,
    ) -> tuple[int, Any]:
        return self.call(
            "POST",
            f"/v1/tasks/{task}/report",
            {
                "epoch": epoch,
                "event": event,
                "exit_code": exit_code,
                "signal": signal_name,
                "at": self.at or now_rfc3339(),
                "message": message,
            },
        )


class RealWorker:
    """A ``klique-worker`` process (the other engineer's, workers/) against the daemon."""

    def __init__(
        self,
        server: Server,
        token: str,
        state_dir: Path,
        pool: str = "bare",
        gpus: str = "0,1",
        grace: str = "2s",
        extra: list[str] | None = None,
    ) -> None:
        self.s, self.state_dir, self.pool, self.gpus, self.grace = (
            server,
            state_dir,
            pool,
            gpus,
            grace,
        )
        self.extra = list(extra or [])
        """More klique-worker arguments (``--executor slurm --slurm-conf F``)."""
        self.env: dict[str, str] = {}
        """More environment for the next ``start`` (a test hook of the worker)."""
        state_dir.mkdir(parents=True, exist_ok=True)
        self.token_file = state_dir.parent / f"{state_dir.name}.token"
        self.token_file.write_text(token + "\n")
        os.chmod(self.token_file, 0o600)
        self.proc: subprocess.Popen | None = None
        self.runs = 0
        self.logs: list[Path] = []

    def start(self) -> "RealWorker":
        self.runs += 1
        path = self.state_dir.parent / f"{self.state_dir.name}-{self.runs}.stderr"
        self.logs.append(path)
        fh = open(path, "w")
        self.proc = subprocess.Popen(
            [
                PY,
                "-m",
                "workers.cli",
                "--url",
                self.s.url,
                "--pool",
                self.pool,
                "--token-file",
                str(self.token_file),
                "--state-dir",
                str(self.state_dir),
                "--gpus",
                self.gpus,
                "--grace",
                self.grace,
                "--retry-max",
                "0.5s",
                "--log-interval",
                "0.2s",
                "--log-level",
                "debug",
                *self.extra,
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=fh,
            env={**os.environ, **self.env} if self.env else None,
        )
        fh.close()
        return self

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill9(self) -> None:
        self.signal(signal.SIGKILL)
        self.proc.wait(5)  # type: ignore[union-attr]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def stderr(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in self.logs if p.exists())

    def worker_id(self) -> str:
        return (self.state_dir / "worker-id").read_text().strip()


def running_fleet(
    tmp_path: Path, users: tuple[str, ...] = ("erin",), **kw: Any
) -> Iterator[FleetServer]:
    """The body of the tests' ``fs`` fixtures: a started FleetServer with a token per user in
    ``users`` (as attributes) and ``wt``, a worker token of pool ``bare``; on teardown it
    stops cleanly and its log has no traceback."""
    s = FleetServer(tmp_path, **kw).start()
    for user in users:
        setattr(s, user, s.token({"user": user}))
    s.wt = s.token({"worker": True, "pool": "bare"})  # type: ignore[attr-defined]
    yield s
    log = s.log()
    assert s.stop() == 0, log
    assert "Traceback" not in log, log


def real_workers(fs: FleetServer, tmp_path: Path) -> Iterator[Any]:
    """The body of the tests' ``real`` fixtures: ``make(name, gpus)`` starts a real
    klique-worker on pool ``bare``; on teardown every one stops, stray task pids are killed
    and no worker's stderr has a traceback."""
    started: list[RealWorker] = []

    def make(name: str = "w1", gpus: str = "0,1") -> RealWorker:
        w = RealWorker(fs, fs.wt, tmp_path / name, gpus=gpus).start()  # type: ignore[attr-defined]
        started.append(w)
        return w

    yield make
    for w in started:
        w.stop()
    kill_pids_in(list(tmp_path.glob("*.pid")))
    for w in started:
        assert "Traceback" not in w.stderr(), w.stderr()


def trap(tmp: Path, name: str, seconds: float = 60) -> list[str]:
    """A task that writes its pid, then on SIGTERM writes TERM to its marker and exits 0 (a
    training job that checkpoints)."""
    pid, mark = tmp / f"{name}.pid", tmp / f"{name}.term"
    return [
        PY,
        "-c",
        "import os, signal, sys, time\n"
        f"open({str(pid)!r}, 'w').write(str(os.getpid()))\n"
        "def term(*_):\n"
        f"    open({str(mark)!r}, 'w').write('TERM')\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, term)\n"
        "print('started', flush=True)\n"
        f"time.sleep({seconds})\n"
        "print('done', flush=True)\n",
    ]


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def kill_pids_in(files: list[Path]) -> None:
    """Cleans up task processes a test left (workers leave their tasks running by design)."""
    for f in files:
        try:
            pid = int(f.read_text().split()[0])
            os.killpg(pid, signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            try:
                os.kill(pid, signal.SIGKILL)  # type: ignore[possibly-undefined]
            except Exception:
                pass
