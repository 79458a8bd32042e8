"""The relying party's side of OpenID Connect, for the dashboard's sign-in (authorization code
with PKCE, state and nonce) and ``kliqued login`` (the device authorization grant, refresh):
discovery, the authorization URL, and the token endpoint's grants. Blocking calls with a
timeout and a size cap (``urllib``): the daemon runs them on a thread, the CLI directly.
Verifying the ID token is not here: the daemon does it (``kliqued.daemon.identity``), with
the same checks for every way in.

No secrets: the clients are public (PKCE), as a dashboard behind a daemon and a CLI on a
laptop cannot keep one.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

TIMEOUT_S = 10.0
MAX_BYTES = 1 << 20
DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"


class OidcError(Exception):
    """The provider could not be used: the message says which call and why."""


class Pending(OidcError):
    """The device grant's ``authorization_pending`` or ``slow_down``: ask again later."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


def _read(req: urllib.request.Request, what: str, timeout_s: float) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310
            body = resp.read(MAX_BYTES + 1)
    except urllib.error.HTTPError as e:
        body = e.read(MAX_BYTES)
        try:
            err = json.loads(body)
        except ValueError:
            err = {}
        code = err.get("error") if isinstance(err, dict) else None
        if code in ("authorization_pending", "slow_down"):
            raise Pending(str(code)) from None
        detail = err.get("error_description") if isinstance(err, dict) else None
        raise OidcError(
            f"{what}: HTTP {e.code}"
            + (f" {code}" if code else "")
            + (f" ({detail})" if detail else "")
        ) from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise OidcError(f"{what}: could not be reached ({getattr(e, 'reason', e)})") from None
    try:
        data = json.loads(body)
    except ValueError:
        raise OidcError(f"{what}: the answer is not JSON") from None
    if not isinstance(data, dict):
        raise OidcError(f"{what}: the answer is not a JSON object")
    return data


@dataclass(frozen=True)
class Endpoints:
    issuer: str
    authorization: str
    token: str
    device: str | None


def discover(issuer: str, timeout_s: float = TIMEOUT_S) -> Endpoints:
    url = issuer.rstrip("/") + "/.well-known/openid-configuration"
    doc = _read(urllib.request.Request(url), f"discovery of {issuer}", timeout_s)
    if doc.get("issuer") != issuer:
        raise OidcError(f"discovery of {issuer}: it names the issuer {doc.get('issuer')!r}")
    auth, token = doc.get("authorization_endpoint"), doc.get("token_endpoint")
    if not isinstance(auth, str) or not isinstance(token, str):
        raise OidcError(f"discovery of {issuer}: no authorization or token endpoint")
    device = doc.get("device_authorization_endpoint")
    return Endpoints(issuer, auth, token, device if isinstance(device, str) else None)


def pkce() -> tuple[str, str]:
    """(verifier, S256 challenge): RFC 7636."""
    verifier = secrets.token_urlsafe(48)
    digest = hashlib.sha256(verifier.encode()).digest()
    return verifier, base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def authorization_url(
    ep: Endpoints,
    client_id: str,
    redirect_uri: str,
    scopes: list[str],
    state: str,
    nonce: str,
    challenge: str,
) -> str:
    query = urllib.parse.urlencode(
        {
            "response_type": "code",
            "client_id": client_id,
            "redirect_uri": redirect_uri,
            "scope": " ".join(scopes),
            "state": state,
            "nonce": nonce,
            "code_challenge": challenge,
            "code_challenge_method": "S256",
        }
    )
    sep = "&" if "?" in ep.authorization else "?"
    return f"{ep.authorization}{sep}{query}"


def _post(url: str, form: dict[str, str], what: str, timeout_s: float) -> dict[str, Any]:
    req = urllib.request.Request(
        url,
        data=urllib.parse.urlencode(form).encode(),
        headers={"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"},
    )
    return _read(req, what, timeout_s)


def redeem_code(
    ep: Endpoints,
    client_id: str,
    code: str,
    redirect_uri: str,
    verifier: str,
    timeout_s: float = TIMEOUT_S,
) -> dict[str, Any]:
    """The token endpoint's answer for an authorization code (``id_token`` in it)."""
    return _post(
        ep.token,
        {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": redirect_uri,
            "client_id": client_id,
            "code_verifier": verifier,
        },
        f"the token endpoint of {ep.issuer}",
        timeout_s,
    )


def start_device(
    ep: Endpoints, client_id: str, scopes: list[str], timeout_s: float = TIMEOUT_S
) -> dict[str, Any]:
    """RFC 8628 3.1: ``device_code``, ``user_code``, ``verification_uri(_complete)``."""
    if ep.device is None:
        raise OidcError(f"{ep.issuer} offers no device authorization grant")
    return _post(
        ep.device,
        {"client_id": client_id, "scope": " ".join(scopes)},
        f"the device authorization endpoint of {ep.issuer}",
        timeout_s,
    )


def poll_device(
    ep: Endpoints, client_id: str, device_code: str, timeout_s: float = TIMEOUT_S
) -> dict[str, Any]:
    """One poll of the token endpoint (:class:`Pending` while the person has not approved)."""
    return _post(
        ep.token,
        {"grant_type": DEVICE_GRANT, "device_code": device_code, "client_id": client_id},
        f"the token endpoint of {ep.issuer}",
        timeout_s,
    )


def refresh(
    ep: Endpoints, client_id: str, refresh_token: str, timeout_s: float = TIMEOUT_S
) -> dict[str, Any]:
    return _post(
        ep.token,
        {"grant_type": "refresh_token", "refresh_token": refresh_token, "client_id": client_id},
        f"the token endpoint of {ep.issuer} (refresh)",
        timeout_s,
    )
