"""Finding 10 of issue 9: a credential never reaches the daemon's log (nor is echoed back),
whatever the shape of the header that carries it: a trailing NUL, a control character, a
header longer than aiohttp's 8,190-byte limit, or an error message that quotes it.
"""

from __future__ import annotations

import io
import logging
import socket
from pathlib import Path

import pytest

from kliqued.daemon import logsetup
from tests.harness.daemon import Server


def _raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        data = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        except (ConnectionResetError, socket.timeout):
            pass
    return data


def _text_of_files(where: Path) -> str:
    """Every file the daemon wrote beside its database, except the database itself (which
    holds only token hashes)."""
    out = []
    for p in where.rglob("*"):
        if p.is_file() and ".duckdb" not in p.name:
            out.append(p.read_text(errors="replace"))
        elif p.is_file() and p.name.endswith(".log"):
            out.append(p.read_text(errors="replace"))
    return "\n".join(out)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("redaction")).start()
    yield s
    s.stop()


SHAPES = {
    "trailing NUL": lambda t: b"Authorization: Bearer " + t + b"\x00\r\n",
    "control character": lambda t: b"Authorization: Bearer " + t + b"\x01x\r\n",
    "over 8190 bytes": lambda t: b"Authorization: Bearer " + t + b"A" * 9000 + b"\r\n",
    "token only, over 8190": lambda t: b"Authorization: " + t + b"B" * 9000 + b"\r\n",
    "in another header": lambda t: b"X-Debug: " + t + b"\x00\r\n",
    "in the request line": lambda t: b"X-A: 1\r\n",  # see the request line below
}


@pytest.mark.parametrize("shape", SHAPES)
def test_a_malformed_header_never_logs_or_echoes_the_token(daemon: Server, shape: str) -> None:
    secret = daemon.token({"user": "alice", "name": f"redaction {shape}"})
    assert daemon.ok("GET", "/v1/whoami", token=secret)  # a valid token
    line = (
        b"GET /v1/whoami?t=" + secret.encode() + b"\x00 HTTP/1.1\r\n"
        if shape == "in the request line"
        else b"GET /v1/whoami HTTP/1.1\r\n"
    )
    answer = _raw(daemon.port, line + b"Host: x\r\n" + SHAPES[shape](secret.encode()) + b"\r\n")
    status = answer.split(b" ", 2)[1] if answer else b""
    assert status.startswith(b"4"), answer[:300]
    assert secret.encode() not in answer, "the token was echoed back"
    assert secret[3:23].encode() not in answer
    daemon.ok("GET", "/v1/health", token=None)
    log = daemon.log() + _text_of_files(daemon.tmp)
    assert secret not in log and secret[3:23] not in log, (
        f"the token is in the daemon's log:\n{log[-3000:]}"
    )
    assert "Traceback" not in daemon.log()


@pytest.mark.parametrize(
    "text",
    [
        "bad header b'Authorization: Bearer SECRETVALUE123\\x00'",
        "Got more than 8190 bytes when reading: b'Bearer SECRETVALUE123AAAA...'",
        "{'Authorization': 'SECRETVALUE123'}",
        "token kq_SECRETVALUE123abc in a message",
        "env KLIQUE_TOKEN=SECRETVALUE123 in a command",
        "{'token': 'SECRETVALUE123', 'name': 'ci'}",
    ],
)
def test_the_log_filter_redacts_every_credential_shape(text: str) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(logsetup.RedactFilter())
    lg = logging.getLogger("test.redaction")
    lg.addHandler(handler)
    lg.propagate = False
    try:
        lg.warning("%s", text)
        try:
            raise ValueError(text)
        except ValueError:
            lg.exception("failed")
    finally:
        lg.removeHandler(handler)
    out = stream.getvalue()
    assert "SECRETVALUE123" not in out, out
    assert "[redacted]" in out


def test_a_flood_of_one_message_is_shown_once_with_a_count() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    flood = logsetup.FloodFilter(window=0.2)
    handler.addFilter(flood)
    lg = logging.getLogger("aiohttp.test-flood")
    lg.addHandler(handler)
    lg.propagate = False
    try:
        for i in range(1000):
            lg.warning("connection %s failed", i)
        import time

        time.sleep(0.25)
        lg.warning("connection %s failed", "last")
    finally:
        lg.removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2, lines[:5]
    assert "999 more like this" in lines[1]


def test_the_log_filter_keeps_ids_and_plain_words() -> None:
    text = "KLIQUE_ADMIN_TOKEN is a revoked token (tok-01M8S1): not restored; task t-01ABC"
    assert logsetup.redact(text) == text
