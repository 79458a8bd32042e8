"""The dashboard signs people in through their organisation's identity provider (issue 30):
OpenID Connect's authorization code flow with PKCE, ``state`` and ``nonce``.

``GET /signin/oidc?provider=NAME`` makes a one-time ``state``, a ``nonce`` and a PKCE
verifier, keeps them here (10 minutes, one use) and binds them to this browser with a cookie
(``kq_oidc``, SameSite=Lax so that the provider's redirect back carries it), then sends the
browser to the provider. ``GET /signin/oidc/callback`` takes the ``state`` once: unknown,
used, expired or from another browser is refused; the code is redeemed with the verifier
(the provider refuses a code twice), the ID token verified as every provider token is
(``kliqued.daemon.identity.verify``) and its ``nonce`` compared; the person is mapped by the
estate, a short-lived Klique token is made in the same commit as the audit's record, and a
dashboard session is opened on it, as with a pasted token. Every refusal is a page that says
why and links back to the sign-in.
"""

from __future__ import annotations

import asyncio
import hmac
import secrets
import time

from aiohttp import web

from klique_util import oidc_client
from klique_util.excerpt import excerpt
from kliqued.daemon.api.request import ctx
from kliqued.daemon.errors import ApiError
from kliqued.daemon.identity import mapping
from kliqued.daemon.identity.verify import verify

from . import session
from .frame import error, redirect, state
from .pending import TTL_S, Pending
from .signin import _home, _next

COOKIE = "kq_oidc"
PATH = "/signin/oidc"
CALLBACK = "/signin/oidc/callback"


def _refused(request: web.Request, why: str, status: int = 400) -> web.Response:
    return error(request, status, f"sign-in refused: {why}. Start again from /signin")


async def start(request: web.Request) -> web.StreamResponse:
    d = ctx(request).daemon
    ident = d.idx().estate.settings.identity
    name = request.query.get("provider", "")
    prov = next((p for p in (ident.providers if ident else []) if p.name == name), None)
    if prov is None:
        return _refused(request, f"no identity provider {excerpt(name)} in the running estate", 404)
    role = request.query.get("role") or None
    if role not in (None, "admin", "finance", "planner"):
        return _refused(request, f"no role {excerpt(role)}")
    try:
        ep = await asyncio.to_thread(oidc_client.discover, prov.issuer)
    except oidc_client.OidcError as e:
        return _refused(request, f"{prov.name} could not be read: {e}", 503)
    st, nonce, binding = (secrets.token_urlsafe(24) for _ in range(3))
    verifier, challenge = oidc_client.pkce()
    redirect_uri = f"{request.scheme}://{request.host}{CALLBACK}"
    state(request).oidc.add(
        st,
        Pending(
            prov.name,
            verifier,
            nonce,
            binding,
            _next(request.query.get("next")),
            role,
            redirect_uri,
            time.monotonic() + TTL_S,
        ),
    )
    resp = redirect(
        oidc_client.authorization_url(
            ep, prov.client_id, redirect_uri, prov.scopes, st, nonce, challenge
        )
    )
    resp.set_cookie(
        COOKIE,
        binding,
        max_age=TTL_S,
        path=PATH,
        httponly=True,
        samesite="Lax",
        secure=request.secure,
    )
    return resp


async def callback(request: web.Request) -> web.StreamResponse:
    c = ctx(request)
    d = c.daemon
    q = request.query
    pending = state(request).oidc.take(q.get("state", ""))
    if pending is None:
        return _refused(request, "the sign-in's state is unknown, already used or expired")
    if not hmac.compare_digest(request.cookies.get(COOKIE, ""), pending.binding):
        return _refused(request, "this sign-in was started in another browser")
    if q.get("error"):
        return _refused(
            request,
            f"the provider answered {excerpt(q['error'])}"
            + (f": {excerpt(q.get('error_description'))}" if q.get("error_description") else ""),
            401,
        )
    ident = d.idx().estate.settings.identity
    prov = next((p for p in (ident.providers if ident else []) if p.name == pending.provider), None)
    if prov is None or not q.get("code"):
        return _refused(request, "no code, or the provider is no longer in the estate")
    try:
        ep = await asyncio.to_thread(oidc_client.discover, prov.issuer)
        answer = await asyncio.to_thread(
            oidc_client.redeem_code,
            ep,
            prov.client_id,
            q["code"],
            pending.redirect_uri,
            pending.verifier,
        )
    except oidc_client.OidcError as e:
        return _refused(request, f"the provider refused the code ({e})", 401)
    id_token = answer.get("id_token")
    if not isinstance(id_token, str):
        return _refused(request, "the provider's answer has no id_token", 401)
    try:
        v = await verify(id_token, ident, c.keys, d.clock.now())
        if not hmac.compare_digest(str(v.claims.get("nonce", "")), pending.nonce):
            return _refused(request, "the ID token's nonce is not this sign-in's", 401)
        who = mapping.signed_in(v, d.idx().estate, d.acc(), pending.role)
    except ApiError as e:
        return _refused(request, e.message, e.status)
    lifetime = (ident.token_lifetime_s if ident else 3600) * 1000
    rec, _token = await c.seq.submit(
        lambda now, ov: d.prepare_signin_token(who, "dashboard", lifetime, now, ov)
    )
    sid, s = state(request).sessions.open(
        rec.id, rec.principal, d.tokens.seconds_left(rec.id, d.clock.now())
    )
    target = pending.next if pending.next != "/" else f"/{_home(d, who.principal)}"
    resp = redirect(target)
    session.set_cookie(request, resp, sid, s)
    resp.del_cookie(COOKIE, path=PATH)
    return resp
