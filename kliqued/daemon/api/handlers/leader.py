"""``GET /v1/leader``: which daemon leads (docs/ha.md). The leader answers here; a standby
answers the same path itself (standby.py), so a client or an operator can ask any daemon."""

from __future__ import annotations

from aiohttp import web

from kliqued.daemon.api.request import ctx, reply
from kliqued.daemon.api.routes import PUBLIC, Route


async def leader(request: web.Request) -> web.Response:
    c = ctx(request)
    lease = c.lease
    if lease is None:  # a DuckDB file: one daemon, the leader by construction
        return reply(
            {
                "status": "ok",
                "role": "leader",
                "self": c.server_url,
                "leader": {"url": c.server_url, "epoch": None, "holder": None},
            }
        )
    if not lease.holds():  # paused past its lease: a standby may lead by now (docs/ha.md)
        return reply(
            {"status": "standby", "role": "standby", "self": lease.advertise_url, "leader": None}
        )
    return reply(
        {
            "status": "ok",
            "role": "leader",
            "self": lease.advertise_url,
            "leader": {"url": lease.advertise_url, "epoch": lease.epoch, "holder": lease.holder},
        }
    )


ROUTES = [Route("GET", "/v1/leader", leader, "leader", PUBLIC)]
