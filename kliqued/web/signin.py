"""Sign-in (the token once, then a session cookie), sign-out, and ``/``."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from kliqued.daemon.auth import Principal
from kliqued.daemon.errors import ApiError
from kliqued.daemon.api.request import ctx

from . import session
from .frame import chrome, error, html, redirect, signed_in, state, to_signin


def _next(raw: str | None) -> str:
    """Only a path of this site: an open redirect would make the form a phishing aid."""
    if not raw or not raw.startswith("/") or raw.startswith("//") or "\\" in raw:
        return "/"
    parts = urlsplit(raw)
    return raw if not parts.scheme and not parts.netloc else "/"


async def signin_form(request: web.Request) -> web.StreamResponse:
    s, p, _ = signed_in(request)
    if s is not None:
        return redirect(_next(request.query.get("next")))
    return html(
        request,
        "signin.html",
        next=_next(request.query.get("next")),
        why=request.query.get("why"),
        error=None,
        providers=_providers(request),
        **chrome(request, None, None, None),
    )


def _providers(request: web.Request) -> list[str]:
    """The identity providers of the running estate (settings.identity): one button each."""
    d = ctx(request).daemon
    ident = d.idx().estate.settings.identity if d.ready else None
    return [p.name for p in ident.providers] if ident else []


async def signin(request: web.Request) -> web.StreamResponse:
    """The token once (form POST), then a session cookie."""
    if not session.same_origin(request):
        return error(request, 403, "sign-in refused: the form was sent from another site")
    form = await request.post()
    token = str(form.get("token") or "").strip()
    target = _next(str(form.get("next") or ""))
    d = ctx(request).daemon
    problem = None
    p = None
    if not token:
        problem = "token: paste your API token (kliqued token create gives one)"
    elif not (token.isascii() and token.isprintable()):
        problem = "token: a token is printable ASCII; this is not one"
    else:
        try:
            p = d.tokens.authenticate(f"Bearer {token}", d.clock.now())
        except ApiError as exc:
            problem = f"token: {exc.message}"
    if p is not None and p.is_worker:
        problem, p = "token: a worker token cannot sign in; use a person's token", None
    if p is None or p.token_id is None:
        return html(
            request,
            "signin.html",
            401,
            next=target,
            why=None,
            error=problem,
            providers=_providers(request),
            **chrome(request, None, None, None),
        )
    w = state(request)
    sid, s = w.sessions.open(p.token_id, p.text, d.tokens.seconds_left(p.token_id, d.clock.now()))
    resp = redirect(target if target != "/" else f"/{_home(d, p)}")
    session.set_cookie(request, resp, sid, s)
    return resp


def _home(d: Any, p: Principal) -> str:
    """A developer lands on My work, everyone else on Orchestration."""
    return "my-work" if p.is_user and not d.acc().admin_of(p.name) else "orchestration"


async def signout(request: web.Request) -> web.StreamResponse:
    s, p, _ = signed_in(request)
    if not session.same_origin(request):
        return error(request, 403, "sign-out refused: the form was sent from another site", s, p)
    form = await request.post()
    if s is not None and not session.csrf_ok(s, form.get("csrf")):  # type: ignore[arg-type]
        return error(
            request,
            403,
            "sign-out refused: the form's csrf value is missing or "
            "wrong (reload the page and try again)",
            s,
            p,
        )
    for sid in session.cookie_values(request):
        state(request).sessions.close(sid)
    resp = redirect("/signin")
    session.clear_cookie(request, resp)
    return resp


async def root(request: web.Request) -> web.StreamResponse:
    s, p, why = signed_in(request)
    if s is None or p is None:
        return to_signin(request, why)
    return redirect(f"/{_home(ctx(request).daemon, p)}")
