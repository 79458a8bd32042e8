"""Agents over MCP (issue 14, part 1): the daemon's MCP server at ``/mcp``.

- ``tools``: the MCP tools, each the API operation the CLI uses (the same functions, the same
  role check, the same object-level rules), run as the caller's principal, with ``mcp`` as
  the channel of what they submit or cancel.
- ``explain``: a waiting or end reason in plain words, with what the user can do.
- ``asgi``: the bridge that serves the SDK's ASGI (Starlette) endpoint inside aiohttp.
- ``endpoint``: the streamable HTTP endpoint's lifetime (the SDK's session manager) and its
  aiohttp handler.

``kliqued mcp`` (kliqued/commands/mcp.py) serves the same tools over stdio by relaying to
``/mcp``: the tools always run in the daemon, so the channel is always the daemon's to set.
"""
