"""Which worker can start which session (issue 32): a session's task names its app in its
``klique.session`` label, and a worker says at registration which apps it can start
(``WorkerInfo.apps``: the apps whose program it found at its start). A worker that did not
say (older than the field, or an executor whose tasks run where it cannot look) is taken to
start any; one that said is never leased a session of an app it lacks, so the session waits,
with that reason, for a worker that has it, rather than failing with ``exit code 127``."""

from __future__ import annotations

from typing import Iterable

from klique_util.session_apps import enable_hint

from kliqued.daemon.leases import WorkerInfo
from kliqued.daemon.records import TaskRecord

CHANNEL_LABEL = "klique.channel"
APP_LABEL = "klique.session"

APPS: dict[str, list[str]] = {
    # each listens on 127.0.0.1:$KLIQUE_SESSION_PORT under the path $KLIQUE_SESSION_PREFIX
    # (the worker sets both); the control plane authenticates, so the app asks for nothing
    "jupyter": [
        "sh",
        "-c",
        "exec jupyter lab --no-browser --ip=127.0.0.1 "
        '--port="$KLIQUE_SESSION_PORT" --ServerApp.base_url="$KLIQUE_SESSION_PREFIX" '
        "--IdentityProvider.token= --ServerApp.password= "
        "--ServerApp.allow_origin='*' --ServerApp.allow_remote_access=True "
        # a container's tasks often run as root; only the tunnel reaches it
        "--allow-root",
    ],
    "vscode": [
        "sh",
        "-c",
        'exec code-server --bind-addr "127.0.0.1:$KLIQUE_SESSION_PORT" '
        "--auth none --disable-telemetry",
    ],
    "shell": [
        "sh",
        "-c",
        'exec ttyd --interface 127.0.0.1 --port "$KLIQUE_SESSION_PORT" '
        '--base-path "${KLIQUE_SESSION_PREFIX%/}" --writable bash -l',
    ],
}
"""Each app's command (kliqued/daemon/api/sessions.py starts a session with it); its program
is ``klique_util.session_apps.PROGRAMS``'s."""


def app_of(rec: TaskRecord) -> str | None:
    """The app whose program a session's task needs; None for any other task, and for a
    session running its own command (``-- CMD...``: its program is its user's affair)."""
    if rec.labels.get(CHANNEL_LABEL) != "session":
        return None
    app = rec.labels.get(APP_LABEL)
    return app if app is not None and rec.command == APPS.get(app) else None


def can_start(w: WorkerInfo, rec: TaskRecord) -> bool:
    """Whether ``w`` may be leased ``rec``: not a session, or ``w`` has its app (or did not
    say which apps it has)."""
    app = app_of(rec)
    return app is None or w.apps is None or app in w.apps


def missing_everywhere(app: str, workers: Iterable[WorkerInfo]) -> bool:
    """Whether ``workers`` (a pool's known ones, live or lost) all said which apps they have
    and none has ``app``; False with no worker at all (the first may have it)."""
    seen = False
    for w in workers:
        if w.apps is None or app in w.apps:
            return False
        seen = True
    return seen


def lacking(app: str, pool: str, live: list[WorkerInfo]) -> str:
    """Why a session placed on ``pool`` waits when its live workers all lack ``app``."""
    has = "; ".join(f"{w.id}: {', '.join(w.apps or []) or 'none'}" for w in live)
    return (
        f"placed on {pool}, not started: no live worker of {pool} can start {app} "
        f"(their apps: {has}); {enable_hint(app)}, then restart the worker"
    )
