"""The Policy page shows the organisation's tree as ``kliqued budget`` prints it (issue 32:
it was a flat table with a Level column), on the example estate (business unit >
department > team), through an in-process daemon. In a browser:
tests/web/test_dashboard_browser.py."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from klique_util.tree import policy_tree
from tests.harness.inproc import InProcServer

from .browser import Browser

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcServer]:
    s = InProcServer(tmp_path_factory.mktemp("tree"), estate=ROOT / "estate").start()
    try:
        yield s
    finally:
        log = s.log()
        assert s.stop() == 0, log


def rows(html: str) -> list[tuple[int, str]]:
    return [
        (int(depth), name)
        for name, depth in re.findall(r'<tr data-policy="([^"]+)" data-depth="(\d+)"', html)
    ]


def test_the_policy_page_is_the_clis_tree(server: InProcServer) -> None:
    b = Browser(server.url)
    b.sign_in(server.admin or "")
    html = b.page("/policy")
    got = rows(html)
    api = server.ok("GET", "/v1/policies")["policies"]
    want = [(depth, p["name"]) for depth, p in policy_tree(api)]
    assert got == want  # the same rows in the same order at the same depth as the CLI
    assert max(d for d, _ in got) >= 2  # business unit > department > team
    assert ">Level<" not in html and ">Group<" not in html  # no flat table
    # a team below its department, each row saying which it is
    team = next(i for i, (d, _) in enumerate(got) if d == 2)
    parent = next(name for d, name in reversed(got[:team]) if d == 1)
    row = html.split(f'<tr data-policy="{got[team][1]}"', 1)[1].split("</tr>", 1)[0]
    assert f"under {parent}:" in row and "team" in row
    dept = html.split(f'<tr data-policy="{parent}"', 1)[1].split("</tr>", 1)[0]
    assert 'class="dept"' in html.split(f'<tr data-policy="{parent}"', 1)[1][:40]
    assert "department" in dept


def test_a_department_head_sees_their_subtree_as_a_tree(server: InProcServer) -> None:
    """victor administers the commercial business unit (estate/groups.yaml): its envelope
    at the top, the digital department's below it, digital's teams below that."""
    victor = server.token({"user": "victor"})
    api = server.ok("GET", "/v1/policies", token=victor)["policies"]
    b = Browser(server.url)
    b.sign_in(victor)
    got = rows(b.page("/policy"))
    assert got == [(d, p["name"]) for d, p in policy_tree(api)]
    assert got[0] == (0, "commercial") and (1, "digital") in got
    assert (2, "finance-analytics") in got and (2, "customer-ai") in got
