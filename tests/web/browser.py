"""A browser for the dashboard's HTML tests, without a browser: a cookie-keeping HTTP client
(urllib) against a real ``kliqued serve``, that signs in with the form as a person would and
does not follow redirects, so tests see each 303 and its Location."""

from __future__ import annotations

import http.cookiejar
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from email.message import Message


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kw):  # type: ignore[no-untyped-def]
        return None


@dataclass
class Answer:
    status: int
    headers: Message
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    @property
    def location(self) -> str | None:
        return self.headers.get("Location")


class Browser:
    def __init__(self, url: str) -> None:
        self.url = url
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(self.jar), _NoRedirect()
        )
        self.csrf = ""

    def request(
        self,
        method: str,
        path: str,
        form: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Answer:
        data = None if form is None else urllib.parse.urlencode(form).encode()
        req = urllib.request.Request(
            self.url + path, data=data, method=method, headers=headers or {}
        )
        if data is not None:
            req.add_header("Content-Type", "application/x-www-form-urlencoded")
        try:
            with self.opener.open(req, timeout=30) as r:
                return Answer(r.status, r.headers, r.read())
        except urllib.error.HTTPError as exc:
            return Answer(exc.code, exc.headers, exc.read())

    def get(self, path: str, **kw: dict[str, str]) -> Answer:
        a = self.request("GET", path, **kw)
        m = re.search(r'name="csrf" value="([^"]*)"', a.text)
        if m and m.group(1):
            self.csrf = m.group(1)
        return a

    def post(self, path: str, form: dict[str, str], **kw: dict[str, str]) -> Answer:
        return self.request("POST", path, form, **kw)

    def sign_in(self, token: str) -> Answer:
        a = self.post("/signin", {"token": token, "next": "/"})
        assert a.status == 303, (a.status, a.text[:500])
        self.get(a.location or "/")
        return a

    def page(self, path: str) -> str:
        a = self.get(path)
        assert a.status == 200, (path, a.status, a.text[:800])
        return a.text
