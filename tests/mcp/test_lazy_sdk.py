"""The MCP SDK is loaded at the first ``/mcp`` call, not when the daemon starts (issue 27:
~0.9 s of each start; docs/decisions.md R7). The calls themselves: the other tests here."""

from __future__ import annotations

import pytest

import subprocess
import sys


@pytest.mark.slow  # long on its own: make test, not make check
def test_the_daemon_starts_without_the_mcp_sdk() -> None:
    code = (
        "import sys, kliqued.daemon.server, kliqued.daemon.api.app\n"
        "print(sorted(m for m in sys.modules if m == 'mcp' or m.startswith('mcp.')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"
