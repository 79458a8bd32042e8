"""Each trusted issuer's signing keys, from its discovery document's ``jwks_uri``, cached.

A token whose ``kid`` is not in the cache makes one refetch, at most once a minute per issuer
(``REFETCH_MS``): a key rotated at the provider is picked up at the first token signed with
it, and a flood of made-up ``kid``s costs the provider one request a minute. The fetch runs on
a thread with a timeout (``fetch.py``); while the provider is away the cached keys keep
working, and with none cached the caller is told the provider cannot be reached. Nothing
here can stop the daemon: every failure is an answer to one request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from joserfc.errors import JoseError
from joserfc.jwk import Key, KeySet

from kliqued.daemon.identity.fetch import FetchError, fetch_json

REFETCH_MS = 60_000
"""At most one fetch of an issuer's keys a minute (its clock is the daemon's)."""
TIMEOUT_S = 5.0
"""Each GET to a provider (the discovery document, then the JWKS)."""
SIGNING_TYPES = ("RSA", "EC")
"""The key types the accepted algorithms use (RS*, PS*: RSA; ES*: EC). A symmetric (``oct``)
key in a provider's JWKS is never used: it would be a shared secret."""


class Unreachable(Exception):
    """No keys of the issuer are known and it could not be read (the message says why)."""


class UnknownKey(Exception):
    """The issuer, read again (or not again within the minute), has no key of that ``kid``."""


@dataclass
class _Issuer:
    keys: list[Key] = field(default_factory=list)
    fetched: bool = False
    last_try_ms: int | None = None
    error: str | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


Fetch = Callable[[str, float], dict[str, Any]]


def load_keys(issuer: str, fetch: Fetch = fetch_json, timeout_s: float = TIMEOUT_S) -> list[Key]:
    """The issuer's signing keys (blocking: discovery, then the JWKS it names)."""
    doc = fetch(issuer.rstrip("/") + "/.well-known/openid-configuration", timeout_s)
    if doc.get("issuer") != issuer:
        raise FetchError(
            f"the discovery document of {issuer} names the issuer {doc.get('issuer')!r}: "
            "settings.identity must give the issuer exactly as the provider does"
        )
    uri = doc.get("jwks_uri")
    if not isinstance(uri, str) or not uri:
        raise FetchError(f"the discovery document of {issuer} has no jwks_uri")
    jwks = fetch(uri, timeout_s)
    try:
        found = KeySet.import_key_set(jwks)  # type: ignore[arg-type]
    except (JoseError, ValueError, TypeError, KeyError) as e:
        raise FetchError(f"the JWKS at {uri} could not be read ({e})") from None
    keys = [
        k
        for k in found.keys
        if k.key_type in SIGNING_TYPES and k.get("use") in (None, "sig") and not k.is_private
    ]
    if not keys:
        raise FetchError(f"the JWKS at {uri} has no public signing key")
    return keys


class KeyCache:
    """The keys of every issuer the estate trusts, by issuer URL."""

    def __init__(self, fetch: Fetch = fetch_json, timeout_s: float = TIMEOUT_S) -> None:
        self._fetch = fetch
        self._timeout_s = timeout_s
        self._issuers: dict[str, _Issuer] = {}
        self.fetches = 0
        """How many times the keys of some issuer were fetched (tests, metrics)."""

    @staticmethod
    def _find(keys: list[Key], kid: str | None) -> Key | None:
        if kid is None:
            return keys[0] if len(keys) == 1 else None
        return next((k for k in keys if k.kid == kid), None)

    async def key(self, issuer: str, kid: str | None, now_ms: int) -> Key:
        """The key ``kid`` of ``issuer``: cached, or after one refetch if the last was a
        minute ago or more. :class:`Unreachable` or :class:`UnknownKey` otherwise."""
        st = self._issuers.setdefault(issuer, _Issuer())
        found = self._find(st.keys, kid)
        if found is not None:
            return found
        async with st.lock:
            found = self._find(st.keys, kid)  # fetched by a request we waited behind
            if found is not None:
                return found
            due = (
                st.last_try_ms is None
                or now_ms - st.last_try_ms >= REFETCH_MS
                or now_ms < st.last_try_ms  # the clock stepped back: not a reason to wait
            )
            if due:
                st.last_try_ms = now_ms
                self.fetches += 1
                try:
                    st.keys = await asyncio.to_thread(
                        load_keys, issuer, self._fetch, self._timeout_s
                    )
                    st.fetched, st.error = True, None
                except FetchError as e:
                    st.error = str(e)
            found = self._find(st.keys, kid)
            if found is not None:
                return found
            if not st.fetched:
                raise Unreachable(
                    f"the identity provider {issuer} could not be read: {st.error}; tried "
                    "again at most once a minute"
                )
            raise UnknownKey(kid or "")
