"""What a handler needs from a request: the daemon's context, the checked JSON body, the
caller, and JSON replies.

Its own module so that handlers import it and ``app.py`` imports handlers, never the other
way round (issue 11): ``app.py`` only assembles the application from the route tables.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, Callable

from aiohttp import web

from klique_util.excerpt import EXCERPT, clip, excerpt

from kliqued.daemon.auth import Principal
from kliqued.daemon.identity.keys import KeyCache
from kliqued.daemon.identity.seen import SeenTokens
from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.errors import bad_request
from kliqued.daemon.api.inputs import parse_body
from kliqued.daemon.logs import LogStore
from kliqued.daemon.state.loop import Sequencer
from kliqued.daemon.api.openapi import validator
from kliqued.daemon.api.schema_rules import NAME_PATTERN
from kliqued.daemon.session_origin import SessionOrigin
from kliqued.daemon.api.sessions import Passes
from kliqued.daemon.storage.store import Store
from kliqued.daemon.fleet.tunnels import Tunnels

DOC = web.AppKey("openapi", dict)
"""The OpenAPI document, built once from the route tables when the application is made."""


@dataclass
class Context:
    daemon: Daemon
    seq: Sequencer
    store: Store
    pass_interval_s: float
    logs: LogStore
    server_url: str | None = None
    closing: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the daemon stops: long polls answer at once."""
    tunnels: Tunnels = field(default_factory=Tunnels)
    """The sessions' tunnels from their workers (in memory: a worker connects again)."""
    session_passes: Passes = field(default_factory=Passes)
    """One-time session links and their cookies (in memory)."""
    session_origin: SessionOrigin | None = None
    """Where sessions are served (their own listener, or one subdomain each): never this
    application's origin. None until the sessions' listener is up."""
    keys: KeyCache = field(default_factory=KeyCache)
    """The signing keys of the identity providers the estate trusts (issue 30), cached."""
    seen: SeenTokens = field(default_factory=SeenTokens)
    """Bearer tokens of providers whose first use was audited."""
    lease: Any = None
    """The leader's lease (``lease.Lease``) with ``--db postgresql://...``; None with a
    DuckDB file (one daemon, always the leader)."""

    def wake(self, pool: str) -> None:
        """Parked long polls of ``pool`` lease in the cycle of the placement."""
        self.seq.unpark(pool)

    def wake_all(self) -> None:
        """Stopping: every parked long poll answers at once, with nothing."""
        self.seq.unpark_all([])


CTX = web.AppKey("ctx", Context)


def ctx(request: web.Request) -> Context:
    return request.app[CTX]


PRINCIPAL = web.RequestKey("principal", Principal)
"""The authenticated caller, put on the request by the auth middleware: a typed key (a
string key is aiohttp's ``NotAppKeyWarning`` and an ``Any`` to mypy)."""


def principal(request: web.Request) -> Principal:
    """The authenticated caller (set by the auth middleware on every non-public route)."""
    return request[PRINCIPAL]


def dumps(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False, default=str)


def reply(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=dumps)


def reworded(e: Any) -> str:
    """jsonschema's message, which quotes the whole instance (a 200 kB string, a body
    with a 200 kB key), with the instance as an excerpt and the rest clipped."""
    if e.validator == "additionalProperties" and isinstance(e.instance, dict):
        known = e.schema.get("properties", {})
        extra = [k for k in e.instance if k not in known]
        more = f" and {len(extra) - 3} more" if len(extra) > 3 else ""
        return (
            f"unexpected properties {', '.join(excerpt(k) for k in extra[:3])}{more} "
            f"(additional properties are not allowed)"
        )
    if e.validator == "pattern" and e.validator_value == NAME_PATTERN:
        return "contains a control character; names and ids hold no control characters"
    message = str(e.message)
    whole = repr(e.instance)
    if len(whole) > EXCERPT and whole in message:
        message = message.replace(whole, excerpt(e.instance))
    return clip(message, 2 * EXCERPT + 120)


async def read_json(
    request: web.Request, schema: str, surely_valid: Callable[[Any], bool] | None = None
) -> dict[str, Any]:
    """The body, parsed and validated against the OpenAPI schema ``schema`` (skipped when
    ``surely_valid`` vouches for it: a conservative fast check of a hot path)."""
    body = parse_body(await request.read(), schema)  # text, numbers, depth: inputs.py
    return valid(body, schema, surely_valid)


def valid(
    body: Any, schema: str, surely_valid: Callable[[Any], bool] | None = None
) -> dict[str, Any]:
    """``body`` (parsed JSON, its text already checked) validated against the OpenAPI schema
    ``schema``: a 400 naming the first wrong place. The daemon's own channels (MCP,
    schedules, pipelines) check the bodies they build with it, as a client's are checked."""
    if surely_valid is not None and surely_valid(body):
        return body
    errors = sorted(validator(schema).iter_errors(body), key=lambda e: list(e.path))
    if errors:
        e = errors[0]
        where = "".join(f"/{p}" for p in e.path) or "(body)"
        raise bad_request(
            f"{where}: {reworded(e)}", {"schema": schema, "path": [str(p) for p in e.path]}
        )
    return body
