"""The audit trail in pages, its filters in the URL (issue 32: it was one 7,000-pixel page
after 25 minutes), on an in-process daemon of its own with enough events for three pages.
The links in a browser: tests/web/test_dashboard_browser.py."""

from __future__ import annotations

import html as htmllib
import re
from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

import pytest

from kliqued.web.pages import AUDIT_PAGE
from tests.harness.inproc import InProcServer
from tests.harness.wait import wait_for

from .browser import Browser

TASKS = 40


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcServer]:
    s = InProcServer(tmp_path_factory.mktemp("audit")).start()
    try:
        bob = s.token({"user": "bob"})
        erin = s.token({"user": "erin"})
        for i in range(TASKS):  # each: submitted, then cancelled (or placed, cancelled)
            tid = s.ok(
                "POST",
                "/v1/tasks",
                {"resource": "team-a/one", "command": ["true"]},
                bob,
                expect=201,
            )["id"]
            s.ok("POST", f"/v1/tasks/{tid}/cancel", {"reason": f"n{i}"}, bob)
        s.erin_task = s.ok(  # type: ignore[attr-defined]
            "POST", "/v1/tasks", {"resource": "team-b/one", "command": ["true"]}, erin, expect=201
        )["id"]
        s.bob, s.erin = bob, erin  # type: ignore[attr-defined]
        # the log quiet before the pages are read: erin's task placed, its event written
        wait_for(
            lambda: s.ok("GET", f"/v1/tasks/{s.erin_task}")["state"] == "placed",  # type: ignore[attr-defined]
            10,
            "erin's task to be placed",
        )
        yield s
    finally:
        log = s.log()
        assert s.stop() == 0, log


def rows(text: str) -> list[int]:
    return [int(x) for x in re.findall(r'<tr class="ev-[a-z_]+" data-seq="(\d+)"', text)]


def links(text: str) -> dict[str, str]:
    """The pager's links by their rel (the top and bottom pagers agree)."""
    found = re.findall(r'<a href="([^"]+)" rel="(prev|next)"', text)
    out = {rel: htmllib.unescape(href) for href, rel in found}
    assert len(found) in (0, 2, 4), found
    return out


def query(url: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}


def test_the_audit_trail_is_paged_with_its_filters_in_the_url(server: InProcServer) -> None:
    b = Browser(server.url)
    b.sign_in(server.admin or "")
    first = b.page("/audit")
    seqs = rows(first)
    assert len(seqs) == AUDIT_PAGE and seqs == sorted(seqs, reverse=True)
    assert f"Events 1–{AUDIT_PAGE}, newest first" in first
    got = links(first)
    assert "prev" not in got and got["next"] == "/audit?page=2"
    second = b.page(got["next"])
    seqs2 = rows(second)
    assert seqs2 and max(seqs2) == min(seqs) - 1  # the next ones, none skipped
    assert links(second)["prev"] == "/audit"  # page 1 is the plain URL
    # filters stay in the links: bob's submissions only, over pages
    url = "/audit?actor=user%3Abob&kind=submitted"
    page1 = b.page(url)
    assert len(rows(page1)) == min(AUDIT_PAGE, TASKS)
    assert server.erin_task not in page1  # type: ignore[attr-defined]
    text = re.sub(r"<[^>]+>", " ", page1.split("<tbody>", 1)[1])
    assert text.count("submitted to team-a/one by bob") == min(AUDIT_PAGE, TASKS)
    assert 'value="user:bob"' in page1 and '<option value="submitted" selected>' in page1
    # one task's events: exact, whatever the other filters
    tid = re.findall(r'<td class="t">(t-[0-9A-Z]+)</td>', page1)[0]
    one = b.page(f"/audit?task={tid}")
    assert set(re.findall(r'<td class="t">(t-[0-9A-Z]+)</td>', one)) == {tid}
    assert "cancelled" in one and "submitted" in one
    # a filter that finds more than a page: the next link keeps every filter
    many = b.page("/audit?actor=user%3Abob")
    assert query(links(many)["next"]) == {"actor": "user:bob", "page": "2"}
    last = b.page("/audit?actor=user%3Abob&page=2")
    assert query(links(last)["prev"]) == {"actor": "user:bob"}
    assert "next" not in links(last)  # 80 of bob's events: two pages
    assert len(rows(last)) == 2 * TASKS - AUDIT_PAGE
    # past the end: says so, with the way back
    beyond = b.page("/audit?actor=user%3Abob&page=9")
    assert "No events on page 9" in beyond
    # the live fragment is the same page (the page's script asks with the URL's query)
    live = b.get("/audit?actor=user%3Abob&page=2&live=1")
    assert live.status == 200 and rows(live.text) == rows(last)


def test_a_user_pages_through_their_own_events_only(server: InProcServer) -> None:
    b = Browser(server.url)
    b.sign_in(server.erin)  # type: ignore[attr-defined]
    page = b.page("/audit")
    assert server.erin_task in page and "by bob" not in page  # type: ignore[attr-defined]
    assert links(page) == {}  # one page
    assert "No event matches." in b.page("/audit?actor=user%3Abob")


def test_bad_paging_input_is_a_400_naming_it(server: InProcServer) -> None:
    b = Browser(server.url)
    b.sign_in(server.admin or "")
    for bad in ("0", "-1", "x", "1e3", "99999999999"):
        a = b.get(f"/audit?page={bad}")
        assert a.status == 400 and "page must be a number from 1 to" in a.text, bad
    a = b.get("/audit?kind=nonsense")
    assert a.status == 400 and "kind: no event kind" in a.text
