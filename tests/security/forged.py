"""Tokens a test makes itself, signed with a key no provider published (or not signed at
all): the forgeries the daemon must refuse. joserfc signs them, as an attacker's library
would."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

from joserfc import jwt
from joserfc.jwk import RSAKey

from tests.harness.oidc import new_key


def claims(issuer: str, audience: str, login: str, **more: Any) -> dict[str, Any]:
    now = int(time.time())
    return {
        "iss": issuer,
        "aud": audience,
        "sub": login,
        "preferred_username": login,
        "iat": now,
        "nbf": now,
        "exp": now + 300,
        **more,
    }


def forge(issuer: str, audience: str, login: str, kid: str | None = None, **more: Any) -> str:
    """An RS256 token with the right claims, signed by a fresh key of ours."""
    key = RSAKey.import_key(new_key(kid))
    header = {"alg": "RS256", "kid": key.kid}
    return jwt.encode(header, claims(issuer, audience, login, **more), key)


def unsigned(issuer: str, audience: str, login: str, kid: str | None = None) -> str:
    """``alg: none`` with an empty signature (RFC 7519 6.1's unsecured JWT)."""

    def part(obj: dict[str, Any]) -> str:
        raw = json.dumps(obj, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    header: dict[str, Any] = {"alg": "none", "typ": "JWT"}
    if kid:
        header["kid"] = kid
    return f"{part(header)}.{part(claims(issuer, audience, login))}."
