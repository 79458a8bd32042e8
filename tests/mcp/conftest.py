"""Fixtures for the MCP tests: a real ``kliqued serve`` (over HTTP) with tokens for two users
of one group, a user of another group and a worker; and an MCP client speaking to ``/mcp``
with a token, through the SDK's own streamable HTTP transport."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, AsyncIterator

import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from tests.harness.daemon import Server
from tests.harness.inproc import InProcServer


@dataclass
class Tokens:
    bob: str  # team-a user
    alice: str  # team-a user and admin
    erin: str  # team-b user
    worker: str  # worker:pool-1


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    s = InProcServer(tmp_path_factory.mktemp("mcp")).start()
    yield s
    log = s.log()
    assert s.stop() == 0, log
    assert "Traceback" not in log, log


@pytest.fixture(scope="module")
def tokens(server: Server) -> Tokens:
    return Tokens(
        bob=server.token({"user": "bob"}),
        alice=server.token({"user": "alice"}),
        erin=server.token({"user": "erin"}),
        worker=server.token({"worker": True, "pool": "pool-1"}),
    )


@asynccontextmanager
async def mcp_client(url: str, token: str | None) -> AsyncIterator[Client]:
    """An MCP client of ``url`` (a daemon's ``/mcp``) sending ``token`` as its bearer."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with create_mcp_http_client(headers=headers) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            yield client


def call(url: str, token: str, tool: str, args: dict[str, Any] | None = None) -> Any:
    """One tool call in a fresh client: ``(is_error, structured content or text)``."""

    async def go() -> Any:
        async with mcp_client(url, token) as c:
            res = await c.call_tool(tool, args or {})
            text = "".join(getattr(b, "text", "") for b in res.content)
            if res.is_error:
                return True, text
            return (
                False,
                res.structured_content if res.structured_content is not None else json.loads(text),
            )

    return asyncio.run(go())
