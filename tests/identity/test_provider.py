"""The test provider itself (tests/harness/oidc.py): a real oidc-provider answering discovery
with the device grant and PKCE, a key of its own per instance, and the Actions-shaped token
endpoint with the job's claims. The sign-in tests build on these facts."""

from __future__ import annotations

import httpx
from joserfc import jwt
from joserfc.jwk import KeySet

from tests.harness.oidc import Provider


def test_discovery_offers_the_device_grant_and_pkce(oidc_people: Provider) -> None:
    doc = oidc_people.discovery()
    assert doc["issuer"] == oidc_people.issuer
    assert doc["device_authorization_endpoint"].startswith(oidc_people.issuer)
    assert "S256" in doc["code_challenge_methods_supported"]
    keys = httpx.get(doc["jwks_uri"], timeout=5).json()["keys"]
    assert [k["kid"] for k in keys] == [oidc_people.key["kid"]]
    assert "d" not in keys[0]  # the public half only


def test_each_instance_signs_with_its_own_key(
    oidc_people: Provider, oidc_actions: Provider
) -> None:
    assert oidc_people.key["kid"] != oidc_actions.key["kid"]
    assert oidc_people.key["n"] != oidc_actions.key["n"]


def test_actions_token_carries_the_jobs_claims(oidc_actions: Provider) -> None:
    value = oidc_actions.actions_token("klique", ref="refs/heads/feature")
    keys = KeySet.import_key_set(httpx.get(f"{oidc_actions.issuer}/jwks", timeout=5).json())
    token = jwt.decode(value, keys, algorithms=["RS256"])
    claims = token.claims
    assert claims["iss"] == oidc_actions.issuer
    assert claims["aud"] == "klique"
    assert claims["repository"] == "example-org/estate"
    assert claims["ref"] == "refs/heads/feature"
    assert claims["sub"] == "repo:example-org/estate:ref:refs/heads/feature"


def test_actions_token_needs_the_request_token(oidc_actions: Provider) -> None:
    r = httpx.get(
        oidc_actions.actions_url,
        params={"audience": "klique"},
        headers={"Authorization": "Bearer wrong"},
        timeout=5,
    )
    assert r.status_code == 401
