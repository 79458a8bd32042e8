"""The dashboard's sign-ins through an identity provider that were started and not finished
(oidc.py): what the callback needs (the PKCE verifier, the nonce, the browser's binding),
by the one-time ``state``; bounded, and expired after ten minutes."""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

TTL_S = 600
CAP = 1000


@dataclass(frozen=True)
class Pending:
    provider: str
    verifier: str
    nonce: str
    binding: str
    next: str
    role: str | None
    redirect_uri: str
    expires: float


class PendingSignins:
    """Sign-ins started and not finished, by ``state``: each taken once."""

    def __init__(self) -> None:
        self._by_state: OrderedDict[str, Pending] = OrderedDict()

    def add(self, st: str, p: Pending) -> None:
        self._by_state[st] = p
        while len(self._by_state) > CAP:
            self._by_state.popitem(last=False)

    def take(self, st: str) -> Pending | None:
        p = self._by_state.pop(st, None)
        if p is None or p.expires < time.monotonic():
            return None
        return p
