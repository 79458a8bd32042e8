"""A real OpenID Provider for the tests: the npm ``oidc-provider`` package (certified) on the
machine's Node.js, installed once into ``<venv>/oidc-provider`` and started by its pid on a
free port, like PostgreSQL (tests/harness/postgres.py). No mocks: the daemon verifies the
tokens a real provider signs, and the dashboard and ``kliqued login`` talk its protocol.

Two shapes (``tests/harness/oidc_provider.mjs``): ``people``, a site's provider with the
development login form and the device grant; ``actions``, GitHub Actions' token service
(``ACTIONS_ID_TOKEN_REQUEST_URL``) with ``repository``/``ref`` claims. Each instance signs
with an RSA key made here, so two instances never share a key.

Without ``node``/``npm`` (or the registry, on the first run) :func:`unavailable` says why and
the tests that need a provider skip. ``make test`` installs the package first
(``tests/setup/oidc-provider.sh``).
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
from html.parser import HTMLParser
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from joserfc.jwk import RSAKey

from tests.harness.daemon import free_port
from tests.harness.wait import wait_for

VERSION = "9"
"""The major version of ``oidc-provider`` the config is written for."""
CACHE = Path(sys.prefix) / "oidc-provider"
"""Where the package is installed: beside the venv, so one install serves every run."""
SCRIPT = Path(__file__).with_name("oidc_provider.mjs")
LOOPBACK = ("http://127.0.0.1/signin/oidc/callback", "http://127.0.0.1/callback")
"""The clients' redirect URIs: the dashboard's callback and ``kliqued login``'s loopback."""


def installed() -> bool:
    return (CACHE / "node_modules" / "oidc-provider" / "package.json").exists()


def install() -> None:
    """``npm install oidc-provider@9`` into :data:`CACHE` (a no-op when present), under a
    file lock: xdist's workers may all ask at once on a machine where ``make test`` did
    not install it first."""
    if installed():
        return
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if installed():
            return
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--silent", f"oidc-provider@{VERSION}"],
            cwd=CACHE,
            check=True,
            capture_output=True,
            timeout=300,
        )


def unavailable() -> str | None:
    """Why no provider can be started here, or None (installing the package if need be)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        return (
            "Node.js and npm are not installed: install Debian's nodejs and npm packages "
            "(tests/setup/system-packages.sh) to run the sign-in tests"
        )
    try:
        install()
    except (subprocess.SubprocessError, OSError) as e:
        detail = getattr(e, "stderr", b"") or b""
        return (
            f"could not install the npm package oidc-provider@{VERSION} into {CACHE} "
            f"({e}; {detail.decode(errors='replace')[-300:]}): run "
            f"tests/setup/oidc-provider.sh with the npm registry reachable"
        )
    return None


def new_key(kid: str | None = None) -> dict[str, Any]:
    """A fresh RS256 signing key as a private JWK."""
    key = RSAKey.generate_key(2048, {"use": "sig", "alg": "RS256"}, private=True)
    data = key.as_dict(private=True)
    data["kid"] = kid or secrets.token_hex(8)
    return data


@dataclass
class Client:
    """An OAuth client registered at the provider: a public one (PKCE, no secret) of the
    ``native`` kind, whose loopback redirect URIs match on any port (RFC 8252 7.3), so the
    dashboard's callback and ``kliqued login``'s loopback need no port known in advance."""

    client_id: str
    redirect_uris: list[str] = field(default_factory=list)
    public: bool = True

    def registration(self) -> dict[str, Any]:
        grants = [
            "authorization_code",
            "refresh_token",
            "urn:ietf:params:oauth:grant-type:device_code",
        ]
        return {
            "client_id": self.client_id,
            "application_type": "native",
            "redirect_uris": self.redirect_uris or list(LOOPBACK),
            "grant_types": grants,
            "response_types": ["code"],
            "token_endpoint_auth_method": "none",
        }


class Provider:
    """One provider process. ``issuer`` is ``http://127.0.0.1:<port>``."""

    def __init__(
        self,
        kind: str = "people",
        clients: list[Client] | None = None,
        job: dict[str, str] | None = None,
        accounts: dict[str, dict[str, str]] | None = None,
    ) -> None:
        self.kind = kind
        self.clients = clients or []
        self.job = job or {"repository": "example-org/estate", "ref": "refs/heads/main"}
        self.accounts = accounts or {}
        self.port = free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        self.dir = Path(tempfile.mkdtemp(prefix="klique-oidc-"))
        self.key = new_key()
        self.request_token = secrets.token_urlsafe(24)
        self.proc: subprocess.Popen[bytes] | None = None

    def _config(self) -> Path:
        path = self.dir / "config.json"
        path.write_text(
            json.dumps(
                {
                    "port": self.port,
                    "kind": self.kind,
                    "clients": [c.registration() for c in self.clients],
                    "jwks": {"keys": [self.key]},
                    "request_token": self.request_token,
                    "job": self.job,
                    "accounts": self.accounts,
                }
            )
        )
        path.chmod(0o600)
        return path

    def start(self) -> "Provider":
        # ESM resolves `import 'oidc-provider'` from the script's folder: run a copy that
        # sits beside the installed node_modules (renamed into place: parallel workers).
        script = CACHE / f"klique-provider-{os.getpid()}-{self.port}.mjs"
        shutil.copyfile(SCRIPT, script)
        self._script = script
        log = open(self.dir / "provider.log", "ab")
        self.proc = subprocess.Popen(
            ["node", str(script), str(self._config())],
            stdout=log,
            stderr=log,
            cwd=CACHE,
        )
        log.close()
        wait_for(self._ready, 30, f"the OpenID Provider at {self.issuer} to answer")
        return self

    def _ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"oidc-provider exited {self.proc.returncode}:\n{self.log()}")
        try:
            r = httpx.get(f"{self.issuer}/.well-known/openid-configuration", timeout=2)
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    def restart(self, new_key: bool = False) -> "Provider":
        """Stops and starts it on the same port; with ``new_key``, signing with a new key
        (a key rotation at the provider)."""
        self._terminate()
        if new_key:
            self.key = globals()["new_key"]()
        return self.start()

    def discovery(self) -> dict[str, Any]:
        r = httpx.get(f"{self.issuer}/.well-known/openid-configuration", timeout=5)
        r.raise_for_status()
        result: dict[str, Any] = r.json()
        return result

    @property
    def actions_url(self) -> str:
        """``ACTIONS_ID_TOKEN_REQUEST_URL`` of the ``actions`` shape."""
        return f"{self.issuer}/_actions/token?api-version=2.0"

    def actions_token(self, audience: str, **job: str) -> str:
        """A job's ID token, as the runner would fetch it."""
        r = httpx.get(
            self.actions_url,
            params={"audience": audience, **job},
            headers={"Authorization": f"Bearer {self.request_token}"},
            timeout=5,
        )
        r.raise_for_status()
        value: str = r.json()["value"]
        return value

    def log(self) -> str:
        try:
            return (self.dir / "provider.log").read_text(errors="replace")
        except OSError:
            return ""

    def _terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        script = getattr(self, "_script", None)
        if script is not None:
            script.unlink(missing_ok=True)

    def stop(self) -> None:
        try:
            self._terminate()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


class _Forms(HTMLParser):
    """The forms of a page: action, method and the named inputs' values."""

    def __init__(self) -> None:
        super().__init__()
        self.forms: list[dict[str, Any]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "form":
            self.forms.append(
                {
                    "action": a.get("action") or "",
                    "method": (a.get("method") or "get").lower(),
                    "inputs": {},
                }
            )
        elif tag in ("input", "button") and self.forms and a.get("name"):
            self.forms[-1]["inputs"].setdefault(a["name"], a.get("value") or "")


def walk(provider: Provider, url: str, login: str, http: httpx.Client | None = None) -> str | None:
    """A person at the provider's development login form, as a browser would be: follows
    redirects within the provider, fills ``login`` (any name is accepted) and confirms
    consent, until a redirect leaves the provider (returned: the client's redirect URI with
    ``code`` and ``state``) or a page has no form left (None: the device grant's success
    page). What a browser test does with Chromium, for the tests whose subject is not the
    browser (``kliqued login``, the daemon's checks)."""
    own = http or httpx.Client(follow_redirects=False, timeout=10)
    try:
        r = own.get(url)
        for _ in range(20):
            if r.is_redirect:
                loc = str(r.headers["location"])
                target = str(r.url.join(loc))
                if not target.startswith(provider.issuer):
                    return target
                r = own.get(target)
                continue
            assert r.status_code == 200, f"{r.url}: {r.status_code} {r.text[:500]}"
            forms = _Forms()
            forms.feed(r.text)
            posts = [f for f in forms.forms if f["method"] == "post"]
            if not posts:
                return None
            form = posts[0]
            data = dict(form["inputs"])
            if "login" in data:
                data["login"], data["password"] = login, "any"
            data.pop("abort", None)
            r = own.post(str(r.url.join(form["action"] or str(r.url))), data=data)
        raise AssertionError(f"no end to the sign-in after 20 pages (last {r.url})")
    finally:
        if http is None:
            own.close()


def pkce_pair() -> tuple[str, str]:
    """(verifier, S256 challenge)."""
    verifier = secrets.token_urlsafe(48)
    digest = hashlib.sha256(verifier.encode()).digest()
    return verifier, base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def code_tokens(provider: Provider, login: str, client_id: str = "klique") -> dict[str, Any]:
    """The token endpoint's answer (``id_token``, ``access_token``) for ``login``, signed in
    through the authorization code grant with PKCE and the development form."""
    verifier, challenge = pkce_pair()
    redirect = "http://127.0.0.1:9/callback"
    query = httpx.QueryParams(
        client_id=client_id,
        response_type="code",
        scope="openid profile email",
        redirect_uri=redirect,
        code_challenge=challenge,
        code_challenge_method="S256",
        state=secrets.token_urlsafe(8),
        nonce=secrets.token_urlsafe(8),
    )
    back = walk(provider, f"{provider.issuer}/auth?{query}", login)
    assert back is not None, "the provider did not redirect back"
    code = httpx.URL(back).params["code"]
    r = httpx.post(
        f"{provider.issuer}/token",
        data={
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": redirect,
            "client_id": client_id,
            "code_verifier": verifier,
        },
        timeout=10,
    )
    r.raise_for_status()
    answer: dict[str, Any] = r.json()
    return answer


def id_token(provider: Provider, login: str) -> str:
    token: str = code_tokens(provider, login)["id_token"]
    return token
