"""The dashboard's sign-in through the real provider (issue 30), driven over HTTP as a
browser would be (the development login form filled by tests/harness/oidc.py's ``walk``;
tests/identity/test_browser.py does it in Chromium): authorization code with PKCE, state and
nonce; the attacks on it: a replayed callback, a mismatched state, a callback in another
browser, an authorization code redeemed twice, a person the estate does not name."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.harness.inproc import InProcServer
from tests.harness.oidc import Provider, walk


def browser() -> httpx.Client:
    return httpx.Client(follow_redirects=False, timeout=15)


def start(s: InProcServer, b: httpx.Client, query: str = "provider=corp") -> str:
    """The dashboard's redirect to the provider (its state and PKCE challenge in it)."""
    r = b.get(f"{s.url}/signin/oidc?{query}")
    assert r.status_code == 303, r.text
    return str(r.headers["location"])


def sign_in(s: InProcServer, people: Provider, login: str, b: httpx.Client) -> httpx.Response:
    """Through the provider and back to the callback; the callback's answer."""
    back = walk(people, start(s, b), login)
    assert back is not None and back.startswith(f"{s.url}/signin/oidc/callback?")
    return b.get(back)


def test_the_sign_in_page_offers_the_provider_and_signs_in(
    idp_server: InProcServer, oidc_people: Provider
) -> None:
    s = idp_server
    with browser() as b:
        form = b.get(f"{s.url}/signin").text
        assert 'href="/signin/oidc?provider=corp&amp;next=/"' in form
        location = start(s, b)
        assert location.startswith(f"{oidc_people.issuer}/auth?")
        q = httpx.URL(location).params
        assert q["code_challenge_method"] == "S256" and q["state"] and q["nonce"]
        assert q["redirect_uri"] == f"{s.url}/signin/oidc/callback"
        done = b.get(walk(oidc_people, location, "bob") or "")
        assert done.status_code == 303 and done.headers["location"] == "/my-work"
        page = b.get(f"{s.url}/my-work")
        assert page.status_code == 200 and "user:bob" in page.text
    [ev] = s.ok("GET", "/v1/events?kind=signed_in")["events"]
    assert ev["data"]["via"] == "dashboard" and ev["data"]["provider"] == "corp"


def test_a_role_asked_for_at_sign_in(idp_server: InProcServer, oidc_people: Provider) -> None:
    s = idp_server
    with browser() as b:
        back = walk(oidc_people, start(s, b, "provider=corp&role=admin"), "walter")
        assert b.get(back or "").headers["location"] == "/orchestration"
        assert "role:admin" in b.get(f"{s.url}/orchestration").text


def test_a_replayed_callback_is_refused(idp_server: InProcServer, oidc_people: Provider) -> None:
    s = idp_server
    with browser() as b:
        back = walk(oidc_people, start(s, b), "alice") or ""
        assert b.get(back).status_code == 303
        again = b.get(back)
        assert again.status_code == 400
        assert "state is unknown, already used or expired" in again.text


def test_a_replayed_authorization_code_is_refused_by_the_provider(
    idp_server: InProcServer, oidc_people: Provider
) -> None:
    """The code of a finished sign-in, presented under a fresh sign-in's state (an attacker
    who saw it in a log): the provider refuses to redeem it twice."""
    s = idp_server
    with browser() as b:
        first = walk(oidc_people, start(s, b), "alice") or ""
        assert b.get(first).status_code == 303
        code = httpx.URL(first).params["code"]
        fresh = httpx.URL(start(s, b)).params["state"]
        r = b.get(f"{s.url}/signin/oidc/callback", params={"code": code, "state": fresh})
        assert r.status_code == 401
        assert "the provider refused the code" in r.text and "invalid_grant" in r.text


def test_a_mismatched_state_is_refused(idp_server: InProcServer, oidc_people: Provider) -> None:
    s = idp_server
    with browser() as b:
        back = httpx.URL(walk(oidc_people, start(s, b), "alice") or "")
        r = b.get(
            f"{s.url}/signin/oidc/callback",
            params={"code": back.params["code"], "state": "not-the-one-we-made"},
        )
        assert r.status_code == 400 and "state is unknown" in r.text
        assert "kq_session" not in r.headers.get("set-cookie", "")


def test_a_callback_from_another_browser_is_refused(
    idp_server: InProcServer, oidc_people: Provider
) -> None:
    """Login CSRF: the attacker starts a sign-in as themselves and sends the victim the
    callback; the victim's browser has not the attacker's binding cookie."""
    s = idp_server
    with browser() as attacker, browser() as victim:
        back = walk(oidc_people, start(s, attacker), "mallory-as-alice") or ""
        r = victim.get(back)
        assert r.status_code == 400 and "started in another browser" in r.text


def test_a_person_the_estate_does_not_name_gets_no_session(
    idp_server: InProcServer, oidc_people: Provider
) -> None:
    s = idp_server
    with browser() as b:
        r = sign_in(s, oidc_people, "mallory", b)
        assert r.status_code == 403 and "in no group of the running estate" in r.text
        assert b.get(f"{s.url}/my-work").status_code in (302, 303)


def test_removing_the_person_from_the_estate_ends_their_dashboard_session(
    tmp_path: Path, idp_server: InProcServer, oidc_people: Provider
) -> None:
    from tests.harness.wait import wait_for

    s = idp_server
    with browser() as b:
        assert sign_in(s, oidc_people, "bob", b).status_code == 303
        assert b.get(f"{s.url}/my-work").status_code == 200
        before = s.ok("GET", "/v1/estate")["revision"]
        groups = tmp_path / "estate" / "groups.yaml"
        groups.write_text(groups.read_text().replace("users: [alice, bob]", "users: [alice]"))
        wait_for(lambda: s.ok("GET", "/v1/estate")["revision"] != before, 20, "the new revision")
        r = b.get(f"{s.url}/my-work")
        assert r.status_code == 303 and r.headers["location"].startswith("/signin?")
        assert "no%20longer%20in%20the%20running%20estate" in r.headers["location"]
