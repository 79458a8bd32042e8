"""``/mcp``: agents over MCP (docs/channels.md), and its protected resource metadata.

The MCP exchange itself is the SDK's (``agents.endpoint``); this module only declares the
routes, so that the auth middleware checks the caller first, like any API call.
"""

from __future__ import annotations

from aiohttp import web

from kliqued.daemon.api.agents.endpoint import ENDPOINT, METADATA_PATH, PATH, metadata
from kliqued.daemon.errors import ApiError, MethodNotAllowed
from kliqued.daemon.api.request import principal, reply
from kliqued.daemon.api.routes import PUBLIC, Route


async def mcp(request: web.Request) -> web.StreamResponse:
    """An MCP exchange: JSON-RPC in a JSON body (the transport's rule), else the contract's
    415 rather than whatever the SDK would answer."""
    if request.content_type != "application/json":
        raise ApiError(
            415,
            "unsupported-media-type",
            f"POST /mcp takes JSON-RPC with Content-Type: application/json, not "
            f"{request.content_type or 'no content type'}",
        )
    return await request.app[ENDPOINT].handle(request, principal(request))


async def mcp_stream(request: web.Request) -> web.StreamResponse:
    """The MCP server-to-client stream: not offered (the spec's 405). The endpoint is
    stateless, so nothing would ever come on it, and each one would hold a connection."""
    raise MethodNotAllowed(
        "GET /mcp: this MCP endpoint is stateless and "
        "offers no server-to-client stream; send requests with POST /mcp",
        ("POST",),
    )


async def mcp_end(request: web.Request) -> web.StreamResponse:
    """Ending an MCP session: there is none to end (the endpoint is stateless), so the
    spec's 405, as the OpenAPI document says."""
    raise MethodNotAllowed(
        "DELETE /mcp: this MCP endpoint is stateless and has no session to end; "
        "send requests with POST /mcp",
        ("POST",),
    )


async def resource_metadata(request: web.Request) -> web.Response:
    return reply(metadata(request))


PEOPLE = ("admin", "finance", "user")
RULE = "each tool: the rights of the API operation it stands for (docs/channels.md)"

ROUTES = [
    Route(
        "POST",
        PATH,
        mcp,
        "mcp",
        PEOPLE,
        rule=RULE,
        hint="an agent acts as a person: use a user's token",
    ),
    Route(
        "GET",
        PATH,
        mcp_stream,
        "mcpStream",
        PEOPLE,
        rule=RULE,
        hint="an agent acts as a person: use a user's token",
    ),
    Route(
        "DELETE",
        PATH,
        mcp_end,
        "mcpEnd",
        PEOPLE,
        rule=RULE,
        hint="an agent acts as a person: use a user's token",
    ),
    Route("GET", METADATA_PATH, resource_metadata, "mcpResourceMetadata", PUBLIC),
]
