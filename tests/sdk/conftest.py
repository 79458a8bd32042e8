"""A real `kliqued serve` for the SDK and CLI tests: a subprocess on a free loopback port with
a temporary database and the repo's estate/, the admin token from KLIQUE_ADMIN_TOKEN, user and
finance tokens created through POST /v1/tokens. One server for the whole session (2 cores)."""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kliqued.cli import main

from tests.conftest import ESTATE, REPO


def serve_missing() -> str | None:
    """Why the daemon cannot run here, or None."""
    if importlib.util.find_spec("kliqued.commands.serve") is None:
        return "`kliqued serve` is missing (kliqued/commands/serve.py is not built yet)"
    p = subprocess.run([sys.executable, "-m", "kliqued.cli", "serve", "--help"],
                       capture_output=True, text=True, cwd=REPO)
    if p.returncode != 0:
        return f"`kliqued serve --help` fails: {p.stderr.strip()[-300:]}"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    url: str
    admin: str
    proc: subprocess.Popen
    log: Path
    tokens: dict[str, str] = field(default_factory=dict)

    def token(self, who: str) -> str:
        """A token for `alice` (a user) or `role:finance`, created once through the API."""
        if who not in self.tokens:
            body = {"role": who[5:]} if who.startswith("role:") else {"user": who}
            req = urllib.request.Request(
                f"{self.url}/v1/tokens", data=json.dumps(body).encode(), method="POST",
                headers={"Authorization": f"Bearer {self.admin}",
                         "Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=10) as resp:
                self.tokens[who] = json.loads(resp.read())["token"]
        return self.tokens[who]


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> Server:
    why = serve_missing()
    if why:
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("kliqued")
    port = free_port()
    admin = "kq_" + secrets.token_urlsafe(32)[:43]
    log = tmp / "serve.log"
    env = {**os.environ, "KLIQUE_ADMIN_TOKEN": admin}
    for name in ("KLIQUE_URL", "KLIQUE_TOKEN", "KLIQUE_CONFIG"):
        env.pop(name, None)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kliqued.cli", "serve", "--estate", str(ESTATE),
             "--db", str(tmp / "kliqued.duckdb"), "--listen", f"127.0.0.1:{port}"],
            stdout=out, stderr=subprocess.STDOUT, cwd=tmp, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"{url}/v1/health", timeout=1) as resp:
                if resp.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"kliqued serve did not start:\n{log.read_text()[-2000:]}")
        time.sleep(0.1)
    srv = Server(url, admin, proc, log)
    yield srv
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture
def no_klique_env(monkeypatch, tmp_path):
    """No KLIQUE_* variables and no config file, whatever the developer's shell has."""
    for name in ("KLIQUE_URL", "KLIQUE_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KLIQUE_CONFIG", str(tmp_path / "absent.yaml"))


@pytest.fixture
def run(capsys):
    """`kliqued ARGV...` in-process: (exit code, stdout, stderr)."""
    def call(argv):
        capsys.readouterr()
        rc = main(list(argv))
        out, err = capsys.readouterr()
        return rc, out, err
    return call


@pytest.fixture
def as_user(server, monkeypatch, no_klique_env, run):
    """Runs `kliqued ...` in-process as a principal (KLIQUE_URL and KLIQUE_TOKEN set)."""
    monkeypatch.setenv("KLIQUE_URL", server.url)

    def call(who: str, *argv: str):
        monkeypatch.setenv("KLIQUE_TOKEN", server.token(who))
        return run(argv)
    return call
