"""What a person does to a task from My work: cancel it, open a running session.

Issue 32: there was no cancel button for one's own or one's team's tasks, and no link to a
running session. Cancelling is ``POST /v1/tasks/{id}/cancel`` run as the signed-in person
through the API's own function (``cancel_as``): the same rights (who may see the task may
cancel it: its user, the admins of its group and the groups above, platform admins; anyone
else gets the API's 404), the same event, with the reason ``from the dashboard``. It is a
form POST, so it carries the session's CSRF value and passes the Origin check as sign-out
does. Opening a session mints the API's one-time link for its owner (``one_time_link``) and
sends the browser there: sessions are served on an origin of their own (docs/channels.md),
and the link sets the session's cookie on that origin, which the dashboard's origin cannot.
"""

from __future__ import annotations

from aiohttp import web

from kliqued.daemon.api import sessions
from kliqued.daemon.api.handlers.sessions import one_time_link
from kliqued.daemon.api.handlers.tasks import cancel_as
from kliqued.daemon.api.request import ctx
from kliqued.daemon.errors import ApiError
from kliqued.daemon.state import history

from . import data, session
from .frame import error, redirect, signed_in, to_signin

REASON = "from the dashboard"
"""The reason a dashboard cancel records: the audit trail tells it from an agent's or the
CLI's (``cancelled by user:alice: from the dashboard``)."""


async def cancel(request: web.Request) -> web.StreamResponse:
    """Cancels a task (``POST /my-work/{id}/cancel``), then back to My work."""
    s, p, why = signed_in(request)
    if s is None or p is None:
        return to_signin(request, why)
    if not session.same_origin(request):
        return error(request, 403, "cancel refused: the form was sent from another site", s, p)
    form = await request.post()
    sent = form.get("csrf")
    if not session.csrf_ok(s, sent if isinstance(sent, str) else None):
        return error(
            request,
            403,
            "cancel refused: the form's csrf value is missing or wrong (reload the page and "
            "try again)",
            s,
            p,
        )
    c = ctx(request)
    if not data.may_open(c.daemon, p, data.BY_SLUG["my-work"]):
        return error(request, 403, f"{p.text} may not cancel tasks", s, p)
    try:
        await cancel_as(c, p, request.match_info["id"], REASON, "api")
    except ApiError as exc:
        return error(request, exc.status, exc.message, s, p)
    back = form.get("back")
    target = back if isinstance(back, str) and back.startswith("/my-work") else "/my-work"
    return redirect(target)


async def open_session(request: web.Request) -> web.StreamResponse:
    """A running session's one-time link, for its owner (``GET /my-work/{id}/session``):
    a 303 to the session's own origin. A navigation, not a form: the page's CSP limits
    where forms may go (``form-action 'self'``), and a link made here goes only to the
    owner's own browser."""
    s, p, why = signed_in(request)
    if s is None or p is None:
        return to_signin(request, why)
    c = ctx(request)
    d = c.daemon
    tid = request.match_info["id"]
    try:
        rec = await history.recall(c.store, d, tid)
        if rec is None or not d.acc().sees_task(p, rec.user, rec.group):
            raise ApiError(404, "not-found", f"no task {tid[:40]}")
        if not sessions.is_session(rec):
            raise ApiError(404, "not-found", f"task {rec.id} is not a session")
        if rec.state == "ended":
            raise ApiError(410, "gone", f"session {rec.id} ended: {sessions.state(rec)}")
        url = one_time_link(c, p, rec)
    except ApiError as exc:
        return error(request, exc.status, exc.message, s, p)
    return redirect(url)
