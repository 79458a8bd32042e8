"""A person signs in to the dashboard in Chromium through the real provider's login form
(issue 30): the sign-in page's provider button, the provider's development login and
consent pages, back to the dashboard with a session; then a sign-out. A subprocess daemon,
as the dashboard's other browser tests run. Screenshot in ``$KLIQUE_ARTIFACTS`` (else the
test's tmp dir) as ``signin-oidc.png``."""

from __future__ import annotations

import os
from pathlib import Path

from tests.harness.daemon import Server
from tests.harness.oidc import Provider
from tests.harness.oidc_estate import write_estate
from tests.web.test_browser import CHROMIUM, pytestmark, sync_playwright

__all__ = ["pytestmark"]


def test_sign_in_through_the_provider_in_chromium(
    tmp_path: Path, oidc_people: Provider, oidc_actions: Provider
) -> None:
    estate = write_estate(tmp_path / "estate", oidc_people, oidc_actions)
    s = Server(tmp_path, estate=estate).start()
    out = Path(os.environ.get("KLIQUE_ARTIFACTS") or tmp_path) / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                page = browser.new_context().new_page()
                errors: list[str] = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(f"{s.url}/my-work")
                page.get_by_role("link", name="Sign in with corp").click()
                page.wait_for_url(lambda u: u.startswith(oidc_people.issuer))
                page.locator("input[name=login]").fill("bob")
                page.locator("input[name=password]").fill("any")
                page.locator("button[type=submit]").first.click()
                page.wait_for_url(lambda u: "/interaction/" in u and "/login" not in u)
                page.locator("button[type=submit]").first.click()  # consent
                page.wait_for_url(lambda u: u.startswith(s.url) and "/signin" not in u)
                assert page.url == f"{s.url}/my-work"
                assert "user:bob" in page.content()
                page.screenshot(path=str(out / "signin-oidc.png"), full_page=True)
                page.get_by_role("button", name="Sign out").click()
                page.wait_for_url(lambda u: u.endswith("/signin"))
                assert not errors, errors
            finally:
                browser.close()
        signed = s.ok("GET", "/v1/events?kind=signed_in")["events"]
        assert [(e["data"]["via"], e["data"]["subject"]) for e in signed] == [("dashboard", "bob")]
    finally:
        assert s.stop() == 0, s.log()
