"""The ``/mcp`` endpoint: the MCP SDK's streamable HTTP transport inside the daemon.

The caller is authenticated like every API call (the auth middleware: a 401 with
``WWW-Authenticate: Bearer ...`` and the protected resource metadata's address, the MCP
authorization spec's shape), and each tool call runs as that principal (``tools.acting_as``).
The transport is stateless and answers JSON: each POST is one exchange that carries its own
token, so a revoked token stops an agent at its next call, and nothing is kept between
calls. The SDK's session manager runs from the first call to the application's end (``stop``).

The MCP SDK (about 0.9 s of imports) is loaded at the first call, not when the daemon starts:
most daemons never serve an agent, and every start (each test's too) would pay for it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from typing import TYPE_CHECKING

from aiohttp import web

from kliqued.daemon.api.request import Context
from kliqued.daemon.api.agents import asgi

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

log = logging.getLogger(__name__)

PATH = "/mcp"
METADATA_PATH = "/.well-known/oauth-protected-resource" + PATH
"""RFC 9728's address of the resource's metadata, which a 401 names."""


class Endpoint:
    """The MCP server of one daemon, its SDK session manager and the ASGI app serving it."""

    def __init__(self, c: Context) -> None:
        self.context = c
        self.server: MCPServer | None = None
        self.app: Any = None
        """The SDK's ASGI application, made at the first call (:meth:`_started`)."""
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._starting: asyncio.Lock | None = None

    def _build(self) -> None:
        """The MCP server and its ASGI app: the SDK imported here, on first use."""
        from mcp.server.transport_security import TransportSecuritySettings

        from kliqued.daemon.api.agents import tools

        self.server = server = tools.build(self.context)
        # No DNS-rebinding host check: every request must carry a bearer token, which a page
        # that rebinds a name to the daemon cannot send (docs/decisions.md, Channels: MCP).
        self.app = server.streamable_http_app(
            streamable_http_path=PATH,
            stateless_http=True,
            json_response=True,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )

    async def _run(self) -> None:
        assert self.server is not None
        async with self.server.session_manager.run():
            self._ready.set()
            await self._stop.wait()

    async def start(self, _app: web.Application | None = None) -> None:
        """Builds the server and starts the SDK's session manager: at the first call
        (:meth:`handle`), or at once when called directly."""
        if self.server is None:
            self._build()
        self._task = asyncio.create_task(self._run())
        ready = asyncio.ensure_future(self._ready.wait())
        await asyncio.wait({ready, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if self._task.done():
            ready.cancel()
            self._task.result()  # raises what stopped it

    async def stop(self, _app: web.Application | None = None) -> None:
        """Stops it (an aiohttp ``on_cleanup`` hook): calls in flight are cancelled."""
        self._stop.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def _started(self) -> None:
        if self._task is not None:
            return
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:  # two first calls at once start it once
            if self._task is None:
                try:
                    await self.start()
                except BaseException:
                    self._task = None  # the next call tries again
                    raise

    async def handle(self, request: web.Request, principal: Any) -> web.StreamResponse:
        """One MCP exchange, its tool calls run as ``principal``."""
        body = await request.read()
        await self._started()
        from kliqued.daemon.api.agents import tools  # loaded by _started

        with tools.acting_as(principal):
            return await asgi.serve(self.app, request, body)


ENDPOINT = web.AppKey("mcp", Endpoint)


def metadata(request: web.Request) -> dict[str, Any]:
    """The protected resource metadata (RFC 9728) of ``/mcp`` as ``request`` reached it: the
    resource, and that a bearer token goes in the Authorization header. No authorization
    server is named: tokens are made with ``kliqued token create`` (docs/identity.md)."""
    base = f"{request.scheme}://{request.host}"
    return {
        "resource": base + PATH,
        "bearer_methods_supported": ["header"],
        "resource_name": "Klique (MCP)",
    }


def www_authenticate(request: web.Request, description: str) -> str:
    """The ``WWW-Authenticate`` value of a 401 (RFC 6750: ``invalid_token`` when a token was
    sent, no error code when none was; RFC 9728's ``resource_metadata`` for ``/mcp``, where
    MCP clients look for it)."""
    desc = description.replace("\\", "\\\\").replace('"', "'")
    desc = desc.encode("ascii", "replace").decode()  # a header value: ASCII, one line
    value = 'Bearer realm="klique"'
    if request.headers.get("Authorization"):
        value += ', error="invalid_token"'
    value += f', error_description="{desc}"'
    if request.path == PATH:
        value += f', resource_metadata="{request.scheme}://{request.host}{METADATA_PATH}"'
    return value
