"""A real JupyterLab session used from a real browser through the control plane (issue 25,
item 11): Debian's chromium driven by Playwright opens the one-time link the API gives for
the session, JupyterLab's page loads (its bundle is several hundred KiB: the relay cut
answers at about 64 KiB, and the page stayed white), the launcher shows, a console opens,
and a cell computes ``6*7`` in a kernel reached over the relayed WebSocket.

The session is reached only through the URLs the API returns (the link's), whatever their
form. Skips, saying why, when chromium, Playwright or JupyterLab is absent."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.channels.test_sessions import PROFILES, _jupyter, fetch
from tests.daemon.fleet import ESTATE, FleetServer, real_workers, running_fleet, write_estate
from tests.harness.wait import wait_for
from tests.web.test_browser import CHROMIUM, sync_playwright

JUPYTER = _jupyter()

pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="chromium is not installed (Debian package "
        "`chromium`; tests/setup/system-packages.sh installs it as root)",
    ),
    pytest.mark.skipif(
        sync_playwright is None,
        reason="the playwright package is missing: pip install -e '.[test]'",
    ),
    pytest.mark.skipif(
        JUPYTER is None, reason="JupyterLab is not installed (pip install -e '.[test]' installs it)"
    ),
]


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[FleetServer]:
    estate = write_estate(tmp_path / "estate", {**ESTATE, "profiles.yaml": PROFILES})
    yield from running_fleet(tmp_path, users=("alice",), estate=estate, ttl="10s")


@pytest.fixture
def real(fs: FleetServer, tmp_path: Path) -> Iterator[Any]:
    yield from real_workers(fs, tmp_path)


def test_jupyterlab_runs_a_cell_in_chromium_through_the_control_plane(
    fs: FleetServer, real: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", f"{JUPYTER}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "jupyter-runtime"))
    # no layout saved from an earlier run (the launcher shows), none left for the next
    monkeypatch.setenv("JUPYTERLAB_WORKSPACES_DIR", str(tmp_path / "jupyter-workspaces"))
    worker = real("w1")
    token = fs.alice  # type: ignore[attr-defined]
    s = fs.ok(
        "POST", "/v1/sessions", {"resource": "team-a/one", "app": "jupyter"}, token, expect=201
    )
    sid, url = s["id"], s["url"]
    wait_for(
        lambda: fetch("GET", url + "api/status", token)[0] == 200,
        120,
        "JupyterLab to answer through the session's URL",
    )
    link = fs.ok("POST", f"/v1/sessions/{sid}/link", token=token)["url"]
    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on("requestfailed", lambda r: problems.append(f"failed: {r.url} {r.failure}"))
            page.goto(link)
            console = page.locator(".jp-LauncherCard[data-category='Console']").first
            try:
                console.wait_for(timeout=45_000)
            except Exception:
                page.screenshot(path=str(tmp_path / "jupyterlab.png"))
                raise AssertionError(f"JupyterLab's launcher did not show: {problems}")
            console.click()  # a console: it writes no notebook file where the app runs
            editor = page.locator(".jp-CodeConsole-promptCell .cm-content").first
            editor.wait_for(timeout=30_000)
            # the kernel up (keys typed while it starts are lost), then the code in the prompt
            page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=45_000)
            editor.click()
            page.keyboard.type("6*7")
            wait_for(
                lambda: editor.inner_text().strip() == "6*7",
                10,
                "the code to be in the console's prompt",
            )
            page.keyboard.press("Shift+Enter")
            out = page.locator(".jp-CodeConsole .jp-OutputArea-output").first
            try:
                out.wait_for(timeout=45_000)
            except Exception:
                page.screenshot(path=str(tmp_path / "jupyterlab.png"))
                raise AssertionError(f"the cell's output did not show: {problems}")
            assert out.inner_text().strip() == "42", (out.inner_text(), problems)
            assert not [m for m in problems if "page error" in m], problems
        finally:
            browser.close()
    # the cell ran in a kernel of this session's JupyterLab (its REST API says so)
    st, body, _ = fetch("GET", url + "api/kernels", token)
    assert st == 200 and len(json.loads(body)) >= 1, body
    fs.ok("POST", f"/v1/sessions/{sid}/stop", token=token)
    wait_for(lambda: fs.task(sid)["state"] == "ended", 60, "the session to end")
    # and its app with it: the worker drops a task's record once its process ended (a worker
    # stopped before that leaves the app running until the orphan watch ends it)
    wait_for(
        lambda: not list((worker.state_dir / "tasks").glob("*.json")),
        60,
        "the worker to end the session's app",
    )
