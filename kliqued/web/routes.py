"""The dashboard's routes, installed in the daemon's application by ``kliqued.daemon.api.app``
beside the API's own table, outside ``/v1``."""

from __future__ import annotations

import datetime as dt
from typing import Awaitable, Callable

from aiohttp import web

from kliqued.daemon.api.request import CTX

from .errors import html_errors
from .files import export, static
from . import actions, logpage
from .frame import WEB, Web
from .pages import audit, estate, my_work, orchestration, page, policy, usage
from . import oidc
from .signin import root, signin, signin_form, signout


async def _warm(app: web.Application) -> None:
    """The whole estate's CIO figures of the current month, computed while the daemon starts
    serving: the first to open the usage page does not wait for them (a standby sends its
    pages to the leader)."""
    c = app[CTX]
    if not c.daemon.ready:  # a standby's application, its state not loaded: not its pages
        return
    now = c.daemon.clock.now()
    today = dt.datetime.fromtimestamp(now / 1000, dt.timezone.utc).date()
    app[WEB].figures.warm(c.store, today, now)


async def _stop(app: web.Application) -> None:
    app[WEB].figures.close()


ROUTES: list[tuple[str, str, Callable[[web.Request], Awaitable[web.StreamResponse]]]] = [
    ("GET", "/", root),
    ("GET", "/signin", signin_form),
    ("POST", "/signin", signin),
    ("POST", "/signout", signout),
    ("GET", oidc.PATH, oidc.start),
    ("GET", oidc.CALLBACK, oidc.callback),
    ("GET", "/orchestration", page("orchestration", orchestration)),
    ("GET", "/policy", page("policy", policy)),
    ("GET", "/my-work", page("my-work", my_work)),
    ("GET", "/my-work/{id}/log", logpage.page),
    ("GET", "/my-work/{id}/log.txt", logpage.raw),
    ("POST", "/my-work/{id}/cancel", actions.cancel),
    ("GET", "/my-work/{id}/session", actions.open_session),
    ("GET", "/usage", page("usage", usage)),
    ("GET", "/usage/export", export),
    ("GET", "/audit", page("audit", audit)),
    ("GET", "/estate", page("estate", estate)),
    ("GET", "/static/{name}", static),
]
"""The dashboard's routes: served by the daemon's application outside ``/v1``, with their own
session check instead of the API's bearer token."""


def install(app: web.Application) -> None:
    """Adds the dashboard's routes and state to the daemon's application."""
    app[WEB] = Web()
    app.middlewares.insert(0, html_errors)  # outermost: it reads the error middleware's JSON
    app.on_startup.append(_warm)
    app.on_cleanup.append(_stop)
    for method, path, handler in ROUTES:
        if method == "GET":
            app.router.add_get(path, handler)
        else:
            app.router.add_route(method, path, handler)
