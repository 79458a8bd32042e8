"""``kliqued mcp``: the tools over stdio for a local agent client, as its user (KLIQUE_TOKEN
or the config file's context), relayed to the daemon, which records the channel."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from mcp import Client, StdioServerParameters
from mcp.types import TextContent

from tests.harness.daemon import ROOT, Server

from .conftest import Tokens


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("KLIQUE_URL", "KLIQUE_TOKEN", "KLIQUE_CONFIG")
    }
    return {**env, **extra}


def _params(env: dict[str, str]) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable, args=["-m", "kliqued.cli", "mcp"], env=env, cwd=str(ROOT)
    )


def test_stdio_relays_as_the_token_s_user(server: Server, tokens: Tokens) -> None:
    async def go() -> dict:
        async with Client(_params(_env(KLIQUE_URL=server.url, KLIQUE_TOKEN=tokens.bob))) as c:
            assert "submit_task" in {t.name for t in (await c.list_tools()).tools}
            res = await c.call_tool("submit_task", {"resource": "team-a/one", "command": ["true"]})
            assert not res.is_error, res.content
            other = await c.call_tool(
                "submit_task", {"resource": "team-b/one", "command": ["true"]}
            )
            text = other.content[0]
            assert (
                other.is_error
                and isinstance(text, TextContent)
                and "bob may submit to team-a/" in text.text
            )
            return res.structured_content

    t = asyncio.run(go())
    assert (t["user"], t["channel"]) == ("bob", "mcp")
    assert server.ok("GET", f"/v1/tasks/{t['id']}")["channel"] == "mcp"
    server.ok("POST", f"/v1/tasks/{t['id']}/cancel")


def test_stdio_takes_the_config_context(server: Server, tokens: Tokens, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        f"current-context: lab\ncontexts:\n  - name: lab\n    url: {server.url}\n"
        f"    token: {tokens.erin}\n"
    )
    config.chmod(0o600)

    async def go() -> dict:
        async with Client(_params(_env(KLIQUE_CONFIG=str(config)))) as c:
            return (await c.call_tool("whoami", {})).structured_content

    assert asyncio.run(go())["principal"] == "user:erin"


def test_a_wrong_token_stops_it_with_one_line(server: Server) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kliqued.cli", "mcp"],
        cwd=ROOT,
        env=_env(KLIQUE_URL=server.url, KLIQUE_TOKEN="kq_forged-123"),
        input="",
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 1 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kliqued: unknown token"), lines
    proc = subprocess.run(
        [sys.executable, "-m", "kliqued.cli", "mcp"],
        cwd=ROOT,
        env=_env(),
        input="",
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 1 and "KLIQUE_URL" in proc.stderr and "Traceback" not in proc.stderr


def test_stdio_relays_to_the_leader_of_several_daemons(tmp_path: Path, pg_url: str) -> None:
    """``KLIQUE_URL=STANDBY,LEADER`` (docs/ha.md): the relay's one long-lived connection goes
    to the leader, since a standby would answer ``/mcp`` with a redirect the relay does not
    follow (the token goes only where it was sent)."""
    from tests.daemon.test_failover import pair

    a, b = pair(tmp_path, pg_url)
    try:
        bob = a.token({"user": "bob"})

        async def go() -> dict:
            async with Client(_params(_env(KLIQUE_URL=f"{b.url},{a.url}", KLIQUE_TOKEN=bob))) as c:
                res = await c.call_tool(
                    "submit_task", {"resource": "team-a/one", "command": ["true"]}
                )
                assert not res.is_error, res.content
                return res.structured_content

        t = asyncio.run(go())
        assert (t["user"], t["channel"]) == ("bob", "mcp")
        assert a.ok("GET", f"/v1/tasks/{t['id']}")["channel"] == "mcp"
    finally:
        for s in (a, b):
            s.stop()
