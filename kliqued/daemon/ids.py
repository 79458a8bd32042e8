"""Identifiers and secrets: sortable task and token ids, bearer tokens and their hashes.

Task ids sort in submission order (``t-`` + the millisecond in Crockford base32 + a counter),
so ``GET /v1/tasks?after=`` pages by id and an id tells roughly when a task was sent. They are
made by the one sequencer coroutine, so no lock is needed.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

_B32 = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
TOKEN_PREFIX = "kq_"


def _b32(n: int, width: int) -> str:
    out = []
    for _ in range(width):
        n, r = divmod(n, 32)
        out.append(_B32[r])
    if n:
        raise ValueError("value too large for its width")
    return "".join(reversed(out))


def _unb32(s: str) -> int:
    n = 0
    for ch in s:
        n = n * 32 + _B32.index(ch)
    return n


class IdMaker:
    """``<prefix><10 chars of ms><4 chars of counter>``; strictly increasing, also across a
    restart when seeded with the last id issued (the counter carries on within the same ms,
    and the daemon's clock never goes back)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.last_ms = -1
        self.counter = 0

    def seed(self, last_id: str | None) -> None:
        if not last_id or not last_id.startswith(self.prefix):
            return
        body = last_id[len(self.prefix) :]
        try:
            ms, ctr = _unb32(body[:10]), _unb32(body[10:14])
        except ValueError:
            return
        if (ms, ctr) > (self.last_ms, self.counter):
            self.last_ms, self.counter = ms, ctr

    def next(self, now_ms: int) -> str:
        if now_ms > self.last_ms:
            self.last_ms, self.counter = now_ms, 0
        else:
            self.counter += 1
            if self.counter >= 32**4:  # 1M ids in one ms: borrow the next ms
                self.last_ms, self.counter = self.last_ms + 1, 0
        return f"{self.prefix}{_b32(self.last_ms, 10)}{_b32(self.counter, 4)}"


def new_token() -> str:
    """``kq_`` + 43 url-safe characters (256 bits)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


KEYED = "hmac-sha256:"
"""Prefix of a keyed hash; a bare 64-hex value is the old unkeyed SHA-256 (migrated at start,
see ``TokenHasher.rekey``)."""


def legacy_hash(token: str) -> str:
    """The unkeyed SHA-256 hex that databases before keyed hashes stored."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


class TokenHasher:
    """What is stored for a secret (API token, worker key): HMAC-SHA256 under the daemon's
    key (kliqued/daemon/storage/keyfile.py), so a leaked table alone does not let anyone check a
    guess. The HMAC is taken over the SHA-256 hex of the secret, which lets an old database's
    unkeyed hashes be converted without knowing the tokens (``rekey``). One HMAC per request:
    look-up stays a dict access, and the keyed value an attacker would need to time is one
    they cannot compute."""

    def __init__(self, key: bytes) -> None:
        if len(key) < 32:
            raise ValueError("the token key must be at least 32 bytes")
        self._key = key

    def rekey(self, old_hex: str) -> str:
        """An old unkeyed SHA-256 hex as the keyed hash of the same secret."""
        return KEYED + hmac.new(self._key, old_hex.encode("ascii"), hashlib.sha256).hexdigest()

    def hash(self, secret: str) -> str:
        return self.rekey(legacy_hash(secret))

    @staticmethod
    def is_keyed(stored: str) -> bool:
        return stored.startswith(KEYED)
