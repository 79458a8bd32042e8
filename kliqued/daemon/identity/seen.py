"""Which bearer tokens' first use was audited: the audit records a sign-in once per token,
not once per request. Kept by digest until the token expires, bounded (the oldest are
forgotten first, and audited again if they come back)."""

from __future__ import annotations

from collections import OrderedDict

SEEN_MAX = 10_000


class SeenTokens:
    def __init__(self, limit: int = SEEN_MAX) -> None:
        self.limit = limit
        self.until: OrderedDict[str, int] = OrderedDict()

    def first(self, digest: str, expires_ms: int, now: int) -> bool:
        """Whether this is the token's first use (it is remembered from now on)."""
        known = self.until.get(digest)
        if known is not None and known > now:
            return False
        self.until[digest] = expires_ms
        self.until.move_to_end(digest)
        while len(self.until) > self.limit:
            self.until.popitem(last=False)
        return True
