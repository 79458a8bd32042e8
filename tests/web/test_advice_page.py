"""The advisor's advice on the Policy page (issue 31): ``kliqued advise --publish DIR``
writes it into the daemon's directory, the page shows each person the changes for their
subtree, says when the advice was made, and names a file it cannot read. On the small
estate of tests/advise (team-a's limit held six tasks back while the pool idled: raising it
is kept), through an in-process daemon on that estate. In a browser:
tests/web/test_dashboard_browser.py."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from compiler.api import compile_dir
from kliqued.cli import main
from tests.advise.test_advise import demand, estate
from tests.harness.inproc import InProcServer

from .browser import Browser

OTHER = """  - name: other
    admins: [oscar]
    users: [oscar]
"""
"""A group outside lab's subtree, whose admin sees none of lab's advice."""


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[InProcServer, Path, Path]]:
    tmp = tmp_path_factory.mktemp("advice")
    d = estate(tmp, cap=8)
    text = (d / "estate.yaml").read_text().replace("policies:\n", OTHER + "policies:\n", 1)
    (d / "estate.yaml").write_text(text)
    assert compile_dir(d).estate is not None
    (tmp / "daemon").mkdir()
    s = InProcServer(tmp / "daemon", estate=d).start()
    try:
        yield s, d, demand(tmp, 1, 0)
    finally:
        log = s.log()
        assert s.stop() == 0, log


def section(html: str) -> str:
    return (
        html.split("data-advice>", 1)[1].split("</section>", 1)[0] if "data-advice>" in html else ""
    )


def test_published_advice_is_shown_for_each_ones_subtree(
    setup: tuple[InProcServer, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    s, d, dem = setup
    admin = Browser(s.url)
    admin.sign_in(s.admin or "")
    before = section(admin.page("/policy"))
    assert "No advice published yet" in before and "--publish DIR" in before
    # published into the daemon's directory, where its DuckDB file is
    where = Path(s.db).parent
    argv = ["advise", "--estate", str(d), "--demand", str(dem), "--publish", str(where)]
    assert main(argv) == 0
    assert f"published {where / 'advice.json'}" in capsys.readouterr().err
    got = section(admin.page("/policy"))
    assert "Advice for the estate" in got and "demand.csv" in got
    assert re.search(r"From <code>kliqued advise</code> of [\d-]+ [\d:]+ \(\d+s ago\)", got), got
    kept = re.findall(r'<tr data-advice-status="kept"><th scope="row">([^<]+)</th>', got)
    assert kept == ["team-a: limit 2 -&gt; 4"] or (
        len(kept) == 1 and kept[0].startswith("team-a: limit 2 -&gt;")
    ), kept
    assert "alice" in got and "lena" in got  # the approvers
    # the department head (lab's admin): lab's subtree, team-a's change in it
    lena = Browser(s.url)
    lena.sign_in(s.token({"user": "lena"}))
    head = section(lena.page("/policy"))
    assert "for your subtree: lab and the groups below" in head
    assert 'data-advice-status="kept"' in head and "team-a: limit 2" in head
    # another group's admin: none of it; a developer: no advice section
    oscar = Browser(s.url)
    oscar.sign_in(s.token({"user": "oscar"}))
    other = section(oscar.page("/policy"))
    assert "for your subtree: other" in other and "No change proposed for your subtree" in other
    assert "team-a: limit" not in other
    bob = Browser(s.url)
    bob.sign_in(s.token({"user": "bob"}))
    assert "data-advice>" not in bob.page("/policy")
    # a file it cannot read: the page says which and why, no traceback
    (where / "advice.json").write_text('{"version": 1, "changes": "x"}')
    bad = section(admin.page("/policy"))
    assert (
        "The published advice cannot be read" in bad
        and "field &#39;changes&#39; is missing or not a list" in bad
    )
    (where / "advice.json").unlink()
    assert "No advice published yet" in section(admin.page("/policy"))


def test_publish_needs_a_directory(
    setup: tuple[InProcServer, Path, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _, d, dem = setup
    argv = ["advise", "--estate", str(d), "--demand", str(dem), "--publish", str(tmp_path / "no")]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "--publish" in err and "no such directory" in err
