"""``kliqued login``: a person signs the CLI, the SDK and ``kliqued mcp`` in through the
organisation's identity provider (issue 30; docs/identity.md), and the sign-in renews itself.

The daemon names its providers (``GET /v1/signin``); the CLI runs the device authorization
grant (RFC 8628: a URL and a code to open anywhere, a browser on another machine included),
trades the ID token for a short-lived Klique token (``POST /v1/signin``) and stores it in a
context of the config file (0600) with the provider's refresh token::

    contexts:
      - name: corp
        url: https://klique.example.org
        token: kq_...                       # the Klique token: hours, not months
        token-expires: "2026-12-08T02:00:00Z"
        login: {provider: corp, issuer: https://login.example.org, client-id: klique,
                refresh-token: ..., role: admin}   # role only when asked for

Every client resolves its context through :func:`kliqued.sdk.config.resolve`, which calls
:func:`renew_if_due`: within ``RENEW_BEFORE_S`` of the token's end it refreshes at the
provider and trades the new ID token for a new Klique token, writing the context back; a
refresh the provider refuses (the person was disabled there) says to run ``kliqued login``.
"""

from __future__ import annotations

import json
import os
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from klique_util import oidc_client

from .errors import ConfigError

RENEW_BEFORE_S = 300
"""A token with less left than this is renewed before use."""
TIMEOUT_S = 15.0


@dataclass(frozen=True)
class SignedIn:
    principal: str
    token: str
    expires_at: str
    context: str


def _ssl(ca_file: str | None) -> ssl.SSLContext | None:
    return ssl.create_default_context(cafile=ca_file) if ca_file else None


def _api(
    url: str, path: str, body: dict[str, Any] | None = None, ca_file: str | None = None
) -> dict[str, Any]:
    """A call of the daemon's public sign-in endpoints; ConfigError with its message."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        f"{url.rstrip('/')}{path}",
        data=data,
        headers={"Content-Type": "application/json", "Accept": "application/json"},
        method="GET" if body is None else "POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S, context=_ssl(ca_file)) as r:  # noqa: S310
            out = json.loads(r.read(1 << 20))
    except urllib.error.HTTPError as e:
        try:
            message = json.loads(e.read(1 << 16))["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = f"HTTP {e.code}"
        raise ConfigError(f"{url}{path}: {message}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise ConfigError(f"{url}{path}: {getattr(e, 'reason', e)}") from None
    if not isinstance(out, dict):
        raise ConfigError(f"{url}{path}: not a JSON object")
    return out


def provider_of(url: str, name: str | None, ca_file: str | None = None) -> dict[str, Any]:
    found = _api(url, "/v1/signin", ca_file=ca_file).get("providers") or []
    names = ", ".join(p["name"] for p in found) or "none"
    if not found:
        raise ConfigError(
            f"{url} trusts no identity provider (settings.identity.providers): ask for an API "
            "token instead (kliqued token create)"
        )
    if name is None:
        if len(found) > 1:
            raise ConfigError(f"{url} has several providers ({names}): give --provider NAME")
        return dict(found[0])
    for p in found:
        if p["name"] == name:
            return dict(p)
    raise ConfigError(f"{url} has no provider {name!r} (providers: {names})")


def _exchange(url: str, id_token: str, role: str | None, ca_file: str | None) -> dict[str, Any]:
    from .bodies import signin

    return _api(url, "/v1/signin", signin("login", id_token, role or None), ca_file)


def device_login(
    url: str,
    provider: str | None,
    role: str | None,
    prompt: Callable[[str, str, str | None], None],
    ca_file: str | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(the provider, its token answer, the Klique token answer), after the person approved
    the device code. ``prompt(uri, user_code, uri_complete)`` shows them where to go."""
    prov = provider_of(url, provider, ca_file)
    try:
        ep = oidc_client.discover(prov["issuer"])
        scopes = list(dict.fromkeys([*prov["scopes"], "offline_access"]))
        start = oidc_client.start_device(ep, prov["client_id"], scopes)
        prompt(
            start["verification_uri"], start["user_code"], start.get("verification_uri_complete")
        )
        interval = float(start.get("interval") or 5)
        deadline = time.monotonic() + float(start.get("expires_in") or 600)
        while True:
            try:
                answer = oidc_client.poll_device(ep, prov["client_id"], start["device_code"])
                break
            except oidc_client.Pending as p:
                if time.monotonic() > deadline:
                    raise ConfigError(
                        "the code expired before it was approved: run kliqued login again"
                    ) from None
                interval += 5 if p.code == "slow_down" else 0
                sleep(interval)
    except oidc_client.OidcError as e:
        raise ConfigError(f"signing in through {prov['name']}: {e}") from None
    if not isinstance(answer.get("id_token"), str):
        raise ConfigError(f"{prov['name']} answered no ID token: is 'openid' among its scopes?")
    return prov, answer, _exchange(url, answer["id_token"], role, ca_file)


# --- the config file -------------------------------------------------------------------


def _load(path: Path) -> Any:
    from ruamel.yaml import YAML

    if not path.exists():
        return {}
    data = YAML().load(path.read_text(encoding="utf-8"))
    return data if data is not None else {}


def _save(path: Path, data: Any) -> None:
    """Written 0600 through a temporary file and a rename: it holds tokens."""
    import io

    from ruamel.yaml import YAML

    buf = io.StringIO()
    YAML().dump(data, buf)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(buf.getvalue())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def store(
    path: Path,
    context: str,
    url: str,
    prov: dict[str, Any],
    answer: dict[str, Any],
    klique: dict[str, Any],
    role: str | None,
) -> None:
    """The context ``context`` (made, or its token and login replaced); the current context
    when there was none."""
    data = _load(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with `current-context` and `contexts`")
    contexts = data.setdefault("contexts", [])
    ctx = next((c for c in contexts if isinstance(c, dict) and c.get("name") == context), None)
    if ctx is None:
        ctx = {"name": context}
        contexts.append(ctx)
    ctx["url"] = ctx.get("url") or url
    ctx.pop("token-file", None)
    ctx["token"] = klique["token"]
    ctx["token-expires"] = klique["expires_at"]
    login: dict[str, Any] = {
        "provider": prov["name"],
        "issuer": prov["issuer"],
        "client-id": prov["client_id"],
    }
    if answer.get("refresh_token"):
        login["refresh-token"] = answer["refresh_token"]
    if role:
        login["role"] = role
    ctx["login"] = login
    data.setdefault("current-context", context)
    _save(path, data)


def _seconds_left(expires: Any, now: float) -> float:
    try:
        at = datetime.fromisoformat(str(expires).replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    if at.tzinfo is None:
        at = at.replace(tzinfo=timezone.utc)
    return at.timestamp() - now


def renew_if_due(path: Path, name: str, now: float | None = None) -> str | None:
    """The renewed Klique token of context ``name`` when it was due (written back), else
    None. ConfigError when it cannot be renewed, saying to sign in again."""
    data = _load(path)
    ctx = next(
        (c for c in data.get("contexts") or [] if isinstance(c, dict) and c.get("name") == name),
        None,
    )
    if ctx is None or not isinstance(ctx.get("login"), dict):
        return None
    left = _seconds_left(ctx.get("token-expires"), time.time() if now is None else now)
    if left > RENEW_BEFORE_S:
        return None
    login = ctx["login"]
    again = f"run `kliqued login --context {name}` to sign in again"
    if not login.get("refresh-token"):
        raise ConfigError(f"the sign-in of context {name!r} has ended: {again}")
    url = str(ctx["url"][0] if isinstance(ctx.get("url"), list) else ctx.get("url"))
    ca = ctx.get("ca-file")
    try:
        ep = oidc_client.discover(str(login["issuer"]))
        answer = oidc_client.refresh(ep, str(login["client-id"]), str(login["refresh-token"]))
    except oidc_client.OidcError as e:
        raise ConfigError(f"renewing the sign-in of context {name!r}: {e}; {again}") from None
    if not isinstance(answer.get("id_token"), str):
        raise ConfigError(f"renewing context {name!r}: the provider answered no ID token; {again}")
    klique = _exchange(url, answer["id_token"], login.get("role"), str(ca) if ca else None)
    ctx["token"] = klique["token"]
    ctx["token-expires"] = klique["expires_at"]
    if answer.get("refresh_token"):
        login["refresh-token"] = answer["refresh_token"]
    _save(path, data)
    token: str = klique["token"]
    return token
