"""Several control-plane URLs, and which one to use next: the one leader-following rule the
SDK, the CLI and the workers share (docs/ha.md). Standard library only.

A client is given the daemons' URLs (``--url a --url b``, or ``KLIQUE_URL=a,b``). It talks
to one; when that one cannot be reached, or stands by (a 307 to the leader, or a 503 while
no leader is known), it moves on: to the URL the redirect names when that URL is one of its
own, else to the next of its list. A redirect to a URL the client was not given is not
followed (the client's token goes only where its owner sent it).
"""

from __future__ import annotations

import urllib.parse
from typing import Iterable


def split_urls(values: str | Iterable[str] | None) -> list[str]:
    """``"a,b"``, ``["a", "b,c"]`` -> ``["a", "b", "c"]``: every URL once, in order, blanks
    dropped."""
    if values is None:
        return []
    items = [values] if isinstance(values, str) else list(values)
    out: list[str] = []
    for item in items:
        for part in str(item).split(","):
            part = part.strip()
            if part and part not in out:
                out.append(part)
    return out


def origin(url: str) -> str:
    """``scheme://host:port`` of ``url``, lower-cased, the default port made explicit."""
    p = urllib.parse.urlsplit(url)
    port = p.port or (443 if p.scheme == "https" else 80)
    return f"{p.scheme.lower()}://{(p.hostname or '').lower()}:{port}"


class Leader:
    """The URLs of one control plane and the one in use (``current``)."""

    def __init__(self, urls: list[str]) -> None:
        if not urls:
            raise ValueError("no server URL given")
        self.urls = list(urls)
        self.index = 0

    @property
    def current(self) -> str:
        return self.urls[self.index]

    @property
    def several(self) -> bool:
        return len(self.urls) > 1

    def next(self) -> str:
        """Moves to the next URL of the list (round robin)."""
        self.index = (self.index + 1) % len(self.urls)
        return self.current

    def prefer(self, url: str | None) -> bool:
        """Uses the listed URL with ``url``'s origin (the leader a daemon named); False, and
        nothing changes, when none of the list has it."""
        if url:
            want = origin(url)
            for i, u in enumerate(self.urls):
                if origin(u) == want:
                    self.index = i
                    return True
        return False

    def follow(self, location: str | None) -> str:
        """After a redirect: the listed URL with ``location``'s origin, else the next."""
        return self.current if self.prefer(location) else self.next()
