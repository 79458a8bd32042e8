"""A task's outputs: the ``KEY=VALUE`` lines it writes to the file named by
``$KLIQUE_OUTPUTS``, sent back with its ``finished`` report so that a pipeline's later steps
can use them (docs/channels.md, "Pipelines").

The file is in the task's own directory beside its log (workers/checkpoints.py,
``task_dir``), so the process executor (and any executor that shares the worker's
filesystem, or mounts that directory: a container) sees it; the worker reads at most
``MAX_BYTES`` of it and keeps the lines that are ``KEY=VALUE`` with a shell-like key (spaces around the key and the value are dropped).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from workers.checkpoints import task_dir

ENV = "KLIQUE_OUTPUTS"
MAX_BYTES = 64 * 1024
MAX_KEYS = 100
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def path_for(log_path: str) -> str:
    return os.path.join(task_dir(log_path), "outputs")


def read(path: str) -> dict[str, str] | None:
    """The outputs written to ``path``, or None (no file, nothing valid in it). Later lines
    win over earlier ones for the same key; blank lines and ``#`` comments are skipped."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_BYTES)
    except OSError:
        return None
    out: dict[str, str] = {}
    for line in data.decode("utf-8", "replace").splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        key = key.strip()
        if _KEY.fullmatch(key) and (key in out or len(out) < MAX_KEYS):
            out[key] = value.strip()[:4096]
    return out or None


def remove(path: str) -> None:
    Path(path).unlink(missing_ok=True)
