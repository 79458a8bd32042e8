"""Finding 4 of issue 9: idle, half-open and slow connections are closed after a timeout, the
number of connections is capped below the file-handle limit, and a flood of them is logged
once, not once per connection. Long polls stay open as long as they legitimately wait.

A real ``kliqued serve`` with short timeouts; raw sockets play the attacker.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.daemon.fleet import FleetServer, HttpWorker
from tests.harness.typed import present

SHORT = [
    "--header-timeout",
    "2s",
    "--idle-timeout",
    "5s",
    "--body-timeout",
    "2s",
    "--poll-wait",
    "5s",
]


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    return s


def _closed_by_peer(s: socket.socket, within: float) -> bool:
    """True when the daemon closes ``s`` (EOF or reset) within ``within`` seconds; a response
    before the close (a 408) counts as closed too."""
    s.settimeout(within)
    try:
        while True:
            data = s.recv(65536)
            if not data:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def _health_time(server: FleetServer) -> float:
    t0 = time.monotonic()
    status, body = server.call("GET", "/v1/health", token=None, timeout=5)
    assert status == 200, body
    return time.monotonic() - t0


@pytest.fixture
def short(tmp_path: Path):
    s = FleetServer(tmp_path, extra=SHORT).start()
    yield s
    assert s.stop() == 0, s.log()


def test_half_open_and_slowloris_connections_are_closed(short: FleetServer) -> None:
    idle = [_connect(short.port) for _ in range(250)]
    partial = [_connect(short.port) for _ in range(50)]
    for s in partial:
        s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    # one header byte a second: each byte is progress, but the headers never end
    loris = _connect(short.port)
    loris.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Loris: ")
    stop = threading.Event()
    loris_closed = threading.Event()

    def drip() -> None:
        while not stop.is_set():
            try:
                loris.sendall(b"a")
            except OSError:
                loris_closed.set()
                return
            stop.wait(1.0)

    t = threading.Thread(target=drip, daemon=True)
    t.start()
    try:
        # the daemon answers others at once meanwhile
        assert max(_health_time(short) for _ in range(5)) < 2.0
        t0 = time.monotonic()
        for s in idle + partial:
            assert _closed_by_peer(s, within=max(0.1, 6.0 - (time.monotonic() - t0))), (
                "a connection that never finished its headers was left open"
            )
        assert _closed_by_peer(loris, within=5.0) or loris_closed.is_set(), (
            "a slowloris connection (one byte a second) was left open"
        )
        assert _health_time(short) < 2.0
    finally:
        stop.set()
        for s in idle + partial + [loris]:
            s.close()
    text = short.log()
    assert "Traceback" not in text
    assert len(text) < 20_000, f"{len(text)} bytes of log for 301 slow connections"


def test_idle_keepalive_connection_is_closed_but_kept_between_requests(short: FleetServer) -> None:
    s = _connect(short.port)
    for _ in range(2):  # reused within the idle timeout: kept open
        s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
        s.settimeout(5)
        assert s.recv(65536).startswith(b"HTTP/1.1 200")
        time.sleep(1.0)
    assert _closed_by_peer(s, within=6.0), "an idle keep-alive connection was left open"
    s.close()


def test_a_keepalive_connection_trickling_its_next_request_is_closed(short: FleetServer) -> None:
    """The header timeout restarts at the next request's first byte: a connection that made
    one good request and then sends headers a byte at a time is closed after 2 s, well before
    the idle timeout (5 s) would have closed it."""
    s = _connect(short.port)
    s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
    s.settimeout(5)
    assert s.recv(65536).startswith(b"HTTP/1.1 200")
    t0 = time.monotonic()
    s.sendall(b"GET /v1/health HTTP/1.1\r\n")
    closed = False
    while time.monotonic() - t0 < 6:
        try:
            s.sendall(b"x")
        except OSError:
            closed = True
            break
        if _closed_by_peer(s, within=0.5):
            closed = True
            break
    s.close()
    assert closed and time.monotonic() - t0 < 4.0, time.monotonic() - t0


def test_slow_body_times_out_with_408(short: FleetServer) -> None:
    s = _connect(short.port)
    s.sendall(
        b"POST /v1/tasks HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + present(short.admin).encode() + b"\r\n"
        b'Content-Length: 1000\r\n\r\n{"resource":'
    )
    s.settimeout(6)
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    finally:
        s.close()
    assert data.startswith(b"HTTP/1.1 408"), data[:200]
    assert _health_time(short) < 2.0


def test_long_poll_outlasts_the_connection_timeouts(short: FleetServer) -> None:
    """A worker's lease request waits --poll-wait (here 4 s, longer than every connection
    timeout) and answers normally."""
    token = short.token({"worker": True, "pool": "bare"})
    w = HttpWorker(short, token, "w-poll")
    w.register()
    t0 = time.monotonic()
    assert w.lease(wait=4) == []
    assert time.monotonic() - t0 >= 3.5


def test_connections_are_capped_and_the_cap_is_logged_once(tmp_path: Path) -> None:
    s = FleetServer(tmp_path, extra=["--max-connections", "40", *SHORT]).start()
    try:
        held = [_connect(s.port) for _ in range(40)]
        time.sleep(0.3)
        refused = []
        for _ in range(30):
            c = _connect(s.port)
            c.settimeout(5)
            refused.append(c.recv(4096))
            c.close()
        assert all(r.startswith(b"HTTP/1.1 503") for r in refused), refused[:3]
        for c in held:
            c.close()
        time.sleep(0.3)
        assert _health_time(s) < 2.0
        limits = Path(f"/proc/{present(s.proc).pid}/limits").read_text()
        line = next(li for li in limits.splitlines() if li.startswith("Max open files"))
        soft, hard = line.split()[3:5]
        assert soft == hard, f"RLIMIT_NOFILE soft limit not raised to the hard one: {line}"
    finally:
        assert s.stop() == 0, s.log()
    text = s.log()
    assert text.count("WARNING connection limit") == 1, text
    assert "29 more log lines of [kliqued.daemon.listener] 'connection limit" in text, text


class _TlsServer(FleetServer):
    def __init__(self, tmp: Path, cert: Path, key: Path) -> None:
        super().__init__(tmp, extra=[*SHORT, "--tls-cert", str(cert), "--tls-key", str(key)])
        self.url = f"https://127.0.0.1:{self.port}"

    def call(self, method, path, body=None, token="admin", headers=None, raw=None, timeout=30):
        import ssl
        import urllib.request

        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=ctx))
        old = urllib.request._opener  # type: ignore[attr-defined]
        urllib.request.install_opener(opener)
        try:
            return super().call(method, path, body, token, headers, raw, timeout)
        finally:
            urllib.request.install_opener(old)


@pytest.mark.skipif(not shutil.which("openssl"), reason="needs openssl to make a certificate")
def test_tls_serves_and_a_connection_that_never_handshakes_is_closed(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    s = _TlsServer(tmp_path, cert, key).start()
    try:
        silent = [_connect(s.port) for _ in range(20)]  # no ClientHello, ever
        assert _health_time(s) < 2.0
        for c in silent:
            assert _closed_by_peer(c, within=6.0), "a connection that never began TLS stayed"
            c.close()
    finally:
        assert s.stop() == 0, s.log()
    assert "plain HTTP" not in s.log() and "Traceback" not in s.log()
