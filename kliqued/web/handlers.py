"""The dashboard's HTTP handlers: sign-in and sign-out, the six pages (each also as its live
fragment), the ledger download, task logs and the static files. ``ROUTES`` is wired into the
daemon's application by ``kliqued.daemon.app``, beside the API's own table.

Every page goes through :func:`_page`: the session (a redirect to the sign-in form without
one, or a 401 for a live fragment), the token behind it (revoked or expired: signed out), the
page's roles (403), then the page's data from :mod:`kliqued.web.data`, which filters exactly as
the API does. An error on a page is an HTML page with the API's status and message, never a
traceback.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import tempfile
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Awaitable, Callable
from urllib.parse import quote, urlsplit

import jinja2
from aiohttp import web

from kliqued.daemon.auth import Principal
from kliqued.daemon.errors import ApiError
from kliqued.daemon.events import KINDS
from kliqued.daemon.handlers.ledger import scope as ledger_scope
from kliqued.daemon.logs import MAX_READ
from kliqued.daemon.request import ctx
from kliqued.daemon.units import iso
from kliqued.ledger import export as ledger_export

from . import data, session
from .session import Session, Sessions

HERE = Path(__file__).resolve().parent
STATIC = HERE / "static"
PLOTLY_JS = Path(str(resources.files("plotly") / "package_data" / "plotly.min.js"))
"""plotly.js as the installed plotly package ships it: served from there, never copied."""

LIVE_REFRESH_S = 15.0
"""A live fragment is re-sent at least this often even with no new event (GPU-hours of
running work and budgets move with time)."""

CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
       "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; "
       "form-action 'self'; base-uri 'none'")
"""Scripts only from this daemon (no inline script: chart data travels in JSON blocks);
plotly.js sets inline styles on what it draws."""


class Fragments:
    """Live fragments being made or just made, by (principal, page, view, event sequence,
    second): a request for one already in the making awaits it instead of rendering again.
    A fragment holds no session value (no CSRF token), so one principal's sessions share."""

    KEEP = 256

    def __init__(self) -> None:
        self._by_key: OrderedDict[Any, asyncio.Future[tuple[int, bytes, dict[str, str]]]] = \
            OrderedDict()

    async def once(self, key: Any, make: Callable[[], Awaitable[web.Response]]
                   ) -> web.Response:
        fut = self._by_key.get(key)
        if fut is None:
            fut = asyncio.get_running_loop().create_future()
            self._by_key[key] = fut
            while len(self._by_key) > self.KEEP:
                self._by_key.popitem(last=False)
            try:
                resp = await make()
            except BaseException:
                self._by_key.pop(key, None)
                fut.cancel()
                raise
            assert isinstance(resp.body, bytes)
            fut.set_result((resp.status, resp.body, dict(resp.headers)))
            return resp
        status, body, headers = await asyncio.shield(fut)
        return web.Response(status=status, body=body, headers=headers)


@dataclass
class Web:
    """The dashboard's own state in the application: sessions, live fragments and the
    templates."""
    sessions: Sessions = field(default_factory=Sessions)
    fragments: Fragments = field(default_factory=Fragments)
    env: jinja2.Environment = field(default_factory=lambda: jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(HERE / "templates")),
        autoescape=True, trim_blocks=True, lstrip_blocks=True))

    def __post_init__(self) -> None:
        self.env.filters["when"] = when


WEB = web.AppKey("web", Web)


def when(text: str | None) -> str:
    """``2026-12-01T17:31:58.269Z`` as ``2026-12-01 17:31:58``: UTC, to the second."""
    if not text:
        return "–"
    return text.replace("T", " ")[:19]


def _web(request: web.Request) -> Web:
    return request.app[WEB]


def _redirect(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location, "Cache-Control": "no-store"})


def _html(request: web.Request, template: str, http_status: int = 200, **values: Any
          ) -> web.Response:
    text = _web(request).env.get_template(template).render(**values)
    resp = web.Response(text=text, status=http_status, content_type="text/html", charset="utf-8")
    resp.headers["Content-Security-Policy"] = CSP
    resp.headers["X-Content-Type-Options"] = "nosniff"
    resp.headers["Referrer-Policy"] = "same-origin"
    resp.headers["Cache-Control"] = "no-store"
    return resp


def _error(request: web.Request, status: int, message: str, s: Session | None = None,
           p: Principal | None = None) -> web.Response:
    if request.query.get("live"):
        return web.Response(text=message, status=status, content_type="text/plain")
    return _html(request, "error.html", status, status=status, message=message,
                 **_chrome(request, p, s, None))


def _chrome(request: web.Request, p: Principal | None, s: Session | None,
            current: data.Page | None) -> dict[str, Any]:
    """What every page's frame shows: who is signed in and the pages they may open."""
    c = ctx(request)
    d = c.daemon
    pages = [pg for pg in data.PAGES if p is not None and data.may_open(d, p, pg)]
    return {"principal": p, "csrf": s.csrf if s is not None else "", "pages": pages,
            "current": current, "revision": d.estate.revision if d.ready else "",
            "pass_ms": int(max(1.0, c.pass_interval_s) * 1000),
            "refresh_ms": int(LIVE_REFRESH_S * 1000)}


def _signed_in(request: web.Request) -> tuple[Session | None, Principal | None, str | None]:
    """The session of the request and its principal; a session whose token was revoked or
    expired is closed, and the reason returned."""
    w = _web(request)
    sid = request.cookies.get(session.COOKIE)
    s = w.sessions.get(sid)
    if s is None:
        return None, None, None
    d = ctx(request).daemon
    rec = d.tokens.by_id.get(s.token_id)
    why = "the token was removed" if rec is None else rec.refusal(d.clock.now())
    if why is not None:
        w.sessions.close(sid)
        return None, None, why
    return s, Principal.parse(s.principal, s.token_id), None


def _to_signin(request: web.Request, why: str | None = None) -> web.StreamResponse:
    if request.query.get("live"):
        return web.Response(status=401, text="signed out: sign in again",
                            content_type="text/plain")
    target = f"/signin?next={quote(request.path_qs, safe='')}"
    if why:
        target += f"&why={quote(why, safe='')}"
    return _redirect(target)


PageFn = Callable[[web.Request, Principal], Awaitable[dict[str, Any]]]


def _page(slug: str, fn: PageFn) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    pg = data.BY_SLUG[slug]

    async def handler(request: web.Request) -> web.StreamResponse:
        s, p, why = _signed_in(request)
        if s is None or p is None:
            return _to_signin(request, why)
        d = ctx(request).daemon
        if not data.may_open(d, p, pg):
            return _error(request, 403, f"{p.text} may not open {pg.title}: it is for "
                          f"{_for_whom(pg)}", s, p)
        live = bool(request.query.get("live"))
        if live and request.query.get("seq") == str(d.seq) and \
                request.query.get("fresh") == "1":
            return web.Response(status=204)  # nothing new since the browser's copy

        async def render(template: str) -> web.Response:
            try:
                values = await fn(request, p)
            except ApiError as exc:
                return _error(request, exc.status, exc.message, s, p)
            values.update(_chrome(request, p, s, pg), page=pg, seq=d.seq,
                          now=iso(d.clock.now()))
            resp = _html(request, template, **values)
            resp.headers["X-Klique-Seq"] = str(values["seq"])
            return resp
        if not live:
            return await render(f"{slug}.html")
        # Browsers of one principal on one view after the same event get one rendering
        # (50 dashboards open would otherwise render 50 times at once).
        key = (p.text, slug, tuple(sorted((k, v) for k, v in request.query.items()
                                          if k not in ("live", "seq", "fresh"))),
               d.seq, int(time.monotonic()))
        return await _web(request).fragments.once(key, lambda: render(f"live/{slug}.html"))
    handler.__name__ = f"page_{slug.replace('-', '_')}"
    return handler


def _for_whom(pg: data.Page) -> str:
    names = {"admin": "admins", "finance": "finance", "planner": "planners",
             "user": "users"}
    text = ", ".join(names[r] for r in pg.roles)
    return text + (" (users: the admins of a group)" if pg.slug == "usage" else "")


# --------------------------------------------------------------------------- sign-in
def _next(raw: str | None) -> str:
    """Only a path of this site: an open redirect would make the form a phishing aid."""
    if not raw or not raw.startswith("/") or raw.startswith("//") or "\\" in raw:
        return "/"
    parts = urlsplit(raw)
    return raw if not parts.scheme and not parts.netloc else "/"


async def signin_form(request: web.Request) -> web.StreamResponse:
    s, p, _ = _signed_in(request)
    if s is not None:
        return _redirect(_next(request.query.get("next")))
    return _html(request, "signin.html", next=_next(request.query.get("next")),
                 why=request.query.get("why"), error=None,
                 **_chrome(request, None, None, None))


async def signin(request: web.Request) -> web.StreamResponse:
    """The token once (form POST), then a session cookie."""
    if not session.same_origin(request):
        return _error(request, 403, "sign-in refused: the form was sent from another site")
    form = await request.post()
    token = str(form.get("token") or "").strip()
    target = _next(str(form.get("next") or ""))
    d = ctx(request).daemon
    error = None
    p = None
    if not token:
        error = "token: paste your API token (kliqued token create gives one)"
    elif not (token.isascii() and token.isprintable()):
        error = "token: a token is printable ASCII; this is not one"
    else:
        try:
            p = d.tokens.authenticate(f"Bearer {token}", d.clock.now())
        except ApiError as exc:
            error = f"token: {exc.message}"
    if p is not None and p.is_worker:
        error, p = "token: a worker token cannot sign in; use a person's token", None
    if p is None or p.token_id is None:
        return _html(request, "signin.html", 401, next=target, why=None, error=error,
                     **_chrome(request, None, None, None))
    w = _web(request)
    sid, _ = w.sessions.open(p.token_id, p.text)
    resp = _redirect(target if target != "/" else f"/{_home(d, p)}")
    session.set_cookie(request, resp, sid, w.sessions.ttl_s)
    return resp


def _home(d: Any, p: Principal) -> str:
    """A developer lands on My work, everyone else on Orchestration."""
    return "my-work" if p.is_user and not d.acc().admin_of(p.name) else "orchestration"


async def signout(request: web.Request) -> web.StreamResponse:
    s, p, _ = _signed_in(request)
    if not session.same_origin(request):
        return _error(request, 403, "sign-out refused: the form was sent from another site",
                      s, p)
    form = await request.post()
    if s is not None and not session.csrf_ok(s, form.get("csrf")):  # type: ignore[arg-type]
        return _error(request, 403, "sign-out refused: the form's csrf value is missing or "
                      "wrong (reload the page and try again)", s, p)
    _web(request).sessions.close(request.cookies.get(session.COOKIE))
    resp = _redirect("/signin")
    session.clear_cookie(request, resp)
    return resp


async def root(request: web.Request) -> web.StreamResponse:
    s, p, why = _signed_in(request)
    if s is None or p is None:
        return _to_signin(request, why)
    return _redirect(f"/{_home(ctx(request).daemon, p)}")


# --------------------------------------------------------------------------- pages
async def orchestration(request: web.Request, p: Principal) -> dict[str, Any]:
    c = ctx(request)
    d = c.daemon
    window = request.query.get("window") or "1h"
    if window not in data.WINDOWS:
        raise ApiError(400, "invalid-request",
                       f"window must be one of {', '.join(data.WINDOWS)}, found {window[:20]!r}")
    pools = data.pools(d, p)
    chart = await data.pool_use(c.store, [r["name"] for r in pools], d.clock.now(),
                                data.WINDOWS[window])
    events = await data.events(d, c.store, p, limit=30)
    return {"pools": pools, "chart": chart, "window": window, "windows": list(data.WINDOWS),
            "events": events, "engine": c.daemon.st().enabled}


async def policy(request: web.Request, p: Principal) -> dict[str, Any]:
    d = ctx(request).daemon
    q = (request.query.get("q") or "").strip()[:100]
    pols, matched = data.policies(d, p, q or None)
    queues, waiting = data.queues(d, p, q_text=q or None)
    return {"policies": pols, "matched": matched, "q": q, "queues": queues,
            "waiting": waiting,
            "alerts": [dict(a, policy=r["name"]) for r in pols if r["budget"]
                       for a in r["budget"]["alerts"]]}


async def my_work(request: web.Request, p: Principal) -> dict[str, Any]:
    d = ctx(request).daemon
    state = request.query.get("state") or None
    states = ("queued", "placed", "running", "ended")
    if state is not None and state not in states:
        raise ApiError(400, "invalid-request",
                       f"state must be one of {', '.join(states)}, found {state[:20]!r}")
    admin_of = sorted(d.acc().admin_of(p.name)) if p.is_user else []
    return {"tasks": data.tasks(d, p, state=state), "state": state, "states": states,
            "admin_of": admin_of}


def _day(request: web.Request, name: str, default: dt.date) -> dt.date:
    raw = request.query.get(name)
    if not raw:
        return default
    try:
        return dt.date.fromisoformat(raw)
    except ValueError:
        raise ApiError(400, "invalid-request",
                       f"{name} must be a date, YYYY-MM-DD; found {raw[:30]!r}") from None


def _period(request: web.Request) -> tuple[dt.date, dt.date, int, int]:
    """``from`` and ``to`` (inclusive days, UTC); the current month by default."""
    today = dt.datetime.fromtimestamp(ctx(request).daemon.clock.now() / 1000, dt.timezone.utc
                                      ).date()
    start = _day(request, "from", today.replace(day=1))
    end = _day(request, "to", today)
    if end < start:
        raise ApiError(400, "invalid-request", f"to ({end}) is before from ({start})")
    if end >= dt.date(9999, 12, 31):
        raise ApiError(400, "invalid-request", f"to must be before 9999-12-31, found {end}")
    ms = [int(dt.datetime(x.year, x.month, x.day, tzinfo=dt.timezone.utc).timestamp() * 1000)
          for x in (start, end + dt.timedelta(days=1))]
    return start, end, ms[0], ms[1]


async def usage(request: web.Request, p: Principal) -> dict[str, Any]:
    c = ctx(request)
    groups = ledger_scope(c.daemon, p)
    start, end, a, b = _period(request)
    by = request.query.get("by") or "group"
    if by not in ledger_export.SUMMARY_DIMENSIONS:
        raise ApiError(400, "invalid-request", f"by must be one of "
                       f"{', '.join(ledger_export.SUMMARY_DIMENSIONS)}, found {by[:20]!r}")
    tables = await data.usage(c.store, groups, a, b)
    total = sum(float(r["gpu_hours"]) for r in tables["group"])
    cost = sum(float(r["cost"]) for r in tables["group"])
    return {"this_from": start.isoformat(), "this_to": end.isoformat(), "by": by,
            "tables": tables,
            "chart": data.usage_chart(tables[by], by), "scope": groups,
            "total_hours": round(total, 6), "total_cost": round(cost, 6),
            "currency": c.daemon.idx().estate.settings.currency,
            "cloud": data.cloud(c.daemon),
            "dimensions": ledger_export.SUMMARY_DIMENSIONS}


async def audit(request: web.Request, p: Principal) -> dict[str, Any]:
    c = ctx(request)
    q = (request.query.get("q") or "").strip()[:200]
    kind = request.query.get("kind") or None
    if kind is not None and kind not in KINDS:
        raise ApiError(400, "invalid-request", f"kind: no event kind {kind[:40]!r}")
    events = await data.events(c.daemon, c.store, p, limit=200, search=q or None, kind=kind)
    return {"events": events, "q": q, "kind": kind, "kinds": sorted(KINDS)}


async def estate(request: web.Request, p: Principal) -> dict[str, Any]:
    c = ctx(request)
    return {"estate": data.estate(c.daemon), "revisions": await data.revisions(c.store),
            "plan": await data.last_plan(c.daemon, c.store)}


# --------------------------------------------------------------------------- downloads
def _signed_or_401(request: web.Request, slug: str) -> Principal:
    s, p, _ = _signed_in(request)
    if s is None or p is None:
        raise ApiError(401, "unauthenticated", "sign in first")
    if not data.may_open(ctx(request).daemon, p, data.BY_SLUG[slug]):
        raise ApiError(403, "forbidden", f"{p.text} may not read this")
    return p


async def export(request: web.Request) -> web.StreamResponse:
    """The ledger rows of the usage page's period: CSV (the API's export), or Parquet (the
    CLI's conversion of that CSV, made here in a private temporary directory)."""
    try:
        p = _signed_or_401(request, "usage")
        c = ctx(request)
        groups = ledger_scope(c.daemon, p)
        start, end, a, b = _period(request)
    except ApiError as exc:
        return _error(request, exc.status, exc.message)
    fmt = request.query.get("format") or "csv"
    if fmt not in ("csv", "parquet"):
        return _error(request, 400, f"format must be csv or parquet, found {fmt[:20]!r}")
    name = f"klique-usage-{start}-{end}.{fmt}"
    loop = asyncio.get_running_loop()
    cur = c.store.conn.cursor()
    try:
        gen = ledger_export.export_csv(cur, a, b, groups=groups)
        if fmt == "csv":
            resp = web.StreamResponse(headers={
                "Content-Type": "text/csv; charset=utf-8",
                "Content-Disposition": f'attachment; filename="{name}"'})
            await resp.prepare(request)
            while (chunk := await loop.run_in_executor(None, next, gen, None)) is not None:
                await resp.write(chunk.encode("utf-8"))
            await resp.write_eof()
            return resp
        with tempfile.TemporaryDirectory(prefix="klique-export-") as tmp:
            csv_path, pq_path = os.path.join(tmp, "u.csv"), os.path.join(tmp, "u.parquet")

            def write() -> bytes:
                with open(csv_path, "w", encoding="utf-8") as fh:
                    for chunk in gen:
                        fh.write(chunk)
                ledger_export.csv_to_parquet(csv_path, pq_path)
                return Path(pq_path).read_bytes()
            body = await loop.run_in_executor(None, write)
        return web.Response(body=body, headers={
            "Content-Type": "application/vnd.apache.parquet",
            "Content-Disposition": f'attachment; filename="{name}"'})
    finally:
        cur.close()


async def task_log(request: web.Request) -> web.StreamResponse:
    """A task's log (its newest attempt), for who may see the task (``GET
    /v1/tasks/{id}/log``'s rule); another user's task is a 404, as in the API."""
    try:
        p = _signed_or_401(request, "my-work")
    except ApiError as exc:
        return _error(request, exc.status, exc.message)
    c = ctx(request)
    d = c.daemon
    rec = d.records.get(request.match_info["id"])
    if rec is None or not d.acc().sees_task(p, rec.user, rec.group):
        return _error(request, 404, f"no task {request.match_info['id'][:40]}")
    if rec.epoch == 0:
        text = b"(no log: the task has not run)"
    else:
        size = (await c.logs.read(rec.id, rec.epoch, 0, 1))[1]
        start = max(0, size - MAX_READ)
        text, _ = await c.logs.read(rec.id, rec.epoch, start, MAX_READ)
    return web.Response(body=text, content_type="text/plain", charset="utf-8",
                        headers={"X-Content-Type-Options": "nosniff",
                                 "Cache-Control": "no-store"})


# --------------------------------------------------------------------------- static
STATIC_FILES = {"app.js": (STATIC / "app.js", "application/javascript"),
                "app.css": (STATIC / "app.css", "text/css"),
                "plotly.min.js": (PLOTLY_JS, "application/javascript")}


async def static(request: web.Request) -> web.StreamResponse:
    entry = STATIC_FILES.get(request.match_info["name"])
    if entry is None:
        raise ApiError(404, "not-found", f"no static file {request.match_info['name'][:40]}")
    path, ctype = entry
    return web.FileResponse(path, headers={"Content-Type": ctype,
                                           "Cache-Control": "public, max-age=3600",
                                           "X-Content-Type-Options": "nosniff"})


ROUTES: list[tuple[str, str, Callable[[web.Request], Awaitable[web.StreamResponse]]]] = [
    ("GET", "/", root),
    ("GET", "/signin", signin_form),
    ("POST", "/signin", signin),
    ("POST", "/signout", signout),
    ("GET", "/orchestration", _page("orchestration", orchestration)),
    ("GET", "/policy", _page("policy", policy)),
    ("GET", "/my-work", _page("my-work", my_work)),
    ("GET", "/my-work/{id}/log", task_log),
    ("GET", "/usage", _page("usage", usage)),
    ("GET", "/usage/export", export),
    ("GET", "/audit", _page("audit", audit)),
    ("GET", "/estate", _page("estate", estate)),
    ("GET", "/static/{name}", static),
]
"""The dashboard's routes: served by the daemon's application outside ``/v1``, with their own
session check instead of the API's bearer token."""


def install(app: web.Application) -> None:
    """Adds the dashboard's routes and state to the daemon's application."""
    app[WEB] = Web()
    for method, path, handler in ROUTES:
        if method == "GET":
            app.router.add_get(path, handler)
        else:
            app.router.add_route(method, path, handler)
