"""``/mcp``: agents over MCP (docs/channels.md), and its protected resource metadata.

The MCP exchange itself is the SDK's (``agents.endpoint``); this module only declares the
routes, so that the auth middleware checks the caller first, like any API call.
"""

from __future__ import annotations

from aiohttp import web

from kliqued.daemon.api.agents.endpoint import ENDPOINT, METADATA_PATH, PATH, metadata
from kliqued.daemon.errors import ApiError
from kliqued.daemon.api.request import principal, reply
from kliqued.daemon.api.routes import PUBLIC, Route


async def mcp(request: web.Request) -> web.StreamResponse:
    return await request.app[ENDPOINT].handle(request, principal(request))


async def mcp_stream(request: web.Request) -> web.StreamResponse:
    """The MCP server-to-client stream: not offered (the spec's 405). The endpoint is
    stateless, so nothing would ever come on it, and each one would hold a connection."""
    raise ApiError(
        405,
        "method-not-allowed",
        "GET /mcp: this MCP endpoint is stateless and "
        "offers no server-to-client stream; send requests with POST /mcp",
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
        mcp,
        "mcpEnd",
        PEOPLE,
        rule=RULE,
        hint="an agent acts as a person: use a user's token",
    ),
    Route("GET", METADATA_PATH, resource_metadata, "mcpResourceMetadata", PUBLIC),
]
