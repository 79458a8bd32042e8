"""How the daemon listens: connection timeouts, a connection cap, and the answer to requests
aiohttp cannot parse.

Why: aiohttp closes a connection that never completes a request only after its keep-alive
timeout (an hour by default), reads a request body for as long as the client trickles it, and
accepts connections until the process runs out of file handles; then every accept fails with
a traceback. And its parser's errors quote the raw header bytes, a bearer token included, in
both the log and the response. So:

- *header timeout*: a request's headers must be complete this long after the connection opens
  or after the request's first byte (a slowloris sending a byte a second is closed);
- *idle timeout*: a keep-alive connection waiting for its next request is closed after this
  (aiohttp's ``keepalive_timeout``);
- *body timeout*: a request body must arrive this long after its headers (answered 408);
- *connection cap*: connections past the cap get a 503 and are closed at once; the cap stays
  below the process's file-handle limit, whose soft value is raised to the hard one at start.

A handler waiting inside the application (a worker's long poll, ``logs --follow``) is neither
idle nor reading, so none of these timeouts cuts it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import resource
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError, LineTooLong
from aiohttp.web_protocol import RequestHandler

log = logging.getLogger(__name__)
"""Client-driven messages: aggregated by logsetup.FloodFilter."""


@dataclass(frozen=True)
class Limits:
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 60.0
    body_timeout_s: float = 30.0
    max_connections: int = 10_000


# ---------------------------------------------------------------------- file handles
def raise_nofile() -> int:
    """Raises the soft RLIMIT_NOFILE to the hard limit (what an unprivileged process may do)
    and returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == resource.RLIM_INFINITY:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    else:
        target = hard
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-files limit from %d to %d: %s", soft, target, exc)
    return soft


def listen_backlog(nofile: int) -> int:
    """The listen backlog, which is also how many connections asyncio accepts in one go,
    before the cap (checked when each one's protocol is made) can refuse any of them."""
    return max(16, min(1024, nofile // 16))


def connection_cap(requested: int, nofile: int) -> int:
    """The cap in force: ``requested``, but leaving an eighth of the file handles (at least 64)
    to the database, task logs and git, and room for the accepts past the cap: a refused
    connection holds its handle for a few loop turns (its 503 written, then closed), while
    asyncio accepts a batch of up to a backlog each turn (measured: three batches suffice)."""
    reserve = max(64, nofile // 8) + 3 * listen_backlog(nofile)
    return max(16, min(requested, nofile - reserve))


# ---------------------------------------------------------------------- one connection
def _parse_error_text(exc: BaseException | None) -> str:
    """What a client is told about a request aiohttp could not parse; never the bytes."""
    if isinstance(exc, LineTooLong):
        return "a request line or header is too long (limit 8190 bytes)"
    if isinstance(exc, HttpProcessingError):
        head = (exc.message or "").split(":", 1)[0].split("\n", 1)[0].strip()
        if head and len(head) <= 80 and all(c.isalnum() or c in " -_." for c in head):
            return head[0].lower() + head[1:]
    return "the request is not valid HTTP"


class KliqueRequestHandler(RequestHandler):
    """aiohttp's per-connection protocol, plus the header timeout, the connection count and an
    error answer that echoes nothing the client sent."""

    def __init__(
        self, *args: Any, limits: Limits, counter: "ConnectionCounter", **kwargs: Any
    ) -> None:
        super().__init__(*args, keepalive_timeout=limits.idle_timeout_s, **kwargs)
        self._limits = limits
        self._counter = counter
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._counter.open += 1
        super().connection_made(transport)
        self._arm_header_timer()  # a new connection owes its first request's headers

    def connection_lost(self, exc: BaseException | None) -> None:
        self._counter.open -= 1
        self._disarm_header_timer()
        super().connection_lost(exc)

    def _waiting_for_headers(self) -> bool:
        # aiohttp's start() loop waits on ``_waiter`` until the parser has a whole request;
        # while a handler runs there is no waiter. (A private attribute, stable since 3.x;
        # tests/security/test_connections.py fails if that changes.)
        w = self._waiter
        return w is not None and not w.done()

    def data_received(self, data: bytes) -> None:
        idle = self._header_timer is None and self._waiting_for_headers()
        super().data_received(data)
        if not self._waiting_for_headers():
            self._disarm_header_timer()  # a whole request arrived (or a handler runs)
        elif idle:
            self._arm_header_timer()  # the first byte of a keep-alive connection's request

    def _arm_header_timer(self) -> None:
        self._disarm_header_timer()
        self._header_timer = self._loop.call_later(
            self._limits.header_timeout_s, self._header_deadline
        )

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_deadline(self) -> None:
        self._header_timer = None
        if self._waiting_for_headers():
            log.info(
                "closed connections that did not send a request's headers within %g s",
                self._limits.header_timeout_s,
            )
            self.force_close()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if not isinstance(exc, HttpProcessingError):
            return super().handle_error(request, status, exc, message)
        text = _parse_error_text(exc)
        log.info(
            "answered 400 to a request that is not valid HTTP (%s: %s)", type(exc).__name__, text
        )
        body = {"error": {"code": "invalid-http", "message": f"malformed HTTP request: {text}"}}
        resp = web.json_response(body, status=status if 400 <= status < 500 else 400)
        resp.force_close()
        return resp


class ConnectionCounter:
    """Open connections of one listener (counted by the handlers themselves: O(1))."""

    def __init__(self) -> None:
        self.open = 0


_REFUSAL = json.dumps(
    {
        "error": {
            "code": "too-many-connections",
            "message": "the daemon has too many open connections; retry shortly",
        }
    }
).encode()
_REFUSAL_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Retry-After: 1\r\nConnection: close\r\nContent-Length: "
    + str(len(_REFUSAL)).encode()
    + b"\r\n\r\n"
    + _REFUSAL
)


class _Refused(asyncio.Protocol):
    """A connection past the cap: told 503 and closed at once, so it holds no handle."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if isinstance(transport, asyncio.WriteTransport):  # a stream's: always
            transport.write(_REFUSAL_RESPONSE)
        transport.close()


class ListenSite(web.TCPSite):
    """``web.TCPSite`` whose connections are ``KliqueRequestHandler`` s, capped, and whose TLS
    handshakes are bound by the header timeout too."""

    def __init__(
        self, runner: web.AppRunner, host: str, port: int, *, limits: Limits, **kwargs: Any
    ) -> None:
        super().__init__(runner, host, port, **kwargs)
        self.limits = limits
        self.counter = ConnectionCounter()

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with the runner
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        # the keyword arguments aiohttp's Server gives each RequestHandler (the runner's)
        handler_kwargs = dict(server._kwargs)
        handler_kwargs.pop("keepalive_timeout", None)
        cap, counter, limits = self.limits.max_connections, self.counter, self.limits

        def factory() -> asyncio.BaseProtocol:
            if counter.open >= cap:
                log.warning(
                    "connection limit (%d) reached: new connections get 503 until some close", cap
                )
                return _Refused()
            return KliqueRequestHandler(
                server, loop=loop, limits=limits, counter=counter, **handler_kwargs
            )

        extra: dict[str, Any] = {}
        if self._ssl_context is not None:
            extra["ssl_handshake_timeout"] = limits.header_timeout_s
        self._server = await loop.create_server(
            factory,
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
            **extra,
        )


# ---------------------------------------------------------------------- request bodies
def body_timeout_middleware(timeout_s: float) -> Any:
    """Reads each request's body (at most ``client_max_size``) within ``timeout_s``, before
    the handler runs; the handler's own ``request.read()`` then returns the cached bytes. A
    body that is too slow gets 408 and the connection is closed; a body aiohttp cannot parse
    (bad chunking, short Content-Length) gets 400."""

    @web.middleware
    async def body_timeout(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.body_exists:
            try:
                if request.content.is_eof():  # all here already (most bodies): no wait
                    await request.read()
                else:  # a timeout scope, not wait_for's task a request
                    async with asyncio.timeout(timeout_s):
                        await request.read()
            except asyncio.TimeoutError:
                log.info(
                    "answered 408 to a request whose body did not arrive within %g s", timeout_s
                )
                resp = _error(
                    408,
                    "request-timeout",
                    f"the request body did not arrive within {timeout_s:g} s",
                )
                resp.force_close()
                return resp
            except HttpProcessingError as exc:
                resp = _error(
                    400, "invalid-http", f"malformed HTTP request body: {_parse_error_text(exc)}"
                )
                resp.force_close()
                return resp
        return await handler(request)

    return body_timeout


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


# ---------------------------------------------------------------------- plain HTTP
def is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def plain_http_warning(host: str, tls: bool) -> str | None:
    """The warning printed once at start when tokens would cross a network in clear text."""
    if tls or is_loopback(host):
        return None
    return (
        f"serving plain HTTP on {host}, which is not a loopback address: tokens and "
        f"commands cross the network unencrypted. Give --tls-cert and --tls-key, or put "
        f"a TLS-terminating proxy in front and listen on 127.0.0.1"
    )
