"""Raw HTTP for the hostile-input tests: bodies and header values as bytes, exactly as sent
(no client-side JSON encoding that would escape or refuse what an attacker sends)."""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Mapping
from typing import Any

from tests.harness.daemon import Server


def send(
    server: Server,
    method: str,
    path: bytes | str,
    body: bytes | None = None,
    token: str | None = None,
    headers: Mapping[str, bytes | str] | None = None,
    timeout: float = 30,
) -> tuple[int, Any]:
    """(status, parsed JSON or raw bytes). ``path`` and header values may hold any bytes:
    the request is written on the socket as given."""
    target = path if isinstance(path, bytes) else path.encode()
    lines = [
        method.encode() + b" " + target + b" HTTP/1.1",
        b"Host: 127.0.0.1",
        b"Connection: close",
    ]
    if token:
        lines.append(b"Authorization: Bearer " + token.encode())
    if body is not None:
        lines += [b"Content-Type: application/json", b"Content-Length: %d" % len(body)]
    for k, v in (headers or {}).items():
        lines.append(k.encode() + b": " + (v if isinstance(v, bytes) else v.encode()))
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as sock:
        sock.sendall(b"\r\n".join(lines) + b"\r\n\r\n" + (body or b""))
        resp = http.client.HTTPResponse(sock)
        resp.begin()
        raw = resp.read()
        ctype = resp.getheader("Content-Type") or ""
    if "json" in ctype and raw:
        return resp.status, json.loads(raw)
    return resp.status, raw


def alive(server: Server) -> bool:
    """The process runs and health answers 200."""
    if server.proc is None or server.proc.poll() is not None:
        return False
    try:
        status, _ = server.call("GET", "/v1/health", token=None, timeout=10)
    except OSError:
        return False
    return status == 200
