"""Policies: use against reservation and limit, budget used and left, burn rate, run-out."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from klique_util.excerpt import excerpt

from kliqued.daemon.api import views
from kliqued.daemon.auth import Principal
from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.errors import forbidden, not_found
from kliqued.daemon.api.request import ctx, principal, reply
from kliqued.daemon.api.routes import Route


async def list_policies(request: web.Request) -> web.Response:
    return reply(policies_of(ctx(request).daemon, principal(request)))


def policies_of(d: Daemon, p: Principal) -> dict[str, Any]:
    """``listPolicies`` for ``p``: the policies of the groups they may see, with each budget's
    use, what is left, the burn rate and the projected run-out."""
    idx, acc = d.idx(), d.acc()
    now = d.clock.now()
    names = sorted(
        n for n, g in idx.group_of_policy.items() if p.is_finance or acc.sees_group(p, g)
    )
    waits = views.waiting(d)
    return {"policies": [views.policy(d, n, now, waits, alerts_for=p) for n in names]}


async def get_policy(request: web.Request) -> web.Response:
    d = ctx(request).daemon
    p = principal(request)
    name = request.match_info["name"]
    g = d.idx().group_of_policy.get(name)
    if g is None:
        raise not_found(f"no policy {excerpt(name, quoted=False)}")
    if not (p.is_finance or d.acc().sees_group(p, g)):
        raise forbidden(f"{p.text} is not in group {g}")
    return reply(views.policy(d, name, d.clock.now(), alerts_for=p))


SEERS = ("admin", "finance", "user")
RULE = "a user: the policies of groups they are in or administer"

ROUTES = [
    Route("GET", "/v1/policies", list_policies, "listPolicies", SEERS, rule=RULE),
    Route("GET", "/v1/policies/{name}", get_policy, "getPolicy", SEERS, rule=RULE),
]
