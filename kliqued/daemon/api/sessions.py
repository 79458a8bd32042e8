"""Sessions (issue 14, item 4): an interactive server (JupyterLab, VS Code, a shell) run as a
task and reached through the control plane (docs/channels.md, "Sessions").

A session *is* a task: sent as its user with the label ``klique.channel: session`` (set here
and nowhere else: ``submission``; when tasks get a ``channel`` field of their own, this is
the call site that passes it), its app in ``klique.session``, and its idle limits in the
``idle.*`` labels the worker enforces (workers/idle.py). Those limits are the profile's
(``idle:`` in the estate, IT's ceiling), lowered where the user asked for less; a request
for more is refused. Nothing else is stored: its state is its task's.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

from compiler.compiled import CIdle
from compiler.units import parse_duration
from klique_util.units import duration_str

from kliqued.daemon.apps import APP_LABEL, CHANNEL_LABEL
from kliqued.daemon.errors import ApiError
from kliqued.daemon.state.channels import Channel
from kliqued.daemon.records import TaskRecord
from kliqued.daemon.state.submission import Submission
from kliqued.daemon.api.views import end_text

CHANNEL: Channel = "session"
KINDS = ("wall", "cpu", "gpu", "network")
PREFIX = "/sessions/"


def _invalid(field: str, message: str) -> ApiError:
    return ApiError(422, "invalid-field", f"{field}: {message}", {"field": field})


def idle_labels(
    profile: str, ceiling: CIdle | None, asked: dict[str, Any] | None
) -> dict[str, str]:
    """The session's idle limits as the worker's ``idle.<kind>`` labels: the profile's,
    each lowered to what the user asked; a 422 naming ``idle.<kind>`` for a value that is no
    duration or is above the profile's."""
    out: dict[str, str] = {}
    asked = asked or {}
    for kind in KINDS:
        limit = getattr(ceiling, f"{kind}_s") if ceiling is not None else None
        value = asked.get(kind)
        if value is not None:
            try:
                seconds = parse_duration(value)
            except ValueError as exc:
                raise _invalid(f"idle.{kind}", str(exc)) from None
            if seconds <= 0:
                raise _invalid(f"idle.{kind}", "an idle limit must be more than 0")
            if limit is not None and seconds > limit:
                raise _invalid(
                    f"idle.{kind}",
                    f"{duration_str(seconds)} is more than the "
                    f"{duration_str(limit)} that profile {profile} allows: a "
                    "session may lower its idle limits, never raise them",
                )
            limit = seconds
        if limit is not None:
            out[f"idle.{kind}"] = duration_str(limit)
    return out


def submission(sub: Submission, app: str, idle: dict[str, str]) -> Submission:
    """The task a session is (``sub``, checked by ``from_body`` with the channel
    ``session``), labelled: the one place that names the session's labels."""
    return replace(sub, labels={CHANNEL_LABEL: CHANNEL, APP_LABEL: app, **idle})


def is_session(rec: TaskRecord) -> bool:
    return rec.labels.get(CHANNEL_LABEL) == CHANNEL


def state(rec: TaskRecord) -> str:
    """``queued``, ``starting`` (placed, its app not started yet), ``running``, or how it
    ended: ``stopped: idle (cpu 30m)``, ``cancelled by user:alice``, ``failed: exit code 1``."""
    if rec.state == "queued":
        return "queued"
    if rec.state != "ended":
        return "running" if rec.started_at is not None else "starting"
    reason = rec.end_reason or ""
    return reason if reason.startswith("stopped: idle") else end_text(rec)


def view(rec: TaskRecord, url: str, connected: bool) -> dict[str, Any]:
    """``url``: where the session is served (``SessionOrigin.url``), never the control
    plane's own origin."""
    idle = {k[5:]: v for k, v in rec.labels.items() if k.startswith("idle.")}
    return {
        "id": rec.id,
        "user": rec.user,
        "resource": rec.resource,
        "app": rec.labels.get(APP_LABEL),
        "state": state(rec),
        "url": url,
        "idle": idle,
        "connected": connected,
        "task": rec.id,
    }


# reaching a session from a browser --------------------------------------------------------
LINK_TTL_S = 120.0
COOKIE_TTL_S = 12 * 3600.0
"""A session's browser cookie lasts a working day at most, as the dashboard's does; the
token that asked for its link may end it sooner (its expiry, a revocation)."""
COOKIE = "klique_app_session"
"""Not the dashboard's ``klique_session`` (kliqued/web/session.py); both start with
``klique_``, which the sessions' listener never passes to an app nor lets an app set
(session_origin.py)."""


@dataclass(frozen=True)
class Pass:
    task: str
    user: str
    token_id: str
    """The token that asked for the link: the cookie is worth nothing once it is revoked or
    expired (checked at every request, ``holder``)."""
    expires: float  # monotonic


class Passes:
    """One-time links and the cookies they turn into, in memory (a restarted daemon asks for
    a new link): a browser cannot send a bearer token, so ``kliqued session open`` (``POST
    /v1/sessions/{id}/link``) gives a link valid once for two minutes; following it sets a
    cookie bound to that session, user and token, valid while the session runs, the token
    works and ``COOKIE_TTL_S`` (or the token's expiry, if sooner) has not passed."""

    def __init__(self) -> None:
        self.tickets: dict[str, Pass] = {}
        self.cookies: dict[str, Pass] = {}

    def link(self, task: str, user: str, token_id: str) -> str:
        self._prune()
        ticket = secrets.token_urlsafe(32)
        self.tickets[ticket] = Pass(task, user, token_id, time.monotonic() + LINK_TTL_S)
        return ticket

    def redeem(
        self, ticket: str, task: str, life_s: Callable[[str], float | None]
    ) -> tuple[str, int] | None:
        """A new cookie for a valid ticket of ``task`` (the ticket is spent) and its max age
        in seconds; else None. ``life_s(token_id)`` is how long the link's token still works
        (None: no expiry; 0 or less: it no longer does)."""
        p = self.tickets.get(ticket)
        if p is None or p.task != task or p.expires < time.monotonic():
            return None
        del self.tickets[ticket]
        left = life_s(p.token_id)
        ttl = COOKIE_TTL_S if left is None else min(COOKIE_TTL_S, left)
        if ttl < 1:
            return None
        cookie = secrets.token_urlsafe(32)
        self.cookies[cookie] = Pass(task, p.user, p.token_id, time.monotonic() + ttl)
        return cookie, int(ttl)

    def holder(self, cookies: list[str], task: str, usable: Callable[[str], bool]) -> str | None:
        """The user a cookie among ``cookies`` (every value the browser sent) lets into
        ``task``: bound to it, not expired, its token still ``usable``; else None. A cookie
        whose token no longer works is forgotten."""
        now = time.monotonic()
        for cookie in cookies:
            p = self.cookies.get(cookie)
            if p is None or p.task != task:
                continue
            if p.expires <= now or not usable(p.token_id):
                del self.cookies[cookie]
                continue
            return p.user
        return None

    def forget(self, task: str) -> None:
        """The session ended: its links and cookies are worth nothing any more."""
        for table in (self.tickets, self.cookies):
            for key in [k for k, p in table.items() if p.task == task]:
                del table[key]

    def drop_ended(self, ended: Callable[[str], bool]) -> None:
        """Forgets the links and cookies of every session ``ended`` says has ended (those
        that ended with nobody opening them again), and expired cookies, so they cannot pile
        up."""
        for task in {p.task for t in (self.tickets, self.cookies) for p in t.values()}:
            if ended(task):
                self.forget(task)
        now = time.monotonic()
        for key in [k for k, p in self.cookies.items() if p.expires <= now]:
            del self.cookies[key]

    def _prune(self) -> None:
        now = time.monotonic()
        for key in [k for k, p in self.tickets.items() if p.expires < now]:
            del self.tickets[key]
