"""Sign-in sessions of the web UI: a token once, then a cookie.

The browser sends its API token once (the sign-in form's POST); the daemon checks it exactly
as the API does (``TokenBook.authenticate``) and answers with a random session id in a cookie
(HttpOnly, SameSite=Strict, Secure over TLS). The store is server-side and in memory: a
session names the token it was opened with, so revoking or expiring that token ends the
session at its next request, and signing out ends it at once (a signed cookie could not be
withdrawn). The cookie itself expires (Max-Age) after ``TTL_S`` or when the token expires,
whichever is sooner, so a browser does not keep it past either. A restart signs everyone
out, which costs a paste of the token.

A page of another port of this host (a session's app on the sessions' listener: cookies are
scoped by host, not port) may plant a ``klique_session`` cookie with a longer path beside
the real one; the browser then sends both. So every value sent is looked at, a value that
is no open session is ignored, and two different open sessions in one request are none
(``Sessions.find``).

CSRF: every POST must carry the session's own random ``csrf`` value in its form (the
synchroniser token), and a POST whose ``Origin`` names another site is refused before that,
sign-in included (login CSRF). SameSite=Strict already keeps the cookie off cross-site
requests; the token and the Origin check hold where a browser does not honour it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from aiohttp import web

from kliqued.daemon.session_origin import cookie_values as _values

COOKIE = "klique_session"
TTL_S = 12 * 3600
"""A session lasts a working day at most (its token's own expiry may end it sooner)."""
MAX_SESSIONS = 10_000
"""Oldest sessions are dropped beyond this: a flood of sign-ins cannot grow memory."""


@dataclass(slots=True)
class Session:
    token_id: str
    principal: str
    csrf: str
    expires: float
    """``time.monotonic()`` after which the session is over."""
    created: float = field(default_factory=time.monotonic)


def _key(sid: str) -> str:
    """Sessions are filed under a hash of their id: the store holds no usable cookie."""
    return hashlib.sha256(sid.encode("ascii", "replace")).hexdigest()


class Sessions:
    """The open sessions, by the hash of their id."""

    def __init__(self, ttl_s: float = TTL_S, cap: int = MAX_SESSIONS) -> None:
        self.ttl_s = ttl_s
        self.cap = cap
        self._by_key: OrderedDict[str, Session] = OrderedDict()

    def open(
        self, token_id: str, principal: str, token_left_s: float | None = None
    ) -> tuple[str, Session]:
        """A new session of ``token_id``; it ends after ``ttl_s``, or in ``token_left_s``
        (the token's own expiry) if sooner."""
        sid = secrets.token_urlsafe(32)
        ttl = self.ttl_s if token_left_s is None else min(self.ttl_s, token_left_s)
        s = Session(token_id, principal, secrets.token_urlsafe(32), time.monotonic() + ttl)
        self._by_key[_key(sid)] = s
        while len(self._by_key) > self.cap:
            self._by_key.popitem(last=False)
        return sid, s

    def get(self, sid: str | None) -> Session | None:
        if not sid:
            return None
        key = _key(sid)
        s = self._by_key.get(key)
        if s is not None and time.monotonic() >= s.expires:
            del self._by_key[key]
            return None
        return s

    def find(self, sids: list[str]) -> tuple[str | None, Session | None]:
        """The one open session among the cookie values a request sent (see the module's
        docstring); (None, None) when there is none, or more than one."""
        found = {sid: s for sid in sids if (s := self.get(sid)) is not None}
        if len(found) != 1:
            return None, None
        return next(iter(found.items()))

    def close(self, sid: str | None) -> None:
        if sid:
            self._by_key.pop(_key(sid), None)

    def __len__(self) -> int:
        return len(self._by_key)


def cookie_values(request: web.Request) -> list[str]:
    """Every ``klique_session`` value the request sent."""
    return _values(request.headers.get("Cookie", ""), COOKIE)


def set_cookie(request: web.Request, resp: web.StreamResponse, sid: str, s: Session) -> None:
    """The cookie expires with the session: ``TTL_S`` or the token's expiry."""
    resp.set_cookie(
        COOKIE,
        sid,
        max_age=max(0, int(s.expires - time.monotonic())),
        path="/",
        httponly=True,
        samesite="Strict",
        secure=request.secure,
    )


def clear_cookie(request: web.Request, resp: web.StreamResponse) -> None:
    resp.del_cookie(COOKIE, path="/", httponly=True, samesite="Strict", secure=request.secure)


def same_origin(request: web.Request) -> bool:
    """False when the request's ``Origin`` (or, without it, ``Referer``) names a site other
    than this one; a request with neither (a non-browser client) passes, since it cannot
    carry a victim's cookie and still needs the form's CSRF value."""
    origin = request.headers.get("Origin") or request.headers.get("Referer")
    if not origin or origin == "null":
        return origin != "null"
    parts = urlsplit(origin)
    return parts.scheme == request.scheme and parts.netloc == request.host


def csrf_ok(session: Session, sent: str | None) -> bool:
    return bool(sent) and hmac.compare_digest(session.csrf.encode(), str(sent).encode())
