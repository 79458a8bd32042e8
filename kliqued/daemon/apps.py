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


def app_of(rec: TaskRecord) -> str | None:
    """The app a session's task runs; None for any other task."""
    if rec.labels.get(CHANNEL_LABEL) != "session":
        return None
    return rec.labels.get(APP_LABEL)


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
