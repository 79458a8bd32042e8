"""Issue 32's dashboard items (and issue 31's advice for a department head) in a real
headless browser (Debian's chromium driven by Playwright), against one daemon with a real
klique-worker running real tasks: the task log as a page that follows the log live, the
audit trail paged with its filters in the URL, a cancel button and a session's link, the
Policy page as the organisation's tree, the usage page's figures current and labelled, one
money format. Screenshots as in tests/web/test_browser.py (``KLIQUE_SCREENSHOTS=docs/img``
writes the ones docs/dashboards.md shows).

Skips, saying why, when chromium or Playwright is absent."""

from __future__ import annotations

import os
import re
import shutil
from decimal import Decimal
from pathlib import Path
from typing import Any, Iterator

import pytest

from kliqued.cli import main
from tests.channels.test_sessions import APP
from tests.daemon.fleet import ESTATE, PY, FleetServer, real_workers, running_fleet, write_estate
from tests.harness.wait import wait_for
from tests.web.test_pages import MONEY
from tests.web.test_browser import (
    CHROMIUM,
    POLICIES,
    Page,
    assert_accessible,
    pytestmark,
    sync_playwright,
)

__all__ = ["pytestmark"]

DOCS_SHOTS = {
    "task-log-developer",
    "audit-paged-admin",
    "my-work-actions-developer",
    "policy-advice-head",
    "usage-lead",
}
"""The screenshots of this file docs/dashboards.md shows (docs/img/<name>.png)."""


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dash")


@pytest.fixture(scope="module")
def fs(tmp: Path) -> Iterator[FleetServer]:
    estate = write_estate(tmp / "estate", {**ESTATE, "policies.yaml": POLICIES})
    yield from running_fleet(tmp, users=("alice", "bob", "erin", "walter"), estate=estate)


@pytest.fixture(scope="module")
def worker(fs: FleetServer, tmp: Path) -> Iterator[Any]:
    gen = real_workers(fs, tmp)
    make = next(gen)
    make("w1", "0,1")
    wait_for(
        lambda: fs.ok("GET", "/v1/pools")["pools"][0]["workers"]["live"] == 1,
        20,
        "the worker to register",
    )
    yield make
    next(gen, None)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


def shot(page: Page, name: str, tmp: Path) -> None:
    page.wait_for_load_state("networkidle")
    assert_accessible(page)
    out = Path(os.environ.get("KLIQUE_ARTIFACTS") or tmp) / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    docs = os.environ.get("KLIQUE_SCREENSHOTS")
    if docs and name in DOCS_SHOTS:
        Path(docs).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(docs) / f"{name}.png")


def sign_in(browser: Any, fs: FleetServer, token: str, errors: list[str]) -> Page:
    page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.on(
        "response", lambda r: errors.append(f"HTTP {r.status} {r.url}") if r.status >= 400 else None
    )
    page.goto(f"{fs.url}/signin")
    page.get_by_label("API token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(lambda u: "/signin" not in u)
    return page


def waits_for(go: Path, first: str, second: str) -> list[str]:
    """A task that prints ``first``, waits for the file ``go``, prints ``second``, then runs
    until it is stopped (SIGTERM: exit 0)."""
    return [
        PY,
        "-c",
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
        f"print({first!r}, flush=True)\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.1)\n"
        f"print({second!r}, flush=True)\n"
        "time.sleep(120)\n",
    ]


def answer(dialog: Any, seen: list[str], accept: bool) -> None:
    """Answers the browser's question (``confirm``), noting what it asked."""
    seen.append(dialog.message)
    if accept:
        dialog.accept()
    else:
        dialog.dismiss()


HOSTILE = "<b>not bold</b> & <script>window.kliquePwned = 1</script>"


def test_the_task_log_is_a_page_that_follows_the_log_escaped(
    fs: FleetServer, worker: Any, browser: Any, tmp: Path
) -> None:
    """Item 1: the log in the site's frame, HTML-escaped, new lines without a reload; the raw
    text at its own URL."""
    go = tmp / "log-go"
    t = fs.submit(fs.bob, "team-b/one", waits_for(go, HOSTILE, "second line, café"))  # type: ignore[attr-defined]
    errors: list[str] = []
    dev = sign_in(browser, fs, fs.bob, errors)  # type: ignore[attr-defined]
    dev.goto(f"{fs.url}/my-work")
    dev.locator(f"tr[data-task='{t}'][data-state='running']").wait_for(timeout=30_000)
    dev.locator(f"tr[data-task='{t}'] a:has-text('log')").click()
    dev.wait_for_url(f"**/my-work/{t}/log")
    dev.get_by_role("heading", name=f"Log of {t}").wait_for()
    assert dev.get_by_role("navigation", name="Dashboard pages").is_visible()  # the frame
    log = dev.locator("pre#log")
    wait_for(lambda: HOSTILE in (log.text_content() or ""), 30, "the first line, as text")
    assert log.locator("b, script").count() == 0  # escaped: no markup from the log
    assert dev.evaluate("window.kliquePwned") is None
    dev.evaluate("window.kliqueMark = 'no reload'")
    go.write_text("go")
    wait_for(lambda: "second line, café" in (log.text_content() or ""), 30, "the second line, live")
    assert dev.evaluate("window.kliqueMark") == "no reload"
    assert (log.text_content() or "").count(HOSTILE) == 1  # appended, not repeated
    shot(dev, "task-log-developer", tmp)
    # the raw text, for tools: the same bytes as the API's log
    raw = dev.request.get(f"{fs.url}/my-work/{t}/log.txt")
    assert raw.status == 200 and raw.headers["content-type"].startswith("text/plain")
    assert HOSTILE in raw.text() and "second line, café" in raw.text()
    assert dev.get_by_role("link", name="Raw text").get_attribute("href") == f"/my-work/{t}/log.txt"
    fs.ok("POST", f"/v1/tasks/{t}/cancel", {"reason": "done"}, fs.bob)  # type: ignore[attr-defined]
    dev.locator("[data-task-state]:text-is('ended')").wait_for(timeout=30_000)
    dev.locator("[data-log-status]:has-text('The task ended')").wait_for(timeout=30_000)
    assert not errors, errors


def test_the_audit_trail_pages_keep_their_filters_in_the_url(
    fs: FleetServer, worker: Any, browser: Any, tmp: Path
) -> None:
    """Item 2: filters and the page in the URL, links to the next and previous pages."""
    for i in range(30):  # bob's: 30 submitted and 30 cancelled, beside everyone else's
        tid = fs.submit(fs.bob, "team-b/one", ["true"])  # type: ignore[attr-defined]
        fs.ok("POST", f"/v1/tasks/{tid}/cancel", {"reason": f"n{i}"}, fs.bob)  # type: ignore[attr-defined]
    errors: list[str] = []
    admin = sign_in(browser, fs, fs.admin or "", errors)
    admin.goto(f"{fs.url}/audit")
    admin.get_by_label("Who").fill("user:bob")
    admin.get_by_role("button", name="Search").click()
    admin.wait_for_url("**/audit?**actor=user%3Abob**")
    first = admin.locator("tr[data-seq]").evaluate_all("rows => rows.map(r => +r.dataset.seq)")
    assert len(first) == 50
    who = admin.locator("tr[data-seq] td:nth-child(5)").all_inner_texts()
    assert set(who) == {"user:bob"}, set(who)
    assert admin.get_by_role("link", name="← Previous page (newer)").count() == 0
    admin.get_by_role("link", name="Next page (older) →").first.click()
    admin.wait_for_url(lambda u: "page=2" in u and "actor=user%3Abob" in u)
    assert admin.get_by_label("Who").input_value() == "user:bob"  # the filter kept
    second = admin.locator("tr[data-seq]").evaluate_all("rows => rows.map(r => +r.dataset.seq)")
    assert second and max(second) < min(first)
    assert set(admin.locator("tr[data-seq] td:nth-child(5)").all_inner_texts()) == {"user:bob"}
    admin.get_by_role("navigation", name="Pages of events (top)").wait_for()
    shot(admin, "audit-paged-admin", tmp)
    admin.get_by_role("link", name="← Previous page (newer)").first.click()
    admin.wait_for_url(lambda u: "page=" not in u and "actor=user%3Abob" in u)
    again = admin.locator("tr[data-seq]").evaluate_all("rows => rows.map(r => +r.dataset.seq)")
    assert again[-1] == first[-1]
    assert not errors, errors


def test_cancel_and_open_a_session_from_my_work(
    fs: FleetServer, worker: Any, browser: Any, tmp: Path
) -> None:
    """Item 3: a cancel button (the API's rights, CSRF) and a running session's link, which
    opens the session on its own origin."""
    errors: list[str] = []
    s = fs.ok(
        "POST",
        "/v1/sessions",
        {"resource": "team-b/one", "app": "jupyter", "command": APP},
        fs.bob,  # type: ignore[attr-defined]
        expect=201,
    )
    sid, url = s["id"], s["url"]
    dev = sign_in(browser, fs, fs.bob, errors)  # type: ignore[attr-defined]
    dev.goto(f"{fs.url}/my-work")
    row = dev.locator(f"tr[data-task='{sid}']")
    link = row.get_by_role("link", name=f"Open session {sid}")
    link.wait_for(timeout=60_000)  # live, once the session runs
    assert row.locator(f"[data-session-url='{url}']").count() == 1
    shot(dev, "my-work-actions-developer", tmp)
    with dev.context.expect_page() as opened:
        link.click()
    app = opened.value
    app.wait_for_load_state()
    assert app.url.startswith(url) and not app.url.startswith(fs.url)  # its own origin
    assert "from the session" in app.content()  # the app itself, reached with the link's cookie
    app.close()
    # the team's admin sees it and may cancel it, not open it
    lead = sign_in(browser, fs, fs.erin, errors)  # type: ignore[attr-defined]
    lead.goto(f"{fs.url}/my-work")
    lead_row = lead.locator(f"tr[data-task='{sid}']")
    lead_row.get_by_text("(only bob may open it)").wait_for()
    assert lead_row.get_by_role("link", name=f"Open session {sid}").count() == 0
    # the row as a live update brings it (a fragment holds no CSRF value: app.js fills it)
    lead_row.evaluate("r => { r.dataset.old = '1'; }")
    lead.evaluate("document.querySelector('[data-live]').setAttribute('data-seq', '0')")
    wait_for(
        lambda: lead.locator(f"tr[data-task='{sid}'][data-old]").count() == 0,
        30,
        "a live update of My work",
    )
    assert lead_row.locator("input[name=csrf]").input_value() != ""
    asked: list[str] = []
    lead.once("dialog", lambda d: answer(d, asked, True))
    lead_row.get_by_role("button", name=f"Cancel {sid}").click()
    lead.wait_for_load_state()
    assert asked and sid in asked[0]
    lead.locator(f"tr[data-task='{sid}'][data-state='ended']").wait_for(timeout=30_000)
    shot(lead, "my-work-cancelled-lead", tmp)
    assert fs.task(sid)["end"]["text"] == "cancelled by user:erin: from the dashboard"
    # dismissing the question cancels nothing
    t = fs.submit(fs.bob, "team-b/one", waits_for(tmp / "never", "x", "y"))  # type: ignore[attr-defined]
    dev.goto(f"{fs.url}/my-work")
    dismissed: list[str] = []
    dev.once("dialog", lambda d: answer(d, dismissed, False))
    dev.evaluate("window.kliqueMark = 'no reload'")
    dev.locator(f"tr[data-task='{t}']").get_by_role("button", name=f"Cancel {t}").click()
    assert dismissed and dev.evaluate("window.kliqueMark") == "no reload"  # not sent
    assert fs.task(t)["state"] != "ended"
    dev.once("dialog", lambda d: d.accept())
    dev.locator(f"tr[data-task='{t}']").get_by_role("button", name=f"Cancel {t}").click()
    dev.locator(f"tr[data-task='{t}'][data-state='ended']").wait_for(timeout=30_000)
    assert not errors, errors


def test_usage_says_whose_figures_and_how_old_in_one_money_format(
    fs: FleetServer, worker: Any, browser: Any, tmp: Path
) -> None:
    """Items 5 and 6: a team admin's Usage page separates the estate's capacity from the
    team's own use, says how old the figures are (never more than a minute on a page
    opened), and every cost reads in one format."""
    t = fs.submit(fs.bob, "team-b/one", ["true"])  # type: ignore[attr-defined]
    wait_for(lambda: fs.task(t)["state"] == "ended", 60, "a task of team-b to run")
    errors: list[str] = []
    lead = sign_in(browser, fs, fs.erin, errors)  # type: ignore[attr-defined]
    lead.goto(f"{fs.url}/usage")
    lead.get_by_role("heading", name="Your groups' own use: team-b and the groups below").wait_for()
    lead.get_by_role(
        "heading", name=re.compile("^The estate's capacity, .*: shared by every group$")
    ).wait_for()
    lead.get_by_role("heading", name=re.compile("^Your groups' use of it, ")).wait_for()
    age = lead.locator("[data-estate-age]").inner_text()
    m = re.search(r"\((\d+)s ago;", age)
    assert m and int(m.group(1)) <= 60, age
    own = lead.get_by_role("table", name=re.compile("^GPU-hours and cost of team-b per pool"))
    assert Decimal(own.locator("tr:has(th:text-is('bare')) td").first.inner_text()) > 0
    money = lead.locator("[data-money]").all_inner_texts()
    assert money and all(MONEY.match(x) for x in money if x), money
    shot(lead, "usage-lead", tmp)
    assert not errors, errors


def test_a_department_head_sees_the_advice_for_their_subtree(
    fs: FleetServer, worker: Any, browser: Any, tmp: Path
) -> None:
    """Item 7 (issue 31): the advice ``kliqued advise --publish`` left in the daemon's
    directory, on the Policy page of lab's admin: team-a's limit held six tasks back while
    its two pools were half used, and raising it is kept."""
    lines = ["id,submit,resource,user,project,gpus,runtime"]
    lines += [f"a{i},0,team-a/one,alice,,,3600" for i in range(3)]
    lines += [f"e{i},0,team-a/elsewhere,alice,,,3600" for i in range(3)]
    dem = tmp / "demand.csv"
    dem.write_text("\n".join(lines) + "\n")
    argv = ["advise", "--estate", str(tmp / "estate"), "--demand", str(dem)]
    assert main([*argv, "--publish", str(Path(fs.db).parent)]) == 0
    errors: list[str] = []
    head = sign_in(browser, fs, fs.walter, errors)  # type: ignore[attr-defined]
    head.goto(f"{fs.url}/policy")
    head.get_by_role("heading", name="Advice for your subtree: lab and the groups below").wait_for()
    kept = head.locator("[data-advice-status='kept'] th").all_inner_texts()
    assert kept == ["team-a: limit 2 -> 3"], kept
    row = head.locator("[data-advice-status='kept']").inner_text()
    assert "2h → 1h" in row and "walter" in row
    assert "demand.csv" in head.locator("[data-advice-made]").inner_text()
    head.locator("[data-advice]").scroll_into_view_if_needed()
    shot(head, "policy-advice-head", tmp)
    # a developer gets no advice section
    dev = sign_in(browser, fs, fs.bob, errors)  # type: ignore[attr-defined]
    dev.goto(f"{fs.url}/policy")
    dev.get_by_role("heading", name="Groups and departments").wait_for()
    assert dev.locator("[data-advice]").count() == 0
    assert not errors, errors
