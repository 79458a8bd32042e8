"""A CI job's own ID token, from the places GitHub Actions and GitLab put it, so that
``kliqued plan --against`` and ``--what-if-from`` prove who the job is with no stored secret
(issue 30; docs/identity.md). The daemon trusts the issuer and checks the job's claims
(``settings.identity.workloads``).

- ``KLIQUE_ID_TOKEN``: the token itself (GitLab: ``id_tokens: {KLIQUE_ID_TOKEN: {aud:
  klique}}``; any CI that can write one into the environment).
- GitHub Actions with ``permissions: id-token: write``: ``ACTIONS_ID_TOKEN_REQUEST_URL`` and
  ``ACTIONS_ID_TOKEN_REQUEST_TOKEN``; the token is asked for with the daemon's audience.

Without either, None: the caller falls back to its token or config context.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request

from .errors import ConfigError

ENV_ID_TOKEN = "KLIQUE_ID_TOKEN"
ENV_AUDIENCE = "KLIQUE_AUDIENCE"
DEFAULT_AUDIENCE = "klique"
GITHUB_URL = "ACTIONS_ID_TOKEN_REQUEST_URL"
GITHUB_TOKEN = "ACTIONS_ID_TOKEN_REQUEST_TOKEN"
TIMEOUT_S = 10.0


def audience(explicit: str | None = None) -> str:
    return explicit or os.environ.get(ENV_AUDIENCE) or DEFAULT_AUDIENCE


def job_id_token(aud: str | None = None) -> str | None:
    """The job's ID token for ``aud`` (default ``KLIQUE_AUDIENCE`` or ``klique``), or None
    when this is not a CI job that has one. :class:`ConfigError` when GitHub's token service
    is named but does not answer one (the message says what to fix)."""
    given = (os.environ.get(ENV_ID_TOKEN) or "").strip()
    if given:
        return given
    url = os.environ.get(GITHUB_URL)
    bearer = os.environ.get(GITHUB_TOKEN)
    if not url or not bearer:
        return None
    sep = "&" if urllib.parse.urlsplit(url).query else "?"
    full = f"{url}{sep}{urllib.parse.urlencode({'audience': audience(aud)})}"
    req = urllib.request.Request(full, headers={"Authorization": f"Bearer {bearer}"})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:  # noqa: S310
            value = json.loads(resp.read(1 << 20)).get("value")
    except urllib.error.HTTPError as e:
        raise ConfigError(
            f"the job's ID token: {GITHUB_URL} answered HTTP {e.code}; give the workflow "
            "`permissions: id-token: write`"
        ) from None
    except (urllib.error.URLError, OSError, ValueError, AttributeError) as e:
        raise ConfigError(f"the job's ID token: {GITHUB_URL} could not be read ({e})") from None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"the job's ID token: {GITHUB_URL} answered no 'value'")
    return value
