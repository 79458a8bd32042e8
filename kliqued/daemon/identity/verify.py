"""Is a bearer JWT a token of an issuer the estate trusts, signed, for us, and current?

The order matters for what a refusal can say and what it costs: the token's (unverified)
``iss`` picks the estate's settings for it (an issuer not trusted is refused before any key is
fetched); its header's ``alg`` must be one the estate accepts (never ``none`` or HS*: the
estate cannot name them); the key comes from the issuer's JWKS by ``kid``; joserfc checks the
signature, then ``iss``, ``aud``, ``exp``, ``nbf`` and ``iat`` against the daemon's clock
with the issuer's leeway. Every refusal is a 401 (503 when the provider cannot be read) whose
message names what failed; the token itself is never quoted, logged or kept.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from typing import Any

from joserfc import jwt
from joserfc.errors import (
    BadSignatureError,
    ClaimError,
    ExpiredTokenError,
    InvalidClaimError,
    JoseError,
    MissingClaimError,
)
from joserfc.jwt import JWTClaimsRegistry

from compiler.compiled import CIdentity, CPeopleProvider, CWorkload
from klique_util.excerpt import excerpt

from kliqued.daemon.errors import ApiError
from kliqued.daemon.identity.keys import KeyCache, Unreachable, UnknownKey
from kliqued.daemon.units import iso

_JWT = re.compile(r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$")
MAX_TOKEN = 16 * 1024
"""An ID token is 1-3 kB; a header of more is refused before any parsing."""


def looks_like_jwt(token: str) -> bool:
    """A compact JWS (three base64url parts), not a ``kq_`` token: the identity path."""
    return not token.startswith("kq_") and len(token) <= MAX_TOKEN and bool(_JWT.match(token))


@dataclass(frozen=True, slots=True)
class Verified:
    """A token that passed every check: whose settings it matched, and its claims."""

    issuer: CPeopleProvider | CWorkload
    claims: dict[str, Any]

    @property
    def subject(self) -> str:
        return str(self.claims.get("sub", ""))

    @property
    def expires_ms(self) -> int:
        return int(self.claims["exp"]) * 1000


def unauthenticated(message: str) -> ApiError:
    return ApiError(401, "unauthenticated", message)


def _part(segment: str, what: str) -> dict[str, Any]:
    try:
        data = json.loads(base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4)))
    except ValueError:
        raise unauthenticated(f"the token's {what} is not base64url JSON") from None
    if not isinstance(data, dict):
        raise unauthenticated(f"the token's {what} is not a JSON object")
    return data


def settings_for(identity: CIdentity | None, iss: str) -> CPeopleProvider | CWorkload | None:
    if identity is None:
        return None
    for p in identity.providers:
        if p.issuer == iss:
            return p
    for w in identity.workloads:
        if w.issuer == iss:
            return w
    return None


async def verify(token: str, identity: CIdentity | None, keys: KeyCache, now_ms: int) -> Verified:
    head, body, _ = token.split(".")
    header = _part(head, "header")
    unverified = _part(body, "payload")
    iss = unverified.get("iss")
    if not isinstance(iss, str):
        raise unauthenticated("the token names no issuer ('iss')")
    cfg = settings_for(identity, iss)
    if cfg is None:
        raise unauthenticated(
            f"tokens of the issuer {excerpt(iss)} are not trusted here: settings.identity "
            "names the providers and CI issuers this daemon accepts"
        )
    alg = header.get("alg")
    if alg not in cfg.algorithms:
        raise unauthenticated(
            f"the token is signed with {excerpt(str(alg))}, which {cfg.name} may not use here "
            f"(accepted: {', '.join(cfg.algorithms)})"
        )
    kid = header.get("kid")
    if kid is not None and not isinstance(kid, str):
        raise unauthenticated("the token's 'kid' is not a string")
    try:
        key = await keys.key(cfg.issuer, kid, now_ms)
    except Unreachable as e:
        raise ApiError(503, "provider-unreachable", str(e)) from None
    except UnknownKey:
        raise unauthenticated(
            f"unknown signing key {excerpt(kid or '(none)')} for {cfg.name} ({cfg.issuer}): "
            "not in its published keys"
        ) from None
    try:
        decoded = jwt.decode(token, key, algorithms=list(cfg.algorithms))
    except BadSignatureError:
        raise unauthenticated(f"the token's signature does not verify with {cfg.name}'s key")
    except JoseError as e:
        raise unauthenticated(f"the token could not be read ({e.error})") from None
    claims = dict(decoded.claims)
    registry = JWTClaimsRegistry(
        now=now_ms // 1000,
        leeway=cfg.leeway_s,
        iss={"essential": True, "value": cfg.issuer},
        aud={"essential": True, "value": cfg.audience},
        exp={"essential": True},
        sub={"essential": True},
    )
    try:
        registry.validate(claims)
    except ExpiredTokenError:
        raise unauthenticated(
            f"the token expired on {iso(int(claims['exp']) * 1000)} (a leeway of "
            f"{cfg.leeway_s}s allowed): sign in again"
        ) from None
    except MissingClaimError as e:
        raise unauthenticated(f"the token has no '{e.claim}' claim") from None
    except InvalidClaimError as e:
        raise unauthenticated(_invalid(e.claim, claims, cfg)) from None
    except ClaimError as e:
        raise unauthenticated(f"the token's claims were refused ({e.error})") from None
    return Verified(cfg, claims)


def _invalid(claim: str, claims: dict[str, Any], cfg: CPeopleProvider | CWorkload) -> str:
    if claim == "aud":
        return (
            f"wrong audience: the token is for {excerpt(claims.get('aud'))}, this daemon is "
            f"{excerpt(cfg.audience)} ({cfg.name})"
        )
    if claim in ("nbf", "iat"):
        at = claims.get(claim)
        when = iso(int(at) * 1000) if isinstance(at, (int, float)) else excerpt(at)
        return f"the token is not valid yet ('{claim}' is {when}, beyond the leeway of {cfg.leeway_s}s)"
    return f"the token's '{claim}' claim is not what {cfg.name} issues"
