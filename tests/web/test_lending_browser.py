"""The Policy page under ``settings.lending.order: fair`` in a real headless browser (issue
28, lending.md "What the product shows"): each policy's fair share (borrowed GPUs /
``lend_weight``) and its weight, beside its borrowed GPUs; none of it without ``fair``
(tests/web/test_browser.py's pages). Screenshot in ``$KLIQUE_ARTIFACTS`` (else the test's
tmp dir) as ``policy-fair.png``."""

from __future__ import annotations

import os
from pathlib import Path

from tests.daemon.test_lost_work import CMD, lending_estate
from tests.harness.daemon import Server
from tests.harness.wait import wait_for
from tests.web.test_browser import CHROMIUM, assert_accessible, pytestmark, sync_playwright

__all__ = ["pytestmark"]


def test_policy_page_shows_fair_shares_and_weights(tmp_path: Path) -> None:
    s = Server(tmp_path, estate=lending_estate(tmp_path)).start()
    try:
        bob = s.token("bob")
        tasks = [
            s.ok("POST", "/v1/tasks", {"resource": "team-a/one", **CMD}, bob)["id"]
            for _ in range(4)
        ]
        wait_for(lambda: all(s.ok("GET", f"/v1/tasks/{t}")["state"] == "placed" for t in tasks))
        out = Path(os.environ.get("KLIQUE_ARTIFACTS") or tmp_path) / "screenshots"
        out.mkdir(parents=True, exist_ok=True)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
                errors: list[str] = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(f"{s.url}/")
                page.get_by_label("API token").fill(s.token("walter"))  # lab's admin
                page.get_by_role("button", name="Sign in").click()
                page.wait_for_url(lambda u: "/signin" not in u)
                page.goto(f"{s.url}/policy")
                heads = page.locator("table").first.locator("thead th").all_inner_texts()
                assert "Fair share" in heads and "Lend weight" in heads, heads

                def cells(policy: str) -> tuple[str, str, str]:
                    row = page.locator(f"tr[data-policy='{policy}']")
                    return (
                        row.locator("td[data-col='borrowed']").inner_text(),
                        row.locator("td[data-col='share']").inner_text(),
                        row.locator("td[data-col='lend-weight']").inner_text(),
                    )

                # team-a: 4 used, 2 borrowed, weight 2: share 1; team-b borrows nothing
                assert cells("team-a") == ("2", "1", "2")
                assert cells("team-b") == ("0", "0", "1")
                page.wait_for_load_state("networkidle")
                assert_accessible(page)
                page.screenshot(path=str(out / "policy-fair.png"), full_page=True)
                assert not errors, errors
            finally:
                browser.close()
    finally:
        assert s.stop() == 0, s.log()
