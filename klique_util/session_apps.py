"""The session apps and the program each needs on a worker: what a worker advertises when it
registers (the apps whose program it finds on its PATH at start) and what the control plane
checks a session against (docs/channels.md, "Sessions"). Shared by the worker and the daemon,
so the two agree on the names."""

from __future__ import annotations

import os
import shutil
from typing import Mapping

PROGRAMS: Mapping[str, str] = {
    "jupyter": "jupyter-lab",  # JupyterLab's own script (``jupyter`` alone may lack ``lab``)
    "vscode": "code-server",
    "shell": "ttyd",
}
"""Each app's program; the session's command (kliqued/daemon/api/sessions.py ``APPS``) runs it."""

HOW_TO_ENABLE: Mapping[str, str] = {
    "jupyter": "install JupyterLab where the worker finds it (pip install jupyterlab, in the "
    "worker's environment or on its PATH)",
    "vscode": "install code-server on the worker's PATH (https://coder.com/docs/code-server/install)",
    "shell": "install ttyd on the worker's PATH (apt-get install ttyd)",
}
"""What a user or IT does so that a worker can start the app: said where one is missing."""

MAX_APPS = 32
"""A registration lists at most this many apps (a newer worker may know more than these)."""


def detect(path: str | None = None) -> list[str]:
    """The apps whose program is on ``path`` (default: this process's PATH), in name order."""
    search = os.environ.get("PATH", os.defpath) if path is None else path
    return sorted(app for app, prog in PROGRAMS.items() if shutil.which(prog, path=search))


def enable_hint(app: str) -> str:
    return HOW_TO_ENABLE.get(app, f"install {app} on the workers")
