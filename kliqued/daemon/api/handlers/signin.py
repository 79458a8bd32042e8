"""Sign-in with the organisation's identity (issue 30; docs/identity.md).

Two ways in, both verified by ``kliqued.daemon.identity`` against ``settings.identity``:

- **A bearer JWT** on any call (``Authorization: Bearer <ID or access token>``): a CI job's
  ID token (``kliqued plan --against`` in GitHub Actions or GitLab), or a person's. The
  middleware (``app.auth_middleware``) asks :func:`bearer` for its principal; the first
  request with each token is audited (``signed_in``, ``via: bearer``).
- **``POST /v1/signin``**: a person's ID token for a short-lived Klique token (``kliqued
  login``, the dashboard), made in the same commit as the audit's record. It ends with its
  lifetime, or at once when the person leaves the estate.

``GET /v1/signin`` lists the providers (issuer, public client id, scopes): what a client
needs to start a sign-in; nothing in it is a secret.
"""

from __future__ import annotations

import hashlib

from aiohttp import web

from compiler.compiled import CWorkload

from kliqued.daemon.api.request import ctx, read_json, reply
from kliqued.daemon.api.routes import PUBLIC, Route
from kliqued.daemon.auth import OIDC, Principal
from kliqued.daemon.errors import ApiError
from kliqued.daemon.identity import mapping
from kliqued.daemon.identity.verify import Verified, looks_like_jwt, verify
from kliqued.daemon.units import iso


async def _verified(request: web.Request, token: str) -> Verified:
    c = ctx(request)
    d = c.daemon
    return await verify(token, d.idx().estate.settings.identity, c.keys, d.clock.now())


async def bearer(request: web.Request, token: str) -> Principal:
    """The principal of a bearer JWT: verified, mapped by the estate, audited once."""
    c = ctx(request)
    d = c.daemon
    v = await _verified(request, token)
    who = mapping.signed_in(v, d.idx().estate, d.acc(), None)
    digest = hashlib.sha256(token.encode()).hexdigest()
    if c.seen.first(digest, v.expires_ms, d.clock.now()):
        await c.seq.submit(lambda now, ov: d.prepare_signed_in(who, "bearer", now, ov))
    return Principal(who.principal.kind, who.principal.name, f"{OIDC}{who.provider}:{digest[:12]}")


async def providers(request: web.Request) -> web.Response:
    ident = ctx(request).daemon.idx().estate.settings.identity
    found = [] if ident is None else ident.providers
    return reply(
        {
            "providers": [
                {"name": p.name, "issuer": p.issuer, "client_id": p.client_id, "scopes": p.scopes}
                for p in found
            ]
        }
    )


async def signin(request: web.Request) -> web.Response:
    """An ID token for a Klique token (201), refused with the reason (401, 403, 503)."""
    c = ctx(request)
    d = c.daemon
    body = await read_json(request, "SignInRequest")
    who, lifetime_ms = await exchange(request, body["id_token"], body.get("role"), "signin")
    rec, token = await c.seq.submit(
        lambda now, ov: d.prepare_signin_token(who, "signin", lifetime_ms, now, ov)
    )
    return reply(
        {
            "id": rec.id,
            "token": token,
            "principal": rec.principal,
            "name": rec.name,
            "created_at": iso(rec.created_at),
            "expires_at": iso(rec.expires_at),
        },
        201,
    )


async def exchange(
    request: web.Request, id_token: str, role: str | None, via: str
) -> tuple[mapping.SignedIn, int]:
    """Who a person's ID token names, and the lifetime of the Klique token they get; a job's
    token is refused here (it acts with its own token, call by call)."""
    d = ctx(request).daemon
    if not looks_like_jwt(id_token):
        raise ApiError(
            401, "unauthenticated", f"{via}: id_token is not a JWT (three base64url parts)"
        )
    v = await _verified(request, id_token)
    if isinstance(v.issuer, CWorkload):
        raise ApiError(
            403,
            "forbidden",
            f"{v.issuer.name} is a workload issuer: a CI job sends its own token on each "
            "call, it does not sign in",
        )
    who = mapping.signed_in(v, d.idx().estate, d.acc(), role)
    ident = d.idx().estate.settings.identity
    assert ident is not None  # verify found the issuer there
    return who, ident.token_lifetime_s * 1000


ROUTES = [
    Route("GET", "/v1/signin", providers, "listIdentityProviders", PUBLIC),
    Route("POST", "/v1/signin", signin, "signIn", PUBLIC),
]
