"""``promtool check metrics`` on a scrape: what operators run on our ``/metrics`` (naming,
base units, HELP and TYPE lines). Debian's ``prometheus`` package brings it
(tests/setup/system-packages.sh); without it the check says so and the caller skips."""

from __future__ import annotations

import shutil
import subprocess

PROMTOOL = shutil.which("promtool")
MISSING = "promtool is not installed (Debian's prometheus package: tests/setup/system-packages.sh)"


def problems(text: str) -> str:
    """What promtool finds wrong in the exposition ``text`` ('' when nothing, or when
    promtool is absent: callers that must run it skip on :data:`PROMTOOL` first)."""
    if PROMTOOL is None:
        return ""
    r = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    found = (r.stdout + r.stderr).strip()
    return found or ("" if r.returncode == 0 else f"promtool exited {r.returncode}")
