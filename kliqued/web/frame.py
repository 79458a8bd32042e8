"""What every answer of the dashboard shares: its state in the application (sessions, live
fragments, templates), who is signed in, HTML answers with their security headers, error
pages and redirects.

An error on a page is an HTML page with the API's status and message, never a traceback; a
live fragment or a download gets the message as text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jinja2

from klique_util import fmt
from aiohttp import web

from kliqued.daemon.auth import Principal
from kliqued.daemon.errors import ApiError
from kliqued.daemon.api.request import ctx

from . import data, session
from .advice import AdviceCache, wait
from .fragments import Fragments
from .pending import PendingSignins
from .session import Session, Sessions

HERE = Path(__file__).resolve().parent

LIVE_REFRESH_S = 15.0
"""A live fragment is re-sent at least this often even with no new event (GPU-hours of
running work and budgets move with time)."""

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; "
    "form-action 'self'; base-uri 'none'"
)
"""Scripts only from this daemon (no inline script: chart data travels in JSON blocks);
plotly.js sets inline styles on what it draws."""


@dataclass
class Web:
    """The dashboard's own state in the application: sessions, live fragments, the task
    index, the CIO figures' cache and the templates."""

    sessions: Sessions = field(default_factory=Sessions)
    fragments: Fragments = field(default_factory=Fragments)
    tasks: data.TaskIndex = field(default_factory=data.TaskIndex)
    figures: data.FiguresCache = field(default_factory=data.FiguresCache)
    advice: AdviceCache = field(default_factory=AdviceCache)
    """The advice ``kliqued advise --publish`` left in the daemon's directory (advice.py)."""
    oidc: PendingSignins = field(default_factory=PendingSignins)
    """Sign-ins through an identity provider started and not finished (oidc.py)."""
    env: jinja2.Environment = field(
        default_factory=lambda: jinja2.Environment(
            loader=jinja2.FileSystemLoader(str(HERE / "templates")),
            autoescape=True,
            trim_blocks=True,
            lstrip_blocks=True,
        )
    )

    def __post_init__(self) -> None:
        self.env.filters["when"] = when
        # one number format everywhere, as the CLI prints (klique_util.fmt): no exponent,
        # no trailing .0, three significant digits
        self.env.filters["amount"] = fmt.amount
        # and one money format: to the cent, "< 0.01" for a cost under half a cent
        self.env.filters["money"] = fmt.money
        self.env.filters["wait"] = wait


WEB = web.AppKey("web", Web)


def when(text: str | None) -> str:
    """``2026-12-01T17:31:58.269Z`` as ``2026-12-01 17:31:58``: UTC, to the second."""
    if not text:
        return "–"
    return text.replace("T", " ")[:19]


def state(request: web.Request) -> Web:
    return request.app[WEB]


def redirect(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location, "Cache-Control": "no-store"})


def html(
    request: web.Request, template: str, http_status: int = 200, **values: Any
) -> web.Response:
    text = state(request).env.get_template(template).render(**values)
    resp = web.Response(text=text, status=http_status, content_type="text/html", charset="utf-8")
    resp.headers["Content-Security-Policy"] = CSP
    resp.headers["X-Frame-Options"] = "DENY"  # frame-ancestors' fallback: no session frames it
    resp.headers["Cross-Origin-Opener-Policy"] = "same-origin"
    resp.headers["Cross-Origin-Resource-Policy"] = "same-origin"
    resp.headers["X-Content-Type-Options"] = "nosniff"
    resp.headers["Referrer-Policy"] = "same-origin"
    resp.headers["Cache-Control"] = "no-store"
    return resp


def error(
    request: web.Request,
    status: int,
    message: str,
    s: Session | None = None,
    p: Principal | None = None,
) -> web.Response:
    if request.query.get("live"):
        return web.Response(text=message, status=status, content_type="text/plain")
    return html(
        request, "error.html", status, status=status, message=message, **chrome(request, p, s, None)
    )


def chrome(
    request: web.Request, p: Principal | None, s: Session | None, current: data.Page | None
) -> dict[str, Any]:
    """What every page's frame shows: who is signed in and the pages they may open."""
    c = ctx(request)
    d = c.daemon
    pages = [pg for pg in data.PAGES if p is not None and data.may_open(d, p, pg)]
    return {
        "principal": p,
        "csrf": s.csrf if s is not None else "",
        "pages": pages,
        "current": current,
        "revision": d.estate.revision if d.ready else "",
        "pass_ms": int(max(1.0, c.pass_interval_s) * 1000),
        "refresh_ms": int(LIVE_REFRESH_S * 1000),
    }


def signed_in(request: web.Request) -> tuple[Session | None, Principal | None, str | None]:
    """The session of the request and its principal; a session whose token was revoked or
    expired is closed, and the reason returned."""
    w = state(request)
    sid, s = w.sessions.find(session.cookie_values(request))
    if s is None:
        return None, None, None
    d = ctx(request).daemon
    rec = d.tokens.by_id.get(s.token_id)
    why = "the token was removed" if rec is None else d.tokens.refusal(rec, d.clock.now())
    if why is not None:
        w.sessions.close(sid)
        return None, None, why
    return s, Principal.parse(s.principal, s.token_id), None


def to_signin(request: web.Request, why: str | None = None) -> web.StreamResponse:
    if request.query.get("live"):
        return web.Response(status=401, text="signed out: sign in again", content_type="text/plain")
    target = f"/signin?next={quote(request.path_qs, safe='')}"
    if why:
        target += f"&why={quote(why, safe='')}"
    return redirect(target)


def signed_or_401(request: web.Request, slug: str) -> Principal:
    s, p, _ = signed_in(request)
    if s is None or p is None:
        raise ApiError(401, "unauthenticated", "sign in first")
    if not data.may_open(ctx(request).daemon, p, data.BY_SLUG[slug]):
        raise ApiError(403, "forbidden", f"{p.text} may not read this")
    return p
