"""Tokens: created, rotated and revoked by admins, logged like every other change; only the
keyed hash is stored, and the token itself is shown once, in the 201 answer. Revoking a
token pauses the schedules and pipelines that run on it, and rotating one carries them to the
new token, each in the same commit (binding.py).

A token names a principal the running estate knows (a user who is in or administers some
group, an existing pool, a known role) and an optional note without control characters;
anything else is a 422 naming the field, so a typo cannot make a token nobody can use.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

from aiohttp import web

from compiler.models import USER_PATTERN
from compiler.units import parse_duration
from klique_util.excerpt import excerpt
from klique_util.units import DAY_S, SECOND_MS

from kliqued.daemon.api import views
from kliqued.daemon.state import binding
from kliqued.daemon.errors import ApiError
from kliqued.daemon.api.request import ctx, principal, read_json, reply
from kliqued.daemon.api.routes import Route
from kliqued.daemon.units import iso, parse_iso

NAME_MAX = 256
MAX_LIFETIME_S = 10 * 366 * DAY_S
"""Expiry at most ten years out (beyond that, leave it unset)."""
_USER = re.compile(USER_PATTERN)


def _invalid(field: str, message: str) -> ApiError:
    return ApiError(422, "invalid-field", f"{field}: {message}", {"field": field})


def _text_ok(text: str) -> str | None:
    """Why ``text`` cannot be a token's note, or None."""
    if not text.strip():
        return "must not be blank"
    for ch in text:
        if unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"):
            return f"must not contain control or unassigned characters (found U+{ord(ch):04X})"
    return None


def _principal(request: web.Request, body: dict[str, Any]) -> str:
    """The principal ``body`` asks for, checked against the running estate."""
    d = ctx(request).daemon
    if "user" in body:
        user = body["user"]
        if not _USER.match(user):
            raise _invalid(
                "user",
                f"{excerpt(user)} is not a user name (letters, digits and "
                f"._@+- , starting with a letter or digit; at most 128)",
            )
        acc = d.acc()
        if not acc.groups_of(user) and not acc.admin_of(user):
            raise ApiError(
                422,
                "unknown-user",
                f"user: {excerpt(user)} is in no group of the running estate (neither "
                f"in a group's users nor its admins): add them to groups.yaml first",
                {"field": "user"},
            )
        return f"user:{user}"
    if body.get("worker"):
        pool = body["pool"]
        if d.idx().estate.pool(pool) is None:
            raise ApiError(
                422,
                "unknown-pool",
                f"pool: no pool {excerpt(pool)} in the running estate",
                {"field": "pool"},
            )
        return f"worker:{pool}"
    return f"role:{body['role']}"


def _name(body: dict[str, Any]) -> str | None:
    name = body.get("name")
    if name is None:
        return None
    why = _text_ok(name) if len(name) <= NAME_MAX else f"at most {NAME_MAX} characters"
    if why:
        raise _invalid("name", why)
    return name


def _duration_ms(body: dict[str, Any], field: str) -> int | None:
    raw = body.get(field)
    if raw is None:
        return None
    try:
        seconds = parse_duration(raw)
    except ValueError as exc:
        raise _invalid(field, str(exc)) from None
    if seconds > MAX_LIFETIME_S:
        raise _invalid(field, "at most ten years (3660d)")
    return seconds * SECOND_MS


def _expires_at(body: dict[str, Any], now: int) -> int | None:
    """``expires_in`` (a duration from now) or ``expires_at`` (an instant), not both."""
    if body.get("expires_in") is not None and body.get("expires_at") is not None:
        raise _invalid("expires_in", "give expires_in or expires_at, not both")
    ms = _duration_ms(body, "expires_in")
    if ms is not None:
        if ms <= 0:
            raise _invalid("expires_in", "must be more than 0")
        return now + ms
    raw = body.get("expires_at")
    if raw is None:
        return None
    try:
        at = parse_iso(raw)
    except ValueError as exc:
        raise _invalid("expires_at", str(exc)) from None
    if at <= now:
        raise _invalid("expires_at", f"{raw} is not in the future")
    if at - now > MAX_LIFETIME_S * SECOND_MS:
        raise _invalid("expires_at", "at most ten years from now")
    return at


def _end_polls(c: Any, principal: str) -> None:
    """A revoked worker token's open long polls end now (with a 401), and none of them is
    handed a lease (fleet.prepare_lease checks the token too)."""
    kind, _, pool = principal.partition(":")
    if kind == "worker":
        c.wake(pool)


def _created(rec: Any, token: str, status: int = 201) -> web.Response:
    return reply(
        {
            "id": rec.id,
            "token": token,
            "principal": rec.principal,
            "name": rec.name,
            "created_at": iso(rec.created_at),
            "expires_at": iso(rec.expires_at),
        },
        status,
    )


async def create(request: web.Request) -> web.Response:
    c = ctx(request)
    p = principal(request)
    body = await read_json(request, "TokenRequest")
    target = _principal(request, body)
    name = _name(body)
    expires = _expires_at(body, c.daemon.clock.now())
    rec, token = await c.seq.submit(
        lambda now, ov: c.daemon.prepare_token(p, target, name, now, ov, expires_at=expires)
    )
    return _created(rec, token)


async def rotate(request: web.Request) -> web.Response:
    """``POST /tokens/{id}/rotate``: a new secret for the same principal; the old token
    stops at once, or after ``grace``."""
    c = ctx(request)
    p = principal(request)
    tid = request.match_info["id"]
    body = await read_json(request, "TokenRotation") if await request.read() else {}
    grace = _duration_ms(body, "grace") or 0
    expires = _expires_at(body, c.daemon.clock.now())
    rec, token, old = await c.seq.submit(
        lambda now, ov: binding.prepare_rotate(c.daemon, p, tid, grace, expires, now, ov)
    )
    if old.revoked_at is not None:
        _end_polls(c, old.principal)
    answer = {
        "id": rec.id,
        "token": token,
        "principal": rec.principal,
        "name": rec.name,
        "created_at": iso(rec.created_at),
        "expires_at": iso(rec.expires_at),
        "rotated_from": old.id,
    }
    return reply(answer, 201)


async def list_tokens(request: web.Request) -> web.Response:
    book = ctx(request).daemon.tokens
    return reply(
        {"tokens": [views.token(r) for r in sorted(book.by_id.values(), key=lambda r: r.id)]}
    )


async def revoke(request: web.Request) -> web.Response:
    c = ctx(request)
    p = principal(request)
    tid = request.match_info["id"]
    await c.seq.submit(lambda now, ov: binding.prepare_revoke(c.daemon, p, tid, now, ov))
    rec = c.daemon.tokens.by_id.get(tid)
    if rec is not None:
        _end_polls(c, rec.principal)
    return web.Response(status=204)


ADMIN = ("admin",)

ROUTES = [
    Route("POST", "/v1/tokens", create, "createToken", ADMIN),
    Route("GET", "/v1/tokens", list_tokens, "listTokens", ADMIN),
    Route("DELETE", "/v1/tokens/{id}", revoke, "revokeToken", ADMIN),
    Route("POST", "/v1/tokens/{id}/rotate", rotate, "rotateToken", ADMIN),
]
