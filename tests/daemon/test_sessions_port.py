"""The sessions' listener when its default port (the API's + 1) is taken: a CI run met it
(an ephemeral port held by another process's connection) and the daemon exited. Any free
port is an origin of its own, so the daemon serves sessions there and says so; a port
asked for with ``--sessions-listen`` stays fatal."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from tests.harness.daemon import ROOT, SMALL_ESTATE, free_port
from tests.harness.wait import wait_for


def _neighbours() -> tuple[int, socket.socket]:
    """A free port P whose P + 1 is held (listening) by the returned socket."""
    for _ in range(50):
        held = socket.socket()
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1] - 1
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                held.close()
                continue
        return port, held
    raise AssertionError("no free port below a held one in 50 tries")


def _serve(tmp: Path, port: int, *extra: str) -> tuple[subprocess.Popen, Path]:
    out = tmp / "serve.log"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kliqued.cli",
            "serve",
            "--db",
            str(tmp / "k.duckdb"),
            "--listen",
            f"127.0.0.1:{port}",
            "--estate",
            str(SMALL_ESTATE),
            *extra,
        ],
        cwd=ROOT,
        env={**os.environ, "KLIQUE_ADMIN_TOKEN": "kq_" + os.urandom(24).hex()},
        stdout=open(out, "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return proc, out


def test_a_taken_default_sessions_port_falls_back_to_a_free_one(tmp_path: Path) -> None:
    port, held = _neighbours()
    proc, out = _serve(tmp_path, port)
    try:
        wait_for(
            lambda: proc.poll() is None and "serving on" in out.read_text(),
            60,
            "kliqued serve",
        )
        log = out.read_text()
        assert f"the sessions' default port 127.0.0.1:{port + 1} is in use" in log, log
        served = next(x for x in log.splitlines() if "sessions served at" in x)
        assert f":{port + 1}/" not in served and "http://127.0.0.1:" in served, served
    finally:
        held.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(30) == 0, out.read_text()


def test_a_taken_sessions_port_asked_for_is_fatal_and_said(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        proc, out = _serve(tmp_path, free_port(), "--sessions-listen", f"127.0.0.1:{taken}")
        try:
            assert proc.wait(60) == 1
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
    log = out.read_text()
    assert f"cannot listen for sessions on 127.0.0.1:{taken}" in log, log
    assert "--sessions-listen HOST:PORT" in log and "Traceback" not in log
