"""Output into a pipe whose reader has gone (``kliqued ... | head -1``): no message, no
traceback, the exit status of a process ended by SIGPIPE (issue 10, bug 9)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO


def _run_into_closed_pipe(*args: str) -> subprocess.CompletedProcess:
    """The reader closes its end before kliqued writes: the first write fails with EPIPE,
    every time (the race of a real `head` made certain)."""
    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.run(
            [sys.executable, "-m", "kliqued.cli", *args],
            cwd=REPO,
            stdout=w,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(w)


def test_a_closed_pipe_is_silent() -> None:
    for args in (["schema"], ["compile", "estate"], ["validate", "estate"]):
        p = _run_into_closed_pipe(*args)
        assert (p.stderr, p.returncode) == ("", 141), args


def test_piped_to_head() -> None:
    """A real shell pipeline to ``head -1``: the first line, nothing on stderr."""
    cmd = (
        f"'{sys.executable}' -m kliqued.cli compile estate | head -1; "
        f"'{sys.executable}' -m kliqued.cli schema | head -1"
    )
    p = subprocess.run(["sh", "-c", cmd], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.stdout.splitlines() == ["{", "{"] and p.stderr == ""
