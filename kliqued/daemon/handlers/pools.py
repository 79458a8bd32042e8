"""Pools: capacity, used, borrowed and free."""

from __future__ import annotations

from aiohttp import web

from .. import views
from ..request import ctx, principal, reply
from ..routes import ANY, Route


async def list_pools(request: web.Request) -> web.Response:
    d = ctx(request).daemon
    p = principal(request)
    acc = d.acc()

    def sees(group: str) -> bool:
        """Whose use ``by_level`` shows: as for policies (a user: the groups they are in or
        administer, so a department head sees their teams on each pool)."""
        return p.is_finance or acc.sees_group(p, group)
    return reply({"pools": views.pools(d, p.name if p.is_worker else None, sees)})


ROUTES = [
    Route("GET", "/v1/pools", list_pools, "listPools", ANY,
          rule="a worker: its own pool; `by_level`: the groups the caller sees, as for "
               "policies"),
]
