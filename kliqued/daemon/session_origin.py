"""Where sessions are served, and what crosses between a session's app and the browser
(issue 25, items 1 and 4; docs/channels.md "Sessions", docs/security.md).

Why: a session's app is code its user wrote or chose. Served on the control plane's own
origin, its pages would run as the dashboard for whoever opens them (an admin sent a link:
the audit log, everyone's tasks, the ledger), and its ``Set-Cookie`` headers would reach the
dashboard's cookies. So sessions are served by a listener of their own (another origin), one
subdomain per session with ``--sessions-domain``, and the pure functions here decide:

- which cookies of the browser the app may see (never the control plane's ``klique_*``);
- which ``Set-Cookie`` of the app may reach the browser (not one naming a control-plane
  cookie, nor one for another path than the session's, nor one for a whole domain);
- which of the app's answer headers are dropped (those that act beyond the app's own pages:
  ``Clear-Site-Data`` clears a whole site, the dashboard's cookies included;
  ``Service-Worker-Allowed`` lets a service worker take every session's paths);
- the headers every session answer carries (a CSP that keeps the page from connecting to
  anything but its own origin and from being framed by another).

No I/O: the listener (``session_site``) and the proxy (``handlers/sessions``) call these.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

PREFIX = "/sessions/"
CONTROL_COOKIE_PREFIX = "klique_"
"""Every cookie the control plane sets starts so (the dashboard's ``klique_session``, the
sessions' ``klique_app_session``): none reaches an app, none may be set by one."""

CSP = (
    "frame-ancestors 'self'; connect-src 'self'; form-action 'self'; base-uri 'self'; "
    "object-src 'none'"
)
"""The session's page may fetch and open WebSockets to its own origin only (not the control
plane's, not another session's), may be framed by itself only (JupyterLab frames its own
pages), and posts forms to itself. Scripts and styles are left to the app (JupyterLab and
code-server need their own inline ones); an app's own CSP, if it sends one, applies too."""

HEADERS: tuple[tuple[str, str], ...] = (
    ("Content-Security-Policy", CSP),
    ("X-Frame-Options", "SAMEORIGIN"),
    ("Cross-Origin-Opener-Policy", "same-origin"),
    ("Cross-Origin-Resource-Policy", "same-origin"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "same-origin"),
)
"""Sent on every answer of the sessions' listener (the app's and the proxy's own)."""

DROPPED = frozenset({"clear-site-data", "service-worker-allowed"})
"""The app's answer headers never passed on (lower case)."""

_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


class OriginError(ValueError):
    """A ``--sessions-domain`` or ``--sessions-listen`` value that cannot be used."""


@dataclass(frozen=True)
class SessionOrigin:
    """How sessions' URLs are made and read. ``domain`` set: session ``t-x`` is served at
    ``scheme://t-x.domain[:port]`` only (its path keeps ``/sessions/t-x/``, the prefix the
    worker gives the app); None: at ``base/sessions/t-x/``, ``base`` the sessions' listener
    (one origin for every session: see docs/decisions.md)."""

    base: str
    domain: str | None = None
    scheme: str = "https"
    port: int | None = None

    def origin(self, task: str) -> str:
        if self.domain is None:
            return self.base
        port = f":{self.port}" if self.port is not None else ""
        return f"{self.scheme}://{task.lower()}.{self.domain}{port}"

    def url(self, task: str) -> str:
        return f"{self.origin(task)}{PREFIX}{task}/"

    def task_of_host(self, host: str) -> str | None:
        """The session a ``Host`` header names (domain mode): ``t-01abc.sessions.example.org``
        is ``t-01ABC`` (browsers lower-case host names; task ids are ``t-`` and upper-case
        base32); None for any other host."""
        if self.domain is None:
            return None
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        label, dot, rest = name.lower().partition(".")
        if (
            not dot
            or rest != self.domain
            or not label.startswith("t-")
            or not _LABEL.fullmatch(label)
        ):
            return None
        return "t-" + label[2:].upper()


def parse_domain(text: str) -> tuple[str, str, int | None]:
    """``--sessions-domain``: ``sessions.example.org`` (https, port 443), or with a scheme
    and port (``http://sessions.test:8081``, for a test or a proxy on another port); returns
    (scheme, domain, port)."""
    raw = text.strip()
    parts = urlsplit(raw if "://" in raw else f"https://{raw}")
    domain = (parts.hostname or "").rstrip(".")
    try:
        port = parts.port
    except ValueError:
        port = -1
    if (
        parts.scheme not in ("http", "https")
        or port == -1
        or parts.path not in ("", "/")
        or parts.query
        or parts.username
        or not domain
        or not all(_LABEL.fullmatch(label) for label in domain.split("."))
    ):
        raise OriginError(
            f"--sessions-domain must be a DNS domain whose subdomains reach the "
            f"sessions' listener, e.g. sessions.example.org or "
            f"http://sessions.test:8081; found {text!r}"
        )
    return parts.scheme, domain, port


def _name(cookie: str) -> str:
    return cookie.split("=", 1)[0].strip()


def is_control_cookie(name: str) -> bool:
    """``klique_*`` (also behind a ``__Host-``/``__Secure-`` prefix), in any case."""
    bare = re.sub(r"^__(host|secure)-", "", name.strip(), flags=re.IGNORECASE)
    return bare.lower().startswith(CONTROL_COOKIE_PREFIX)


def app_cookies(header: str) -> str:
    """The browser's ``Cookie`` header as the app may see it: without the control plane's
    cookies (the dashboard's sign-in, the session's own access cookie)."""
    return "; ".join(
        part
        for part in (s.strip() for s in header.split(";"))
        if part and not is_control_cookie(_name(part))
    )


def cookie_values(header: str, name: str) -> list[str]:
    """Every value of cookie ``name`` in a ``Cookie`` header, in its order. A browser sends
    several when a page planted one with a longer path beside the real one (cookie
    tossing); a reader that took one of them could be made to take the planted one."""
    out = []
    for part in header.split(";"):
        key, eq, value = part.strip().partition("=")
        if eq and key == name:
            out.append(value.strip().strip('"'))
    return out


def set_cookie_refusal(value: str, prefix: str) -> str | None:
    """Why the app's ``Set-Cookie: value`` must not reach the browser, or None. ``prefix``
    is the session's path (``/sessions/t-x/``)."""
    name = _name(value.split(";", 1)[0])
    if is_control_cookie(name):
        return f"cookie {name!r} is the control plane's"
    for attr in value.split(";")[1:]:
        key, _, val = attr.strip().partition("=")
        key = key.strip().lower()
        if key == "domain":
            return f"cookie {name!r} names a domain ({val.strip()!r}): it would reach other hosts"
        if key == "path":
            path = val.strip()
            if not (path.startswith(prefix) or path == prefix.rstrip("/")):
                return f"cookie {name!r} has path {path!r}, outside the session's {prefix}"
    return None
