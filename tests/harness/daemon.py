"""The tests' one way to run the daemon: a real ``kliqued serve`` in a subprocess, on a free
loopback port, with its own database, and a tiny HTTP client.

No mocks: the tests talk HTTP to the same program an operator runs. The API tests use the
small estate of tests/daemon/estate; the SDK and CLI tests the repo's example estate/; the
worker and GitOps tests extend :class:`Server` (tests/daemon/fleet.py).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Self

from tests.harness.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]
SMALL_ESTATE = ROOT / "tests" / "daemon" / "estate"
EXAMPLE_ESTATE = ROOT / "estate"
ADMIN = "kq_test-admin-6qG2VhZbR1xN8tLw4PmJ0sYkE7cUaDf3oH9iT5nQ"
"""A fixed admin token for the tests: strong enough for the daemon's check of a chosen
KLIQUE_ADMIN_TOKEN (kliqued/daemon/strength.py)."""

CLIENT_ENV = ("KLIQUE_ADMIN_TOKEN", "KLIQUE_URL", "KLIQUE_TOKEN", "KLIQUE_CONFIG")
"""The developer's shell variables the daemon must not see: the test decides them."""


def free_port() -> int:
    """A loopback port free right now (the kernel's choice, so parallel tests do not clash)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    started: list["Server"] = []
    """Every server a test started: the root conftest kills what is left at session end."""
    alice: str
    bob: str
    erin: str
    walter: str
    worker: str
    wt: str
    """Tokens a fixture keeps on its server (``s.alice = s.token({"user": "alice"})``, ``wt``
    a worker's): declared so that the tests reading them are type-checked, set by fixtures."""

    def __init__(
        self,
        tmp: Path,
        estate: Path | None = SMALL_ESTATE,
        db: Path | str | None = None,
        admin: str | None = ADMIN,
        workers: bool = False,
        extra: list[str] | None = None,
    ) -> None:
        """``db``: the DuckDB file (default: one in ``tmp``), or a ``postgresql://`` URL (the
        ``pg_url`` fixture), the ledger's DuckDB file then in ``tmp``. ``workers``: pools
        take work only while they have a live worker, as in production; without it (the API
        tests, which run no worker) every pool takes work (``--place-without-workers``)."""
        self.tmp = Path(tmp)
        self.workers = workers
        self.extra = list(extra or [])
        """More ``kliqued serve`` arguments (``--lease-ttl 2s``, ``--ledger-replica URL``)."""
        self.estate = estate
        self.db = db or self.tmp / "kliqued.duckdb"
        self.admin = admin
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.sessions_port = free_port()
        """The sessions' listener (kliqued serve's default, the API's port + 1, may be taken
        by another test's daemon or worker); kept across restarts, as a session's URL is."""
        self._retry = 2
        """First starts left to retry on a port taken between free_port() and the bind."""
        self.proc: subprocess.Popen | None = None
        self.log_path = self.tmp / f"serve-{self.port}.log"
        self.starts = 0
        self.tokens: dict[str, str] = {}
        """Tokens made by :meth:`token` for a name (``alice``, ``role:finance``)."""

    # ------------------------------------------------------------------ process
    def argv(self) -> list[str]:
        args = [
            sys.executable,
            "-m",
            "kliqued.cli",
            "serve",
            "--db",
            str(self.db),
            "--listen",
            f"127.0.0.1:{self.port}",
        ]
        if self.on_postgres:
            args += ["--ledger-db", str(self.local_db)]
        if self.estate is not None:
            args += ["--estate", str(self.estate)]
        if not self.workers:
            args.append("--place-without-workers")
        if "--sessions-listen" not in self.extra:
            args += ["--sessions-listen", f"127.0.0.1:{self.sessions_port}"]
        return args + self.extra

    @property
    def on_postgres(self) -> bool:
        return str(self.db).startswith("postgresql://")

    @property
    def local_db(self) -> Path:
        """The DuckDB file: ``db`` itself, or the ledger's file beside a PostgreSQL log."""
        return self.tmp / "kliqued-ledger.duckdb" if self.on_postgres else Path(self.db)

    def start(self, wait: bool | str = True, timeout: float = 30) -> Self:
        """``wait``: until ready (True: leading; ``"standby"``: standing by)."""
        env = {k: v for k, v in os.environ.items() if k not in CLIENT_ENV}
        if self.admin:
            env["KLIQUE_ADMIN_TOKEN"] = self.admin
        self.starts += 1
        with open(self.log_path, "a") as log:
            log.write(f"--- start {self.starts}\n")
            log.flush()
            self.proc = subprocess.Popen(self.argv(), cwd=ROOT, env=env, stdout=log, stderr=log)
        Server.started.append(self)
        if wait:
            try:
                self.wait_ready(timeout, wait if isinstance(wait, str) else "ok")
            except RuntimeError as exc:
                self._end()
                # free_port() can only say a port was free when asked: another process may
                # take it before serve binds it. On a first start, ports the harness chose
                # are chosen again (a restart keeps its ports: tests hold the URL).
                if self.starts == 1 and "address already in use" in str(exc) and self._retry:
                    self._retry -= 1
                    self.port, self.sessions_port = free_port(), free_port()
                    self.url = f"http://127.0.0.1:{self.port}"
                    self.starts = 0
                    return self.start(wait, timeout)
                raise
            except BaseException:
                self._end()  # a daemon that never became ready must not outlive its test
                raise
        return self

    def wait_ready(self, timeout: float = 30, status: str = "ok") -> None:
        """Until ``/v1/health`` answers ``status`` (``ok``: leading; ``standby``); fails at
        once, with the log, if serve exits."""

        def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"kliqued serve exited {self.proc.returncode}:\n{self.log()}")
            try:
                code, body = self.call("GET", "/v1/health", token=None, timeout=1)
            except OSError:
                return False
            return code == 200 and body.get("status") == status

        try:
            wait_for(ready, timeout, "kliqued serve to answer")
        except AssertionError as exc:
            raise RuntimeError(f"{exc}:\n{self.log()}") from None

    def stop(self, timeout: float = 20) -> int:
        """SIGTERM, and its exit code. A daemon still running after ``timeout`` is killed
        (SIGKILL) before the timeout is raised: a failed stop fails its test, and leaves no
        process behind."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._end()
            raise

    def _end(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def log(self) -> str:
        try:
            return self.log_path.read_text()
        except OSError:
            return ""

    # ------------------------------------------------------------------ HTTP
    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        token: str | None = "admin",
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
        timeout: float = 30,
    ) -> tuple[int, Any]:
        """(status, parsed JSON or text). ``token="admin"`` means the admin token."""
        if token == "admin":
            token = self.admin
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, _parse(resp.read(), resp.headers.get("Content-Type"))
        except urllib.error.HTTPError as exc:
            return exc.code, _parse(exc.read(), exc.headers.get("Content-Type"))

    def ok(
        self,
        method: str,
        path: str,
        body: Any = None,
        token: str | None = "admin",
        expect: int | tuple[int, ...] = (200, 201, 204),
        **kw: Any,
    ) -> Any:
        status, data = self.call(method, path, body, token, **kw)
        want = (expect,) if isinstance(expect, int) else expect
        assert status in want, f"{method} {path}: {status} {data}"
        return data

    def token(self, who: str | dict[str, Any]) -> str:
        """A new token for a ``POST /v1/tokens`` body (``{"user": "bob"}``), or the one token
        of a name, made once: ``alice`` (a user) or ``role:finance``."""
        if isinstance(who, dict):
            return self.ok("POST", "/v1/tokens", who, expect=201)["token"]
        if who not in self.tokens:
            body = {"role": who[5:]} if who.startswith("role:") else {"user": who}
            self.tokens[who] = self.token(body)
        return self.tokens[who]


def _parse(raw: bytes, ctype: str | None) -> Any:
    if not raw:
        return None
    if ctype and "json" in ctype:
        return json.loads(raw)
    return raw.decode("utf-8", "replace")


def kill_leftovers() -> None:
    """Kills every server a test started and left running (called at session end)."""
    for s in Server.started:
        if s.proc is not None and s.proc.poll() is None:
            s.kill()
