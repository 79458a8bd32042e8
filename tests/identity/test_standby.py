"""A provider's bearer JWT sent to a standby (docs/ha.md, issue 30): the standby serves reads
only for tokens in its copy of the token book, so it sends the JWT to the leader (307),
which verifies it and records the sign-in; the standby records nothing."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

from tests.daemon.test_failover import pair
from tests.harness.oidc import Provider, id_token
from tests.harness.oidc_estate import write_estate


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kw):  # type: ignore[no-untyped-def]
        return None


def test_a_bearer_jwt_on_a_standby_goes_to_the_leader(
    tmp_path: Path, pg_url: str, oidc_people: Provider, oidc_actions: Provider
) -> None:
    estate = write_estate(tmp_path / "estate", oidc_people, oidc_actions)
    a, b = pair(tmp_path, pg_url, estate=estate)
    try:
        token = id_token(oidc_people, "bob")
        req = urllib.request.Request(
            f"{b.url}/v1/whoami", headers={"Authorization": f"Bearer {token}"}
        )
        try:
            urllib.request.build_opener(_NoRedirect).open(req, timeout=10)
            raise AssertionError("the standby answered a provider's token itself")
        except urllib.error.HTTPError as e:
            assert e.code == 307 and e.headers["Location"] == f"{a.url}/v1/whoami"
        status, body = b.call("GET", "/v1/whoami", token=token)  # followed to the leader
        assert (status, body["principal"]) == (200, "user:bob")
        [ev] = a.ok("GET", "/v1/events?kind=signed_in")["events"]
        assert ev["data"]["subject"] == "bob" and ev["data"]["via"] == "bearer"
    finally:
        try:
            b.stop()
        finally:
            a.stop()
