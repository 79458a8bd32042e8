"""``kliqued mcp``: Klique's MCP tools over stdio, for a local agent client (Claude Desktop,
an IDE's agent), as its user.

The tools run in the daemon, never here: this process relays the agent's MCP messages
between its stdin/stdout and the daemon's ``/mcp`` (streamable HTTP) with the user's token,
from ``--token``, ``KLIQUE_TOKEN`` or the config file's context, like every client command.
So the agent gets exactly its user's rights, and the daemon alone records the channel
(``mcp``) of what it does. The token is checked before the relay starts: a wrong one is a
one-line error on stderr and exit 1, which the agent client shows as the server's failure.
"""

from __future__ import annotations

import argparse
import ssl
import sys
from typing import Any

from ._client import add_client_flags, client, handles_errors
from ._common import add_command


def register(subparsers) -> None:
    p = add_command(
        subparsers,
        "mcp",
        help="serve Klique's MCP tools over stdio to a local agent, as you",
        description="Speaks the Model Context Protocol on stdin/stdout for a local agent "
        "client, relaying to the daemon's /mcp with your token: the agent may "
        "list the compute resources you may use, submit, show, explain and cancel "
        "your tasks, read their logs, and read your groups' budgets and the pools, "
        "with your rights and no more. Everything it submits or cancels is "
        "recorded as yours, with channel mcp. Configure your agent client to run "
        "this command (docs/channels.md).",
        examples="  KLIQUE_URL=https://klique.example:8443 KLIQUE_TOKEN=kq_... kliqued mcp\n"
        "  kliqued mcp --context prod",
    )
    add_client_flags(p, json_flag=False)
    p.set_defaults(handler=run)


@handles_errors
def run(args: argparse.Namespace) -> int:
    k = client(args)
    who = k.whoami()  # a wrong token or URL fails here, in words, before any relaying
    k.find_leader()  # several daemons: the relay's one connection goes to the leader
    print(f"kliqued mcp: relaying to {k.url}/mcp as {who.get('principal')}", file=sys.stderr)
    import anyio

    verify: Any = k.ssl_context if k.ssl_context is not None else True
    try:
        anyio.run(relay, f"{k.url}/mcp", k.token, verify, args.timeout)
    except KeyboardInterrupt:
        pass
    return 0


async def relay(url: str, token: str, verify: ssl.SSLContext | bool, timeout: float) -> None:
    """Relays MCP messages between stdio and ``url`` until stdin closes."""
    import anyio
    import httpx2
    from mcp.client.streamable_http import streamable_http_client
    from mcp.server.stdio import stdio_server

    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"},
        verify=verify,
        timeout=httpx2.Timeout(timeout, read=max(timeout, 300.0)),
    )
    async with (
        http,
        stdio_server() as (agent_in, agent_out),
        streamable_http_client(url, http_client=http) as (daemon_in, daemon_out),
    ):
        async with anyio.create_task_group() as tg:

            async def pump(src: Any, dst: Any, name: str, last: bool) -> None:
                async for message in src:
                    if isinstance(message, Exception):  # a transport error: said, not fatal
                        print(f"kliqued mcp: {name}: {message}", file=sys.stderr)
                        continue
                    await dst.send(message)
                if last:  # the agent closed stdin: done
                    tg.cancel_scope.cancel()

            tg.start_soon(pump, agent_in, daemon_out, "agent", True)
            tg.start_soon(pump, daemon_in, agent_out, "daemon", False)
