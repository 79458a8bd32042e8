"""The six pages, each also as its live fragment.

Every page goes through :func:`page`: the session (a redirect to the sign-in form without
one, or a 401 for a live fragment), the token behind it (revoked or expired: signed out), the
page's roles (403), then the page's data from :mod:`kliqued.web.data`, which filters exactly as
the API does. A live fragment is a 204 while no event happened since the browser's copy, and
one rendering is shared by the browsers that ask for it at once.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
import time
from urllib.parse import urlencode
from typing import Any, Awaitable, Callable

from aiohttp import web

from klique_util import fmt
from klique_util.excerpt import excerpt
from kliqued.daemon.auth import Principal
from kliqued.daemon.errors import ApiError
from kliqued.daemon.events import KINDS
from kliqued.daemon.api import sessions
from kliqued.daemon.api.handlers.ledger import scope as ledger_scope
from kliqued.daemon.api.handlers.sessions import origin_url
from kliqued.daemon.api.request import ctx
from kliqued.daemon.units import iso, parse_iso
from kliqued.ledger import export as ledger_export

from . import advice, data
from .frame import chrome, error, html, signed_in, state, to_signin


PageFn = Callable[[web.Request, Principal], Awaitable[dict[str, Any]]]


def page(slug: str, fn: PageFn) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    pg = data.BY_SLUG[slug]

    async def handler(request: web.Request) -> web.StreamResponse:
        s, p, why = signed_in(request)
        if s is None or p is None:
            return to_signin(request, why)
        d = ctx(request).daemon
        if not data.may_open(d, p, pg):
            return error(
                request, 403, f"{p.text} may not open {pg.title}: it is for {_for_whom(pg)}", s, p
            )
        live = bool(request.query.get("live"))
        if live and request.query.get("seq") == str(d.seq) and request.query.get("fresh") == "1":
            return web.Response(status=204)  # nothing new since the browser's copy

        async def render(template: str) -> web.Response:
            seq = d.seq  # before reading: a later event makes the browser ask again
            try:
                values = await fn(request, p)
            except ApiError as exc:
                return error(request, exc.status, exc.message, s, p)
            values.update(chrome(request, p, s, pg), page=pg, seq=seq, now=iso(d.clock.now()))
            if live:  # shared by the principal's sessions: no session value (app.js fills it)
                values["csrf"] = ""
            resp = html(request, template, **values)
            resp.headers["X-Klique-Seq"] = str(seq)
            return resp

        if not live:
            return await render(f"{slug}.html")
        # Browsers of one principal on one view after the same event get one rendering
        # (50 dashboards open would otherwise render 50 times at once).
        key = (
            p.text,
            slug,
            tuple(
                sorted(
                    (k, v) for k, v in request.query.items() if k not in ("live", "seq", "fresh")
                )
            ),
            d.seq,
            int(time.monotonic()),
        )
        return await state(request).fragments.once(key, lambda: render(f"live/{slug}.html"))

    handler.__name__ = f"page_{slug.replace('-', '_')}"
    return handler


def _for_whom(pg: data.Page) -> str:
    names = {"admin": "admins", "finance": "finance", "planner": "planners", "user": "users"}
    text = ", ".join(names[r] for r in pg.roles)
    return text + (" (users: the admins of a group)" if pg.slug == "usage" else "")


async def orchestration(request: web.Request, p: Principal) -> dict[str, Any]:
    c = ctx(request)
    d = c.daemon
    window = request.query.get("window") or "1h"
    if window not in data.WINDOWS:
        raise ApiError(
            400,
            "invalid-request",
            f"window must be one of {', '.join(data.WINDOWS)}, found {excerpt(window)}",
        )
    pools = data.pools(d, p)
    chart = await data.pool_use(
        c.store, [r["name"] for r in pools], d.clock.now(), data.WINDOWS[window]
    )
    events = await data.events(d, c.store, p, limit=30)
    return {
        "pools": pools,
        "chart": chart,
        "window": window,
        "windows": list(data.WINDOWS),
        "events": events,
        "engine": c.daemon.st().enabled,
    }


async def policy(request: web.Request, p: Principal) -> dict[str, Any]:
    c = ctx(request)
    d = c.daemon
    q = (request.query.get("q") or "").strip()[:100]
    pols, matched = data.policies(d, p, q or None)
    queues, waiting = data.queues(d, p, q_text=q or None)
    return {
        "policies": pols,
        "matched": matched,
        "q": q,
        "queues": queues,
        "waiting": waiting,
        "fair": d.idx().fair,
        "advice": advice.shown(
            d, p, state(request).advice, advice.path_of(c.store.path), d.clock.now()
        ),
        "alerts": [
            dict(a, policy=r["name"])
            for r in pols
            if r["budget"]
            for a in r["budget"].get("alerts", [])
        ],
        # budget alerts are for those who can act on them (Access.fixes_budget)
        "alerts_shown": any(r["budget"] and "alerts" in r["budget"] for r in pols),
    }


async def my_work(request: web.Request, p: Principal) -> dict[str, Any]:
    c = ctx(request)
    d = c.daemon
    wanted = request.query.get("state") or None
    states = ("queued", "placed", "running", "ended")
    if wanted is not None and wanted not in states:
        raise ApiError(
            400,
            "invalid-request",
            f"state must be one of {', '.join(states)}, found {excerpt(wanted)}",
        )
    admin_of = sorted(d.acc().admin_of(p.name)) if p.is_user else []
    tasks = await data.tasks_with_history(d, c.store, p, state(request).tasks, state=wanted)
    for t in tasks:
        if t["labels"].get(sessions.CHANNEL_LABEL) == sessions.CHANNEL:
            t["session"] = {
                "url": origin_url(c, t["id"]),
                "app": t["labels"].get(sessions.APP_LABEL),
                "mine": p.is_user and p.name == t["user"],
            }
    return {
        "tasks": tasks,
        "back": "/my-work" + (f"?state={wanted}" if wanted else ""),
        "state": wanted,
        "states": states,
        "admin_of": admin_of,
    }


def day(request: web.Request, name: str, default: dt.date) -> dt.date:
    raw = request.query.get(name)
    if not raw:
        return default
    try:
        return dt.date.fromisoformat(raw)
    except ValueError:
        raise ApiError(
            400, "invalid-request", f"{name} must be a date, YYYY-MM-DD; found {excerpt(raw)}"
        ) from None


def period(request: web.Request) -> tuple[dt.date, dt.date, int, int]:
    """``from`` and ``to`` (inclusive days, UTC); the current month by default."""
    today = dt.datetime.fromtimestamp(
        ctx(request).daemon.clock.now() / 1000, dt.timezone.utc
    ).date()
    start = day(request, "from", today.replace(day=1))
    end = day(request, "to", today)
    if end < start:
        raise ApiError(400, "invalid-request", f"to ({end}) is before from ({start})")
    if end >= dt.date(9999, 12, 31):
        raise ApiError(400, "invalid-request", f"to must be before 9999-12-31, found {end}")
    ms = [
        int(dt.datetime(x.year, x.month, x.day, tzinfo=dt.timezone.utc).timestamp() * 1000)
        for x in (start, end + dt.timedelta(days=1))
    ]
    return start, end, ms[0], ms[1]


async def usage(request: web.Request, p: Principal) -> dict[str, Any]:
    c = ctx(request)
    groups = ledger_scope(c.daemon, p)
    start, end, a, b = period(request)
    by = request.query.get("by") or "group"
    if by not in ledger_export.SUMMARY_DIMENSIONS:
        raise ApiError(
            400,
            "invalid-request",
            f"by must be one of {', '.join(ledger_export.SUMMARY_DIMENSIONS)}, found {excerpt(by)}",
        )
    rows = await data.usage(c.store, groups, a, b, by)
    now = c.daemon.clock.now()
    # a page opened shows figures at most a minute old; its live refresh may show older
    # ones while new ones are computed (FiguresCache)
    figures = await state(request).figures.get(
        c.store, groups, start, now, fresh=not request.query.get("live")
    )
    total = sum((Decimal(r["gpu_hours"]) for r in rows), Decimal(0))
    cost = sum((Decimal(r["cost"]) for r in rows), Decimal(0))
    return {
        "this_from": start.isoformat(),
        "this_to": end.isoformat(),
        "by": by,
        "rows": rows,
        "chart": data.usage_chart(rows, by),
        "scope": groups,
        "total_hours": total,
        "total_cost": cost,
        "currency": c.daemon.idx().estate.settings.currency,
        "cloud": data.cloud(c.daemon),
        "estate_use": figures,
        "estate_age": fmt.span((now - parse_iso(figures["as_of"])) / 1000),
        "dimensions": ledger_export.SUMMARY_DIMENSIONS,
    }


AUDIT_PAGE = 50
"""Events on one page of the audit trail (it was one 7,000-pixel page after 25 minutes)."""
MAX_PAGE = 100_000


def _text(request: web.Request, name: str, most: int = 200) -> str | None:
    return (request.query.get(name) or "").strip()[:most] or None


def page_number(request: web.Request) -> int:
    raw = request.query.get("page") or "1"
    if not raw.isdigit() or not 1 <= int(raw[:7]) <= MAX_PAGE:
        raise ApiError(
            400,
            "invalid-request",
            f"page must be a number from 1 to {MAX_PAGE}, found {excerpt(raw)}",
        )
    return int(raw)


def audit_url(filters: dict[str, str | None], page_no: int) -> str:
    """The audit trail's URL for ``filters`` at page ``page_no``: what a link to the next or
    previous page keeps, and what a person bookmarks or sends."""
    query = {k: v for k, v in filters.items() if v}
    if page_no > 1:
        query["page"] = str(page_no)
    return "/audit" + (f"?{urlencode(query)}" if query else "")


async def audit(request: web.Request, p: Principal) -> dict[str, Any]:
    """The newest events ``p`` may read, :data:`AUDIT_PAGE` a page, filtered by the URL's
    ``q`` (any text), ``actor``, ``kind`` and ``task`` (exact), at its ``page``: the filters
    and the page stay in the URL, so a view can be reloaded, bookmarked and sent."""
    c = ctx(request)
    filters = {
        "q": _text(request, "q"),
        "actor": _text(request, "actor"),
        "kind": request.query.get("kind") or None,  # whole: a wrong one is quoted back
        "task": _text(request, "task"),
    }
    kind = filters["kind"]
    if kind is not None and kind not in KINDS:
        raise ApiError(400, "invalid-request", f"kind: no event kind {excerpt(kind)}")
    page_no = page_number(request)
    got = await data.events(
        c.daemon,
        c.store,
        p,
        limit=AUDIT_PAGE + 1,
        search=filters["q"],
        kind=kind,
        actor=filters["actor"],
        task=filters["task"],
        offset=(page_no - 1) * AUDIT_PAGE,
    )
    first = (page_no - 1) * AUDIT_PAGE + 1
    return {
        "events": got[:AUDIT_PAGE],
        "q": filters["q"] or "",
        "actor": filters["actor"] or "",
        "task": filters["task"] or "",
        "kind": kind,
        "kinds": sorted(KINDS),
        "page_no": page_no,
        "first": first,
        "last": first + min(len(got), AUDIT_PAGE) - 1,
        "newer_url": audit_url(filters, page_no - 1) if page_no > 1 else None,
        "older_url": audit_url(filters, page_no + 1) if len(got) > AUDIT_PAGE else None,
    }


async def estate(request: web.Request, p: Principal) -> dict[str, Any]:
    c = ctx(request)
    return {
        "estate": data.estate(c.daemon),
        "revisions": await data.revisions(c.store),
        "plan": await data.last_plan(c.daemon, c.store),
    }
