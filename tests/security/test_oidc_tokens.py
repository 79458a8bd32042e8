"""The attacks on sign-in (issue 30), each against a daemon whose estate trusts a real OpenID
Provider (npm oidc-provider) and refused with a reason that names the check: a token for
another audience, an expired one, one signed by a key the provider never published, an
unsigned one (``alg: none``), one signed with HMAC keyed by the provider's public key (the
algorithm confusion), a person the estate does not name, and an estate that would map one
claim to two users. No refusal quotes or logs the token."""

from __future__ import annotations

from pathlib import Path

from joserfc import jwt
from joserfc.jwk import OctKey

from tests.harness.inproc import InProcServer
from tests.harness.oidc import Client, Provider, id_token
from tests.harness.wait import wait_for
from tests.harness.oidc_estate import write_estate
from tests.security.forged import claims, forge, unsigned


def refused(s: InProcServer, token: str, status: int = 401) -> str:
    got, body = s.call("GET", "/v1/whoami", token=token)
    assert got == status, body
    message: str = body["error"]["message"]
    signature = token.rsplit(".", 1)[-1]
    assert token not in message and (not signature or signature not in s.log())
    assert token.split(".")[1] not in s.log()  # nor its claims
    return message


def test_a_token_for_another_audience(idp_server: InProcServer, oidc_actions: Provider) -> None:
    message = refused(idp_server, oidc_actions.actions_token("some-other-service"))
    assert "wrong audience: the token is for 'some-other-service'" in message
    assert "this daemon is 'klique' (github)" in message


def test_an_expired_token_past_the_leeway(idp_server: InProcServer, oidc_people: Provider) -> None:
    s = idp_server
    token = id_token(oidc_people, "alice")  # the provider's ID tokens live 10 minutes
    s.step(600 + 30)  # expired, within the 60 s leeway: still accepted
    assert s.ok("GET", "/v1/whoami", token=token)["principal"] == "user:alice"
    s.step(60)
    assert "the token expired on" in refused(s, token)


def test_a_token_not_valid_yet_beyond_the_leeway(
    idp_server: InProcServer, oidc_actions: Provider
) -> None:
    """``nbf``/``iat`` ahead of the daemon's clock: within the 60 s leeway accepted (clock
    skew), beyond it refused, saying so."""
    s = idp_server
    skewed = oidc_actions.actions_token("klique", skew="30")
    assert s.ok("GET", "/v1/plan/state", token=skewed)["revision"]
    ahead = oidc_actions.actions_token("klique", skew="600")
    got, body = s.call("GET", "/v1/plan/state", token=ahead)
    assert got == 401 and "is not valid yet" in body["error"]["message"], body
    assert "beyond the leeway of 60s" in body["error"]["message"]


def test_a_key_the_provider_never_published(
    idp_server: InProcServer, oidc_people: Provider
) -> None:
    message = refused(idp_server, forge(oidc_people.issuer, "klique", "alice", kid="k-evil"))
    assert "unknown signing key 'k-evil' for corp" in message


def test_a_forged_signature_under_a_published_kid(
    idp_server: InProcServer, oidc_people: Provider
) -> None:
    token = forge(oidc_people.issuer, "klique", "alice", kid=oidc_people.key["kid"])
    assert "signature does not verify with corp's key" in refused(idp_server, token)


def test_alg_none_is_refused_before_any_key(
    idp_server: InProcServer, oidc_people: Provider
) -> None:
    token = unsigned(oidc_people.issuer, "klique", "walter", kid=oidc_people.key["kid"])
    message = refused(idp_server, token)
    assert "signed with 'none'" in message and "accepted: RS256, ES256" in message


def test_hmac_keyed_with_the_public_key_is_refused(
    idp_server: InProcServer, oidc_people: Provider
) -> None:
    """The classic confusion: HS256 with the provider's public key as the shared secret."""
    secret = OctKey.import_key(oidc_people.key["n"].encode())
    token = jwt.encode(
        {"alg": "HS256", "kid": oidc_people.key["kid"]},
        claims(oidc_people.issuer, "klique", "walter"),
        secret,
        algorithms=["HS256"],
    )
    assert "signed with 'HS256'" in refused(idp_server, token)


def test_an_issuer_the_estate_does_not_trust(idp_server: InProcServer) -> None:
    message = refused(idp_server, forge("https://evil.example.com", "klique", "alice"))
    assert "issuer 'https://evil.example.com' are not trusted here" in message


def test_a_person_the_estate_does_not_name(idp_server: InProcServer, oidc_people: Provider) -> None:
    message = refused(idp_server, id_token(oidc_people, "mallory"), 403)
    assert "'mallory' signed in through corp but is in no group" in message
    got, body = idp_server.call(
        "POST", "/v1/signin", {"id_token": id_token(oidc_people, "mallory")}, token=None
    )
    assert got == 403 and "in no group" in body["error"]["message"]


def test_a_rotated_key_is_fetched_at_most_once_a_minute(
    tmp_path: Path, oidc_actions: Provider
) -> None:
    """The provider rotates its key: a token under the new ``kid`` is refused until the
    minute since the last fetch has passed (a flood of made-up kids costs one fetch a
    minute), then accepted after one refetch."""
    own = Provider("people", [Client("klique")]).start()
    s = InProcServer(tmp_path, write_estate(tmp_path / "estate", own, oidc_actions)).start()
    try:
        assert s.ok("GET", "/v1/whoami", token=id_token(own, "alice"))["principal"] == "user:alice"
        own.restart(new_key=True)
        rotated = id_token(own, "alice")
        assert "unknown signing key" in refused(s, rotated)
        s.step(61)
        assert s.ok("GET", "/v1/whoami", token=rotated)["principal"] == "user:alice"
    finally:
        try:
            s.stop()
        finally:
            own.stop()


def test_an_estate_mapping_one_claim_to_two_users_is_refused(
    tmp_path: Path, idp_server: InProcServer, oidc_people: Provider
) -> None:
    """The compiler refuses it (tests/compiler/test_identity.py has the wording); a daemon
    that watches the estate keeps the revision it runs, and the shared value names no one."""
    s = idp_server
    settings = tmp_path / "estate" / "settings.yaml"
    settings.write_text(
        settings.read_text().replace(
            "users: {erin: erin.x@example.org}",
            "users: {alice: shared@example.org, bob: shared@example.org}",
        )
    )
    estate = wait_for(
        lambda: (e := s.ok("GET", "/v1/estate")).get("refused") and e, 20, "the refusal"
    )
    assert "claim-maps-to-two-users" in str(estate["refused"])
    message = refused(s, id_token(oidc_people, "shared@example.org"), 403)
    assert "shared@example.org" in message and "in no group" in message
