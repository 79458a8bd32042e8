"""Tokens: created and revoked by admins, logged like every other change; only the hash is
stored, and the token itself is shown once, in the 201 answer."""

from __future__ import annotations

from aiohttp import web

from .. import views
from ..app import ctx, read_json, reply
from ..errors import ApiError, forbidden
from ..units import iso


def _admin(request: web.Request):
    p = request["principal"]
    if not p.is_admin:
        raise forbidden("only an admin manages tokens")
    return p


async def create(request: web.Request) -> web.Response:
    c = ctx(request)
    p = _admin(request)
    body = await read_json(request, "TokenRequest")
    if "user" in body:
        principal = f"user:{body['user']}"
    elif body.get("worker"):
        pool = body["pool"]
        if c.daemon.idx().estate.pool(pool) is None:
            raise ApiError(422, "unknown-pool", f"no pool {pool!r} in the running estate")
        principal = f"worker:{pool}"
    else:
        principal = f"role:{body['role']}"
    rec, token = await c.seq.submit(
        lambda now, ov: c.daemon.prepare_token(p, principal, body.get("name"), now, ov))
    return reply({"id": rec.id, "token": token, "principal": rec.principal,
                  "name": rec.name, "created_at": iso(rec.created_at)}, 201)


async def list_tokens(request: web.Request) -> web.Response:
    _admin(request)
    book = ctx(request).daemon.tokens
    return reply({"tokens": [views.token(r) for r in sorted(book.by_id.values(),
                                                            key=lambda r: r.id)]})


async def revoke(request: web.Request) -> web.Response:
    c = ctx(request)
    p = _admin(request)
    tid = request.match_info["id"]
    await c.seq.submit(lambda now, ov: c.daemon.prepare_revoke(p, tid, now, ov))
    return web.Response(status=204)
