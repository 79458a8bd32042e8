"""The My work page shows a waiting task's forecast (issue 31) in a real headless browser:
team-b's budget is 0 hours a month, so erin's task waits for the month's reset, and the page
says when it could start at the earliest. Screenshot in ``$KLIQUE_ARTIFACTS`` (else the
test's tmp dir) as ``my-work-forecast.png``."""

from __future__ import annotations

import os
from pathlib import Path

from tests.daemon.test_dry_run import CMD, budget_estate
from tests.harness.daemon import Server
from tests.harness.wait import wait_for
from tests.web.test_browser import CHROMIUM, assert_accessible, pytestmark, sync_playwright

__all__ = ["pytestmark"]


def test_my_work_shows_the_earliest_start(tmp_path: Path) -> None:
    s = Server(tmp_path, estate=budget_estate(tmp_path)).start()
    try:
        erin = s.token("erin")
        t = s.ok("POST", "/v1/tasks", {"resource": "team-b/one", **CMD}, erin)["id"]
        view = wait_for(
            lambda: (v := s.ok("GET", f"/v1/tasks/{t}"))["forecast"] and v, 10, "its forecast"
        )
        assert view["forecast"]["basis"] == "budget-reset"
        out = Path(os.environ.get("KLIQUE_ARTIFACTS") or tmp_path) / "screenshots"
        out.mkdir(parents=True, exist_ok=True)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
                errors: list[str] = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(f"{s.url}/")
                page.get_by_label("API token").fill(erin)
                page.get_by_role("button", name="Sign in").click()
                page.wait_for_url(lambda u: "/signin" not in u)
                page.goto(f"{s.url}/my-work")
                cell = page.locator(f"tr[data-task='{t}'] .forecast")
                text = cell.inner_text()
                # the reset as the engine words it, computed here from the server's answer
                at = view["forecast"]["start_at"]
                assert f"not before {at[:16]}Z" in text, text
                assert text.startswith("earliest start:") and "the budget resets" in text
                assert cell.get_attribute("data-basis") == "budget-reset"
                page.wait_for_load_state("networkidle")
                assert_accessible(page)
                page.screenshot(path=str(out / "my-work-forecast.png"), full_page=True)
                assert not errors, errors
            finally:
                browser.close()
    finally:
        assert s.stop() == 0, s.log()
