"""Sessions: start, list, get, stop, a browser link, the worker's tunnel, and the proxy that
serves ``/sessions/{id}/...`` through it on the sessions' own listener, never on the control
plane's origin (``session_site``; docs/channels.md, "Sessions").

A session is started by a user and is reached by that user only: its URL answers the
owner's token (``Authorization: Bearer``) or the cookie a one-time link sets; another user's
token, an admin's included, is a 403, and nothing of the app is shown. The user's token and
the session cookie are never passed on to the app. Seeing and stopping a session follow the
task rules (its owner, its group's admins, platform admins; anyone else: 404).
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web
from multidict import CIMultiDict

from klique_util.excerpt import excerpt
from klique_util.tunnel import (
    MAX_FRAME,
    MAX_WS_MESSAGE,
    FrameTooLarge,
    b64,
    close_code,
    forwardable,
    unb64,
)
from klique_util.session_apps import enable_hint
from kliqued.daemon import apps, session_origin
from kliqued.daemon.api import sessions
from kliqued.daemon.fleet import workers as fleet, tunnels
from kliqued.daemon.state import history
from kliqued.daemon.auth import Principal
from kliqued.daemon.errors import ApiError, forbidden, not_found
from kliqued.daemon.leases import CLOSED, FENCED
from kliqued.daemon.records import TaskRecord
from kliqued.daemon.api.request import Context, ctx, principal, read_json, reply
from kliqued.daemon.api.routes import Route
from kliqued.daemon.api.handlers.params import int_param
from kliqued.daemon.state.submission import from_body
from kliqued.daemon.api.handlers.tasks import PEOPLE, SEE_TASK, _visible
from kliqued.daemon.api.handlers.workers import _audited, _key_hash


def _url(request: web.Request, task: str) -> str:
    """The session's URL on its own origin (``--sessions-domain``, or the sessions'
    listener)."""
    origin = ctx(request).session_origin
    if origin is None:
        raise ApiError(
            503,
            "sessions-unavailable",
            "the sessions' listener is not up on this daemon: ask the leader",
        )
    return origin.url(task)


async def _session(request: web.Request) -> TaskRecord:
    """The session the caller may see (ended long ago: read back from the history); 404 for
    anything else, as for tasks."""
    c = ctx(request)
    tid = request.match_info["id"]
    rec = await history.recall(c.store, c.daemon, tid)
    if rec is None or not sessions.is_session(rec):
        raise not_found(f"no session {excerpt(tid, quoted=False)}")
    return _visible(request, rec)


def _view(request: web.Request, rec: TaskRecord) -> dict[str, Any]:
    return sessions.view(
        rec, _url(request, rec.id), ctx(request).tunnels.get(rec.id, rec.epoch) is not None
    )


async def start(request: web.Request) -> web.Response:
    c = ctx(request)
    d = c.daemon
    p = principal(request)
    body = await read_json(request, "SessionStart")
    app = body["app"]
    task = {
        "resource": body["resource"],
        "command": body.get("command") or list(apps.APPS[app]),
        "project": body.get("project"),
        "gpus": body.get("gpus"),
    }
    key = request.headers.get("Idempotency-Key")
    sub = from_body(d.idx(), p, task, sessions.CHANNEL, key)
    cr = d.idx().resources[sub.resource]
    if cr.nodes > 1:
        raise ApiError(
            422,
            "invalid-field",
            f"resource: a session runs on one machine, and "
            f"profile {cr.profile} spans {cr.nodes} (a gang): choose a compute "
            "resource of one node",
            {"field": "resource"},
        )
    known = [w for w in d.workers.values() if w.pool in cr.pools]
    if task["command"] == apps.APPS[app] and apps.missing_everywhere(app, known):
        raise ApiError(
            422,
            "app-unavailable",
            f"app: no worker of {', '.join(cr.pools)} (the pools of {sub.resource}) can "
            f"start {app}: each says at registration which apps it can start, and none "
            f"listed {app}; {enable_hint(app)}, then restart the worker, or choose another app",
            {"field": "app", "workers": sorted(w.id for w in known)[:20]},
        )
    idle = sessions.idle_labels(cr.profile, d.session_idle.get(cr.profile), body.get("idle"))
    sub = sessions.submission(sub, app, idle)
    status, task_id = await c.seq.submit(lambda now, ov: d.prepare_submit(p, sub, now, ov))
    return reply(_view(request, d.records[task_id]), status)


async def list_sessions(request: web.Request) -> web.Response:
    d = ctx(request).daemon
    p = principal(request)
    acc = d.acc()
    records = d.records  # sessions in memory: live ones and those ended lately
    out = [
        rec
        for tid in d.ids
        if (rec := records.get(tid)) is not None
        and sessions.is_session(rec)
        and acc.sees_task(p, rec.user, rec.group)
    ]
    return reply({"sessions": [_view(request, r) for r in out[-1000:]]})


async def get_session(request: web.Request) -> web.Response:
    return reply(_view(request, await _session(request)))


async def stop(request: web.Request) -> web.Response:
    c = ctx(request)
    d = c.daemon
    p = principal(request)
    rec = await _session(request)
    if rec.state != "ended":
        await c.seq.submit(lambda now, ov: d.prepare_cancel(p, rec.id, now, ov, "session stopped"))
    c.session_passes.forget(rec.id)
    return reply(_view(request, rec))


async def link(request: web.Request) -> web.Response:
    rec = await _session(request)
    return reply(
        {
            "url": one_time_link(ctx(request), principal(request), rec),
            "expires_in_s": int(sessions.LINK_TTL_S),
        }
    )


def origin_url(c: Context, task: str) -> str | None:
    """Session ``task``'s URL on its own origin, or None where this daemon serves no
    sessions (a standby): what the dashboard shows beside a running session."""
    return None if c.session_origin is None else c.session_origin.url(task)


def one_time_link(c: Context, p: Principal, rec: TaskRecord) -> str:
    """A one-time link to session ``rec`` for its owner ``p`` (``POST
    /v1/sessions/{id}/link``, and the dashboard's *Open session*): a browser that follows it
    gets the session's cookie on the session's origin. Anyone else: 403."""
    if p.name != rec.user:
        raise forbidden(f"session {rec.id} is {rec.user}'s: only its owner may open it")
    url = origin_url(c, rec.id)
    if url is None:
        raise ApiError(
            503,
            "sessions-unavailable",
            "the sessions' listener is not up on this daemon: ask the leader",
        )
    c.session_passes.drop_ended(
        lambda tid: tid not in c.daemon.records or c.daemon.records[tid].state == "ended"
    )
    assert p.token_id is not None  # a user's token: the cookie ends with it
    c.daemon.tokens.require_booked(p, "a session's link")
    ticket = c.session_passes.link(rec.id, p.name, p.token_id)
    return f"{url}?klique_ticket={ticket}"


async def tunnel(request: web.Request) -> web.StreamResponse:
    """The worker running a session opens this WebSocket (outbound, as all its calls) and
    serves the session's requests over it (kliqued/daemon/fleet/tunnels.py)."""
    c = ctx(request)
    d = c.daemon
    p = principal(request)
    tid = request.match_info["id"]
    epoch = int_param(request, "epoch", None, 1, 2**31)
    if epoch is None:
        raise ApiError(400, "invalid-request", "epoch is required: the lease's epoch")
    key = _key_hash(request)
    rec, lease = await _audited(
        request, lambda: fleet.lease_for_report(d, p, tid, epoch, key, "tunnel")
    )
    if (
        lease is None
        or lease.status in (CLOSED, FENCED)
        or rec.state == "ended"
        or epoch != rec.epoch
    ):  # only the task's latest lease serves it
        raise fleet.stale(rec, epoch)
    if not sessions.is_session(rec):
        raise ApiError(409, "not-a-session", f"task {tid} is not a session")
    ws = web.WebSocketResponse(heartbeat=20, max_msg_size=MAX_FRAME)
    await ws.prepare(request)
    await c.tunnels.serve(tid, epoch, ws)
    return ws


# the proxy ------------------------------------------------------------------------------
def _owner(request: web.Request, c: Context, rec: TaskRecord) -> web.StreamResponse | None:
    """None when the caller is the session's owner; a redirect that sets the cookie for a
    one-time link; an ApiError (401, 403) otherwise. The cookie is checked against the token
    that asked for its link at every request: revoked or expired, the cookie is refused."""
    d = c.daemon
    ticket = request.query.get("klique_ticket")
    if ticket is not None:
        made = c.session_passes.redeem(
            ticket, rec.id, lambda tid: d.tokens.seconds_left(tid, d.clock.now())
        )
        if made is None:
            raise ApiError(
                401,
                "unauthenticated",
                "this session link was used already or "
                f"has expired: run `kliqued session open {rec.id}` for a new one",
            )
        cookie, max_age = made
        query = [(k, v) for k, v in request.query.items() if k != "klique_ticket"]
        target = request.rel_url.with_query(query) if query else request.rel_url.with_query(None)
        resp = web.HTTPSeeOther(str(target))
        resp.set_cookie(
            sessions.COOKIE,
            cookie,
            path=f"{sessions.PREFIX}{rec.id}/",
            max_age=max_age,
            httponly=True,
            samesite="Lax",
            secure=request.secure,
        )
        return resp
    auth = request.headers.get("Authorization")
    if auth is not None:
        p = d.tokens.authenticate(auth, d.clock.now())
        if not (p.is_user and p.name == rec.user):
            raise forbidden(
                f"{p.text} may not use session {rec.id}: a session is reached by "
                "the user who started it only"
            )
        return None
    cookies = session_origin.cookie_values(request.headers.get("Cookie", ""), sessions.COOKIE)
    user = c.session_passes.holder(cookies, rec.id, lambda tid: d.tokens.usable(tid, d.clock.now()))
    if user == rec.user:
        _same_origin(request, rec.id)
        return None
    raise ApiError(
        401,
        "unauthenticated",
        f"session {rec.id} is reached with its owner's "
        "token (Authorization: Bearer) or from the link `kliqued session open "
        f"{rec.id}` prints (a link's cookie ends with the token that asked for "
        "it)",
    )


def _same_origin(request: web.Request, task: str) -> None:
    """A request carrying the session's cookie must come from the session's own page when it
    says where it comes from (``Origin``: fetches, form posts, every WebSocket): another
    page of the same site (another session's, under ``--sessions-domain``) could otherwise
    drive this session with the browser's cookie, as SameSite does not tell subdomains
    apart."""
    origin = request.headers.get("Origin")
    if origin is None:
        return
    if origin == "null" or origin.split("://", 1)[-1].rstrip("/").lower() != request.host.lower():
        raise forbidden(
            f"session {task}: a request from {origin} may not use this "
            "session's cookie (only the session's own pages may)"
        )


def _answer_headers(answer: list[list[str]], prefix: str) -> CIMultiDict[str]:
    """The app's answer headers as the browser gets them: hop-by-hop ones dropped
    (``forwardable``), then ``session_origin.DROPPED`` and every ``Set-Cookie`` the session
    may not set (the sessions' own security headers are added by ``session_site``)."""
    out: CIMultiDict[str] = CIMultiDict()
    for k, v in forwardable((str(h[0]), str(h[1])) for h in answer):
        name = k.lower()
        if name in session_origin.DROPPED:
            continue
        if name == "set-cookie" and session_origin.set_cookie_refusal(v, prefix) is not None:
            continue
        out.add(k, v)
    return out


async def proxy(request: web.Request) -> web.StreamResponse:
    c = ctx(request)
    tid = request.match_info["id"]
    rec = await history.recall(c.store, c.daemon, tid)
    if rec is None or not sessions.is_session(rec):
        raise not_found(f"no session {excerpt(tid, quoted=False)}")
    redirect = _owner(request, c, rec)
    if redirect is not None:
        return redirect
    if rec.state == "ended":
        c.session_passes.forget(rec.id)
        raise ApiError(410, "session-ended", f"session {tid} has ended: {sessions.state(rec)}")
    tun = c.tunnels.get(tid, rec.epoch)
    if tun is None:
        raise ApiError(
            503,
            "session-starting",
            f"session {tid} is {sessions.state(rec)}; "
            "its app is not reachable yet: try again in a few seconds",
        )
    headers = forwardable(request.headers.items(), frozenset({"authorization", "cookie"}))
    cookie = session_origin.app_cookies(request.headers.get("Cookie", ""))
    if cookie:
        headers.append(["Cookie", cookie])
    path = request.rel_url.raw_path_qs  # origin-form, whatever form the client sent
    if request.headers.get("Upgrade", "").lower() == "websocket":
        return await _relay_ws(request, tun, path, headers)
    answer = await tun.request(request.method, path, headers, await request.read())
    out = _answer_headers(answer.headers, f"{sessions.PREFIX}{tid}/")
    return await tunnels.respond(request, answer, out)  # streamed, however large


async def _relay_ws(
    request: web.Request, tun: Any, path: str, headers: list[list[str]]
) -> web.WebSocketResponse:
    rid, queue = await tun.open_ws(path, headers)
    ws = web.WebSocketResponse(max_msg_size=MAX_WS_MESSAGE)  # larger: closed with 1009
    await ws.prepare(request)

    async def app_to_client() -> None:
        while (msg := await queue.get()) is not None and msg.get("op") == "ws-msg":
            if "text" in msg:
                await ws.send_str(msg["text"])
            else:
                await ws.send_bytes(unb64(msg.get("data")))
        await ws.close(code=close_code(msg and msg.get("code")))  # the app's, passed on

    pump = asyncio.ensure_future(app_to_client())
    try:
        async for frame in ws:
            if frame.type == WSMsgType.TEXT:
                await tun.ws_send(rid, {"op": "ws-msg", "text": frame.data})
            elif frame.type == WSMsgType.BINARY:
                await tun.ws_send(rid, {"op": "ws-msg", "data": b64(frame.data)})
    except FrameTooLarge:  # a message the tunnel cannot carry: this socket ends, not the tunnel
        await ws.close(code=WSCloseCode.MESSAGE_TOO_BIG, message=b"too big for the relay")
    except ApiError:
        pass
    finally:
        pump.cancel()
        await tun.ws_close(rid)
    return ws


ROUTES = [
    Route(
        "POST",
        "/v1/sessions",
        start,
        "startSession",
        ("user",),
        rule="a user: on their groups' compute resources",
        hint="use a user's token",
    ),
    Route("GET", "/v1/sessions", list_sessions, "listSessions", PEOPLE, rule=SEE_TASK),
    Route("GET", "/v1/sessions/{id}", get_session, "getSession", PEOPLE, rule=SEE_TASK),
    Route("POST", "/v1/sessions/{id}/stop", stop, "stopSession", PEOPLE, rule=SEE_TASK),
    Route(
        "POST",
        "/v1/sessions/{id}/link",
        link,
        "linkSession",
        ("user",),
        rule="the session's owner only",
    ),
    Route(
        "GET",
        "/v1/sessions/{id}/tunnel",
        tunnel,
        "sessionTunnel",
        ("worker",),
        rule="the worker holding the session's lease",
    ),
]
PROXY_PATH = "/sessions/{id}/{tail:.*}"
"""Served by the sessions' listener only (``session_site``), outside the API's route table:
any method, the owner's token or cookie checked by ``proxy`` itself (``_owner``)."""


async def elsewhere(request: web.Request) -> web.StreamResponse:
    """``/sessions/...`` on the control plane's own listener: 404, saying where sessions
    are. A session's page served here would run as the dashboard."""
    raise not_found(
        "sessions are not served on the control plane's origin: "
        "GET /v1/sessions/{id} gives a session's URL, on its own origin"
    )
