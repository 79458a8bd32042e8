"""What the middlewares put on a request is kept under typed keys (``web.RequestKey``): a
string key is aiohttp's ``NotAppKeyWarning``, silenced by aiohttp's own filter, so the test
turns it into an error in a daemon of its own (a subprocess: aiohttp warns once per process
and key, so a daemon in the test's process may already have warned)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.daemon import Server


def test_an_authenticated_call_puts_no_string_key_on_the_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # by its words: -W cannot name a category of a package not yet imported at start
    monkeypatch.setenv("PYTHONWARNINGS", "error:It is recommended to use web.RequestKey")
    server = Server(tmp_path).start()
    try:
        status, body = server.call("GET", "/v1/whoami", token=server.admin)
        assert status == 200, (status, body, server.log()[-2000:])
        assert body["kind"] == "role"
        assert "NotAppKeyWarning" not in server.log()
    finally:
        server.stop()
