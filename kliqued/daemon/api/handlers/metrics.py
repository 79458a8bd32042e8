"""Prometheus metrics in the exposition format (docs/metrics.md).

Read with a ``role:planner`` token (what a Prometheus scrape config sends as its bearer
token) or an admin's: the metrics are counts and sums per pool, compute resource and policy,
the read-only view the planner role is for; no task, user or command appears in them.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from kliqued.daemon.api.request import ctx
from kliqued.daemon.api.routes import Route


async def metrics(request: web.Request) -> web.Response:
    body = ctx(request).seq.metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


ROUTES = [
    Route(
        "GET",
        "/metrics",
        metrics,
        "metrics",
        ("admin", "planner"),
        hint="a Prometheus scrape sends a role:planner token as its bearer token",
    ),
]
