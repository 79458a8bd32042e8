"""The aiohttp application, assembled from the handlers' route tables; the error, input and
auth middlewares.

Every answer is JSON (except the CSV export). The error middleware turns an ``ApiError`` into
its JSON, aiohttp's own HTTP errors (unknown route, wrong method, body over 1 MiB) into the
same shape, and any other exception into a 500 whose message carries an id that is logged
with the traceback; a traceback never reaches a client. A client that hangs up mid-request
(the body's read, or the answer's write, fails with a ``ConnectionError``) is no bug of ours:
it is logged on the listener's flood-prone logger, one line a minute with a count
(``logsetup.FloodFilter``), without a traceback. The auth middleware authenticates
the caller and checks its role against the route's declaration (``routes.Route``) before
any handler runs. Handlers import ``request.py``, never this module.
"""

from __future__ import annotations

import logging
import uuid
from typing import Callable, Sequence

from aiohttp import web

from kliqued.daemon.api.agents.endpoint import ENDPOINT, Endpoint, www_authenticate
from kliqued.daemon.errors import ApiError, MethodNotAllowed, StoreAway
from kliqued.daemon.listener import log as listener_log
from kliqued.daemon.api.agents import routes as agents
from kliqued.daemon.api.handlers import (
    demand,
    engine,
    estate,
    events,
    leader,
    ledger,
    meta,
    metrics,
)
from kliqued.daemon.api.handlers import (
    pipelines,
    plan,
    policies,
    pools,
    resources,
    schedules,
    sessions,
    tasks,
)
from kliqued.daemon.api.handlers import signin, tokens, workers
from kliqued.daemon.identity.verify import looks_like_jwt
from kliqued.daemon.api.inputs import check_params
from kliqued.daemon.api.openapi import document
from kliqued.daemon.api.request import CTX, DOC, PRINCIPAL, Context, ctx, reply
from kliqued.daemon.api.routes import Handler, Route, table

__all__ = ["Context", "ROUTES", "make_app"]

log = logging.getLogger(__name__)
hangups = listener_log  # clients that hang up: the listener's own logger, flood-limited
"""Client-driven records (logsetup.FLOOD_PRONE): a flood of hang-ups is aggregated."""

MAX_BODY = 1024 * 1024
ROUTES: list[Route] = [
    *meta.ROUTES,
    *tasks.ROUTES,
    *workers.ROUTES,
    *resources.ROUTES,
    *policies.ROUTES,
    *pools.ROUTES,
    *events.ROUTES,
    *engine.ROUTES,
    *estate.ROUTES,
    *plan.ROUTES,
    *demand.ROUTES,
    *tokens.ROUTES,
    *signin.ROUTES,
    *ledger.ROUTES,
    *metrics.ROUTES,
    *schedules.ROUTES,
    *pipelines.ROUTES,
    *sessions.ROUTES,
    *agents.ROUTES,
    *leader.ROUTES,
]
"""Every route the daemon serves, with who may call it: the one declaration."""
TABLE = table(ROUTES)
PUBLIC = frozenset(r.path for r in ROUTES if r.public)
"""Paths served without a token (the input middleware skips their Authorization header)."""

_HTTP_CODES = {
    400: "invalid-request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not-found",
    405: "method-not-allowed",
    413: "request-too-large",
    415: "unsupported-media-type",
}


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        resp = reply(exc.body(), exc.status)
        if exc.status == 401:  # RFC 6750; the MCP authorization spec reads it too
            resp.headers["WWW-Authenticate"] = www_authenticate(request, exc.message)
        if isinstance(exc, StoreAway):  # RFC 9110: when to try again
            resp.headers["Retry-After"] = str(exc.retry_after_s)
        if isinstance(exc, MethodNotAllowed):  # RFC 9110: a 405 names what is served
            resp.headers["Allow"] = ", ".join(exc.allow)
        return resp
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = _HTTP_CODES.get(exc.status, "http-error")
        if exc.status == 413:
            msg = f"the body is larger than {MAX_BODY // 1024} KiB"
        elif exc.status == 404:
            msg = f"no route {request.method} {request.path}; see /v1/openapi.json"
        elif exc.status == 405:
            allow = exc.headers.get("Allow", "")
            msg = f"{request.method} is not allowed on {request.path}" + (
                f"; it serves {allow}" if allow else ""
            )
        else:
            msg = exc.reason or "HTTP error"
        resp = reply({"error": {"code": code, "message": msg}}, exc.status)
        if exc.status == 405 and "Allow" in exc.headers:  # RFC 9110: a 405 must carry it
            resp.headers["Allow"] = exc.headers["Allow"]
        return resp
    except ConnectionError as exc:  # the client went away; aiohttp's own errors included
        hangups.info(
            "a client hung up during %s %s (%s)", request.method, request.path, type(exc).__name__
        )
        resp = reply(
            {
                "error": {
                    "code": "invalid-request",
                    "message": "the connection was closed mid-request",
                }
            },
            400,
        )
        resp.force_close()
        return resp
    except Exception:
        eid = uuid.uuid4().hex[:12]
        log.exception("error %s on %s %s", eid, request.method, request.path)
        return reply(
            {
                "error": {
                    "code": "internal",
                    "message": f"internal error {eid}; the daemon's log has the details",
                }
            },
            500,
        )


@web.middleware
async def input_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The query string, path variables and read headers, checked before any handler reads
    them (bodies: ``read_json``)."""
    exc = request.match_info.http_exception
    if exc is None and _proxied(request):
        return await handler(request)
    if exc is None:
        check_params(request.query, request.match_info, request.headers)
        auth = request.headers.get("Authorization")
        if (
            auth is not None
            and request.path not in PUBLIC
            and not (auth.isascii() and auth.isprintable())
        ):
            raise ApiError(
                401,
                "unauthenticated",
                "the Authorization header holds "
                "characters no token has (a token is printable ASCII)",
            )
    return await handler(request)


def _proxied(request: web.Request) -> bool:
    """A request for a session's app (``/sessions/{id}/...``): not an API call; on this
    listener it is a 404 (sessions are served by their own, ``session_site``)."""
    return request.match_info.route.handler is sessions.elsewhere


def route_of(request: web.Request) -> Route | None:
    """The declaration of the API route ``request`` matched (a HEAD is its GET's); None for
    a route of the dashboard."""
    method = "GET" if request.method == "HEAD" else request.method
    resource = request.match_info.route.resource
    return TABLE.get((method, resource.canonical if resource is not None else ""))


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Who calls (401 without a valid token), and whether the route admits its role (403
    naming the roles it admits); object-level rules are the handlers'."""
    exc = request.match_info.http_exception
    if exc is not None:
        raise exc
    if _proxied(request):
        return await handler(request)  # no session is served here: sessions.elsewhere
    route = route_of(request)
    if route is None:  # the dashboard (kliqued.web): its own session check
        return await handler(request)
    if not route.public:
        d = ctx(request).daemon
        header = request.headers.get("Authorization")
        scheme, _, token = (header or "").partition(" ")
        if scheme.lower() == "bearer" and looks_like_jwt(token.strip()):
            p = await signin.bearer(request, token.strip())  # a provider's token (issue 30)
        else:
            p = d.tokens.authenticate(header, d.clock.now())
        route.check(p)
        request[PRINCIPAL] = p
    return await handler(request)


Installer = Callable[[web.Application], None]
"""Adds routes of an adapter to the application: the dashboard's (``kliqued.web.routes.install``),
passed in by ``kliqued serve``'s command, since the daemon never imports ``kliqued.web``
(issue 27; docs/decisions.md)."""


def make_app(context: Context, installers: Sequence[Installer] = ()) -> web.Application:
    app = web.Application(
        client_max_size=MAX_BODY, middlewares=[errors_middleware, input_middleware, auth_middleware]
    )
    app[CTX] = context
    app[DOC] = document(context.server_url, ROUTES)
    mcp = app[ENDPOINT] = Endpoint(context)  # the MCP SDK starts at the first call
    app.on_cleanup.append(mcp.stop)
    for r in ROUTES:
        if r.method == "GET":
            app.router.add_get(r.path, r.handler)  # and HEAD
        else:
            app.router.add_route(r.method, r.path, r.handler)
    for install in installers:  # the dashboard at / (docs/dashboards.md)
        install(app)
    app.router.add_route("*", sessions.PROXY_PATH, sessions.elsewhere)
    return app
