"""Where the SDK and CLI find the server and the token, as kubectl does.

For the URL and for the token, the first of these that gives one wins:

1. the explicit argument (``--url`` / ``--token``);
2. the context named explicitly (``--context``) in the config file;
3. the environment (``KLIQUE_URL`` / ``KLIQUE_TOKEN``; ``KLIQUE_URL=a,b``: several daemons
   of one control plane, the leader followed, docs/ha.md);
4. the config file's ``current-context``.

The config file is ``$KLIQUE_CONFIG`` or ``~/.config/klique/config.yaml``::

    current-context: northwind
    contexts:
      - name: northwind
        url: https://klique.northwind.example:8443   # or a list: several daemons
        token-file: ~/.config/klique/alice.token   # or: token: kq_...
        ca-file: ~/.config/klique/ca.pem           # optional, a private CA for HTTPS

A context written by ``kliqued login`` (issue 30) also has ``token-expires`` and ``login``:
its token is renewed through the identity provider when it nears its end
(:mod:`kliqued.sdk.login`), so the CLI, the SDK and ``kliqued mcp`` all stay signed in.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError

ENV_URL = "KLIQUE_URL"
ENV_TOKEN = "KLIQUE_TOKEN"
ENV_CONFIG = "KLIQUE_CONFIG"
DEFAULT_CONFIG = "~/.config/klique/config.yaml"


@dataclass(frozen=True)
class Resolved:
    url: str
    token: str
    ca_file: str | None = None
    context: str | None = None
    source: str = ""
    """Where the URL and token came from, for messages."""


def config_path() -> Path:
    return Path(os.environ.get(ENV_CONFIG) or DEFAULT_CONFIG).expanduser()


def _load(path: Path) -> dict:
    from ruamel.yaml import YAML, YAMLError

    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(f"cannot read the config file {path}: {exc.strerror}") from None
    try:
        data = YAML(typ="safe").load(text)
    except YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with `current-context` and `contexts`")
    return data


def _context(data: dict, name: str, path: Path) -> dict:
    contexts = data.get("contexts") or []
    if not isinstance(contexts, list):
        raise ConfigError(f"{path}: `contexts` must be a list of {{name, url, token}}")
    for ctx in contexts:
        if isinstance(ctx, dict) and ctx.get("name") == name:
            return ctx
    names = ", ".join(str(c.get("name")) for c in contexts if isinstance(c, dict)) or "none"
    raise ConfigError(f"no context {name!r} in {path} (contexts: {names})")


def _token_of(ctx: dict, path: Path) -> str | None:
    if ctx.get("token"):
        return str(ctx["token"]).strip()
    if ctx.get("token-file"):
        file = Path(str(ctx["token-file"])).expanduser()
        if not file.is_absolute():
            file = path.parent / file
        try:
            return file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(
                f"cannot read the token file {file} of context "
                f"{ctx.get('name')!r} in {path}: {exc.strerror}"
            ) from None
    return None


def resolve(
    url: str | None = None, token: str | None = None, context: str | None = None
) -> Resolved:
    """The URL and token to use, or a :class:`ConfigError` naming what is missing and the
    three places it could come from."""
    path = config_path()
    data = _load(path)
    chosen = context or data.get("current-context")
    ctx: dict = {}
    broken: ConfigError | None = None
    if context:
        ctx = _context(data, context, path)
    elif chosen and data:
        try:
            ctx = _context(data, str(chosen), path)
        except ConfigError as exc:  # matters only if the environment does not cover it
            broken = exc

    def from_ctx(key: str) -> str | None:
        if not ctx:
            return None
        value = _token_of(ctx, path) if key == "token" else ctx.get(key)
        if isinstance(value, list):  # url: [a, b]: several daemons (docs/ha.md)
            value = ",".join(str(v) for v in value)
        return str(value) if value else None

    def pick(explicit: str | None, env_name: str, key: str) -> tuple[str | None, str | None]:
        if key == "token" and ctx and not explicit and (context or not os.environ.get(env_name)):
            from .login import renew_if_due  # a sign-in's token near its end (kliqued login)

            renewed = renew_if_due(path, str(ctx.get("name")))
            if renewed:
                ctx["token"] = renewed
        if explicit:
            return explicit, "argument"
        if context and from_ctx(key):
            return from_ctx(key), f"context {context!r} in {path}"
        if os.environ.get(env_name):
            return os.environ[env_name], env_name
        if from_ctx(key):
            return from_ctx(key), f"context {chosen!r} in {path}"
        return None, None

    u, u_src = pick(url, ENV_URL, "url")
    t, t_src = pick(token, ENV_TOKEN, "token")
    where = f"the current context in {path}" if path.exists() else f"a config file {path}"
    if broken is not None and not (u and t):
        raise broken
    if not u:
        raise ConfigError(
            f"no server URL: pass --url, set {ENV_URL}, or add a context with a "
            f"`url` to {where} (kliqued serve listens on http://127.0.0.1:8080 "
            "by default)"
        )
    if not t:
        raise ConfigError(
            f"no token: pass --token, set {ENV_TOKEN}, or add `token` or "
            f"`token-file` to {where} (an admin creates tokens with "
            "`kliqued token create --user NAME`)"
        )
    ca = ctx.get("ca-file") if ctx else None
    if ca:
        ca = str(Path(str(ca)).expanduser())
    return Resolved(
        str(u),
        str(t).strip(),
        ca,
        str(chosen) if chosen else None,
        f"url from {u_src}, token from {t_src}",
    )
