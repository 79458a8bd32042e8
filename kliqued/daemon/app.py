"""The aiohttp application: routes, the error and auth middlewares, and JSON helpers.

Every answer is JSON (except the CSV export). The error middleware turns an ``ApiError`` into
its JSON, aiohttp's own HTTP errors (unknown route, wrong method, body over 1 MiB) into the
same shape, and any other exception into a 500 whose message carries an id that is logged
with the traceback; a traceback never reaches a client.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from aiohttp import web

from .core import Daemon
from .errors import ApiError, bad_request
from .inputs import check_params, parse_body
from .logs import LogStore
from .loop import Sequencer
from .openapi import validator
from .store import Store

log = logging.getLogger("kliqued")

MAX_BODY = 1024 * 1024
PUBLIC = frozenset({"/v1/health", "/v1/openapi.json"})
CTX = web.AppKey("ctx", object)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Context:
    daemon: Daemon
    seq: Sequencer
    store: Store
    pass_interval_s: float
    server_url: str | None = None
    logs: LogStore | None = None  # type: ignore[assignment]
    closing: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the daemon stops: long polls answer at once."""

    def wake(self, pool: str) -> None:
        """Parked long polls of ``pool`` lease in the cycle of the placement."""
        self.seq.unpark(pool)

    def wake_all(self) -> None:
        """Stopping: every parked long poll answers at once, with nothing."""
        self.seq.unpark_all([])


def ctx(request: web.Request) -> Context:
    return request.app[CTX]  # type: ignore[return-value]


def dumps(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False, default=str)


def reply(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=dumps)


async def read_json(request: web.Request, schema: str,
                    surely_valid: Callable[[Any], bool] | None = None) -> dict[str, Any]:
    """The body, parsed and validated against the OpenAPI schema ``schema`` (skipped when
    ``surely_valid`` vouches for it: a conservative fast check of a hot path)."""
    body = parse_body(await request.read(), schema)  # text, numbers, depth: inputs.py
    if surely_valid is not None and surely_valid(body):
        return body
    errors = sorted(validator(schema).iter_errors(body), key=lambda e: list(e.path))
    if errors:
        e = errors[0]
        where = "".join(f"/{p}" for p in e.path) or "(body)"
        raise bad_request(f"{where}: {e.message}"[:2000],
                          {"schema": schema, "path": [str(p) for p in e.path]})
    return body


_HTTP_CODES = {400: "invalid-request", 401: "unauthenticated", 403: "forbidden",
               404: "not-found", 405: "method-not-allowed", 413: "request-too-large",
               415: "unsupported-media-type"}


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return reply(exc.body(), exc.status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = _HTTP_CODES.get(exc.status, "http-error")
        if exc.status == 413:
            msg = f"the body is larger than {MAX_BODY // 1024} KiB"
        elif exc.status == 404:
            msg = f"no route {request.method} {request.path}; see /v1/openapi.json"
        elif exc.status == 405:
            msg = f"{request.method} is not allowed on {request.path}"
        else:
            msg = exc.reason or "HTTP error"
        return reply({"error": {"code": code, "message": msg}}, exc.status)
    except Exception:
        eid = uuid.uuid4().hex[:12]
        log.exception("error %s on %s %s", eid, request.method, request.path)
        return reply({"error": {"code": "internal",
                                "message": f"internal error {eid}; the daemon's log has "
                                           f"the details"}}, 500)


@web.middleware
async def input_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The query string, path variables and read headers, checked before any handler reads
    them (bodies: ``read_json``)."""
    exc = request.match_info.http_exception
    if exc is None:
        check_params(request.query, request.match_info, request.headers)
        auth = request.headers.get("Authorization")
        if auth is not None and request.path not in PUBLIC and not (
                auth.isascii() and auth.isprintable()):
            raise ApiError(401, "unauthenticated", "the Authorization header holds "
                           "characters no token has (a token is printable ASCII)")
    return await handler(request)


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    exc = request.match_info.http_exception
    if exc is not None:
        raise exc
    if request.path not in PUBLIC:
        d = ctx(request).daemon
        request["principal"] = d.tokens.authenticate(request.headers.get("Authorization"),
                                                      d.clock.now())
    return await handler(request)


def make_app(context: Context) -> web.Application:
    from .handlers import engine, estate, events, ledger, meta, plan, policies, pools
    from .handlers import resources
    from .handlers import tasks, tokens, workers
    app = web.Application(client_max_size=MAX_BODY,
                          middlewares=[errors_middleware, input_middleware, auth_middleware])
    app[CTX] = context
    r = app.router
    r.add_get("/v1/health", meta.health)
    r.add_get("/v1/openapi.json", meta.openapi)
    r.add_get("/v1/whoami", meta.whoami)
    r.add_post("/v1/tasks", tasks.submit)
    r.add_get("/v1/tasks", tasks.list_tasks)
    r.add_get("/v1/tasks/{id}", tasks.get_task)
    r.add_post("/v1/tasks/{id}/cancel", tasks.cancel)
    r.add_post("/v1/tasks/{id}/report", workers.report)
    r.add_post("/v1/tasks/{id}/log", workers.upload_log)
    r.add_get("/v1/tasks/{id}/log", workers.read_log)
    r.add_post("/v1/workers/register", workers.register)
    r.add_get("/v1/workers", workers.list_workers)
    r.add_post("/v1/workers/{id}/lease", workers.lease)
    r.add_post("/v1/workers/{id}/heartbeat", workers.heartbeat)
    r.add_post("/v1/workers/{id}/reports", workers.reports)
    r.add_delete("/v1/workers/{id}", workers.deregister)
    r.add_get("/v1/resources", resources.list_resources)
    r.add_get("/v1/resources/{policy}/{profile}/queue", resources.queue)
    r.add_get("/v1/policies", policies.list_policies)
    r.add_get("/v1/policies/{name}", policies.get_policy)
    r.add_get("/v1/pools", pools.list_pools)
    r.add_get("/v1/events", events.list_events)
    r.add_get("/v1/engine", engine.get_engine)
    r.add_post("/v1/engine", engine.set_engine)
    r.add_get("/v1/estate", estate.get_estate)
    r.add_get("/v1/plan/state", plan.plan_state)
    r.add_post("/v1/tokens", tokens.create)
    r.add_get("/v1/tokens", tokens.list_tokens)
    r.add_delete("/v1/tokens/{id}", tokens.revoke)
    r.add_post("/v1/tokens/{id}/rotate", tokens.rotate)
    r.add_post("/v1/ledger/sql", ledger.sql)
    r.add_get("/v1/ledger/export", ledger.export)
    return app
