"""``kliqued login`` through the real provider (issue 30): the device authorization grant
(the person approves the code in a browser: the development form, filled by
tests/harness/oidc.py's ``walk``), a short-lived Klique token stored in a config context
(0600) that the CLI, the SDK and ``kliqued mcp``'s client use, and renewed through the
provider's refresh token when it nears its end."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from kliqued.cli import main
from kliqued.sdk import Client

from tests.harness.daemon import ROOT
from tests.harness.inproc import InProcServer
from tests.harness.oidc import Provider, walk
from tests.harness.oidc_estate import write_estate


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "klique" / "config.yaml"
    for var in ("KLIQUE_TOKEN", "KLIQUE_URL", "KLIQUE_ID_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("KLIQUE_CONFIG", str(path))
    return path


def login(url: str, people: Provider, who: str, *more: str) -> str:
    """``kliqued login`` in a subprocess, the code approved as ``who``; its stderr."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kliqued.cli", "login", "--url", url, *more],
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=dict(os.environ),
    )
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        m = re.match(r"To sign in, open (\S+)", first)
        assert m, first + proc.stderr.read()
        assert walk(people, m.group(1), who) is None  # the device grant's success page
        rest = proc.stderr.read()
        assert proc.wait(60) == 0, first + rest
        return first + rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def context(path: Path, name: str) -> dict:
    data = YAML(typ="safe").load(path.read_text())
    return next(c for c in data["contexts"] if c["name"] == name)


def test_login_stores_a_short_lived_token_the_cli_and_sdk_use(
    idp_server: InProcServer,
    oidc_people: Provider,
    config: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    s = idp_server
    out = login(s.url, oidc_people, "bob", "--context", "corp")
    assert "signed in as user:bob through corp (context 'corp'" in out
    assert config.stat().st_mode & 0o777 == 0o600
    ctx = context(config, "corp")
    assert ctx["url"] == s.url and ctx["token"].startswith("kq_")
    assert ctx["login"]["provider"] == "corp" and ctx["login"]["refresh-token"]
    assert main(["whoami", "--json"]) == 0
    assert '"principal": "user:bob"' in capsys.readouterr().out
    assert Client.from_config().whoami()["principal"] == "user:bob"  # the SDK; kliqued mcp's client
    [ev] = s.ok("GET", "/v1/events?kind=signed_in")["events"]
    assert (
        ev["data"]["via"] == "signin"
        and ev["data"]["token"] == s.ok("GET", "/v1/tokens")["tokens"][-1]["id"]
    )


def test_kliqued_mcp_relays_as_the_signed_in_person(
    idp_server: InProcServer, oidc_people: Provider, config: Path
) -> None:
    """The agent channel uses the same context: ``kliqued mcp`` over stdio, as bob."""
    import asyncio

    from mcp import Client as McpClient
    from mcp import StdioServerParameters

    login(idp_server.url, oidc_people, "bob")
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "kliqued.cli", "mcp"],
        env=dict(os.environ),
        cwd=str(ROOT),
    )

    async def go() -> dict:
        async with McpClient(params) as c:
            return (await c.call_tool("whoami", {})).structured_content or {}

    assert asyncio.run(go())["principal"] == "user:bob"


def test_a_token_near_its_end_is_renewed_through_the_provider(
    tmp_path: Path, oidc_people: Provider, oidc_actions: Provider, config: Path
) -> None:
    """The estate gives sign-ins 2-minute tokens: within the renewal window from the start,
    so the next command renews (a new token, a new sign-in in the audit) with no prompt."""
    estate = write_estate(
        tmp_path / "estate", oidc_people, oidc_actions, "    token_lifetime: 2m\n"
    )
    s = InProcServer(tmp_path, estate).start()
    try:
        login(s.url, oidc_people, "walter", "--role", "admin")
        first = context(config, "default")["token"]
        assert Client.from_config().whoami()["principal"] == "role:admin"
        renewed = context(config, "default")["token"]
        assert renewed != first
        signed = s.ok("GET", "/v1/events?kind=signed_in")["events"]
        assert [e["data"]["principal"] for e in signed] == ["role:admin", "role:admin"]
        assert config.stat().st_mode & 0o777 == 0o600
    finally:
        s.stop()


def test_login_against_a_daemon_without_providers_says_so(
    tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s = InProcServer(tmp_path).start()
    try:
        assert main(["login", "--url", s.url]) == 1
        err = capsys.readouterr().err
        assert "trusts no identity provider" in err and "Traceback" not in err
    finally:
        s.stop()
