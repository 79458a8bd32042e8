"""One JSON document from an identity provider (discovery, JWKS), fetched on a worker thread
so that a slow or silent provider never holds the event loop, with a timeout and a size cap
so that it cannot hold a thread or memory either. Plain ``urllib``: two GETs need no client
library."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

MAX_BYTES = 1 << 20
"""A discovery document or a JWKS is a few kB; more is not a provider's answer."""


class FetchError(Exception):
    """The provider could not be read: the message says where and why, for the caller."""


def fetch_json(url: str, timeout_s: float) -> dict[str, Any]:
    """GET ``url`` and parse its JSON object; :class:`FetchError` otherwise. Blocking: call it
    through ``asyncio.to_thread``."""
    req = urllib.request.Request(url, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 (https/loopback: the compiler checks the issuer)
            body = resp.read(MAX_BYTES + 1)
    except urllib.error.HTTPError as e:
        raise FetchError(f"{url} answered HTTP {e.code}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise FetchError(f"{url} could not be reached ({reason})") from None
    if len(body) > MAX_BYTES:
        raise FetchError(f"{url} answered more than {MAX_BYTES} bytes")
    try:
        data = json.loads(body)
    except ValueError:
        raise FetchError(f"{url} did not answer JSON") from None
    if not isinstance(data, dict):
        raise FetchError(f"{url} did not answer a JSON object")
    return data
