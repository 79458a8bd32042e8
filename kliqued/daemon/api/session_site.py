"""The sessions' listener: the one place a session's app is served (issue 25, item 1).

Why a listener of its own: an origin is scheme, host and port, so a page served here (a
session's app, code its user chose) is another origin than the dashboard's and reads nothing
of it. With ``--sessions-domain`` each session also gets a host of its own
(``t-x.sessions.example.org``, routed by the ``Host`` header): sessions are then separate
origins from one another too. Without it (one machine, ``kliqued dev``) every session shares
this listener's origin, told apart by path (docs/decisions.md says what that isolates).

Every answer here carries ``session_origin.HEADERS``; the proxy itself is
``handlers/sessions.proxy``. The control plane's API and dashboard are not served here.
"""

from __future__ import annotations

from aiohttp import web

from klique_util.excerpt import excerpt

from kliqued.daemon.api.app import MAX_BODY, errors_middleware
from kliqued.daemon.errors import not_found
from kliqued.daemon.api.handlers import sessions as handlers
from kliqued.daemon.api.request import CTX, Context
from kliqued.daemon.api.routes import Handler
from kliqued.daemon.session_origin import HEADERS, PREFIX


@web.middleware
async def _host_routing(request: web.Request, handler: Handler) -> web.StreamResponse:
    """With ``--sessions-domain``: a session's host serves that session only (its root
    redirects to the session's path); any other host or path is a 404."""
    origin = request.app[CTX].session_origin
    if origin is None or origin.domain is None:
        return await handler(request)
    task = origin.task_of_host(request.host)
    if task is None:
        raise not_found(
            f"no session at host {excerpt(request.host)}: a session's URL is "
            f"https://<its id>.{origin.domain}/ (GET /v1/sessions/{{id}})"
        )
    if request.path in ("/", ""):
        raise web.HTTPSeeOther(f"{PREFIX}{task}/")
    if request.match_info.get("id") != task:
        raise not_found(f"host {request.host} serves session {task} only, under {PREFIX}{task}/")
    return await handler(request)


async def _add_headers(request: web.Request, resp: web.StreamResponse) -> None:
    """The sessions' security headers on every answer of this listener (the app's, the
    proxy's errors and redirects, a WebSocket's handshake). An app's own CSP stays beside
    ours (a browser enforces both); the other headers are ours."""
    for k, v in HEADERS:
        if k == "Content-Security-Policy":
            if v not in resp.headers.getall(k, []):
                resp.headers.add(k, v)
        else:
            resp.headers[k] = v


def make_session_app(context: Context) -> web.Application:
    """The sessions' listener's application; how it routes (by path, or by host) follows
    ``context.session_origin``, set once the listener is bound."""
    app = web.Application(client_max_size=MAX_BODY, middlewares=[errors_middleware, _host_routing])
    app[CTX] = context
    app.on_response_prepare.append(_add_headers)
    app.router.add_route("*", handlers.PROXY_PATH, handlers.proxy)
    return app
