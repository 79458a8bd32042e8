"""Sessions on an origin of their own (issue 25, items 1 and 4), for real: a ``kliqued
serve``, a real ``klique-worker`` running the session apps, and Chromium (Playwright, the
system browser, as tests/web/test_browser.py).

An admin signed in to the dashboard opens a hostile session's page (its owner sent the
link): the page reads nothing of the dashboard, and the admin's dashboard sign-in still works
and was not replaced. A second session never receives the first one's cookies. A revoked
token ends, at its next request, both the session cookie and the dashboard cookie it opened,
and both cookies expire no later than their token. With ``--sessions-domain`` each session is
served at its own host only, and the control plane's own host serves no session."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any, Iterator

import aiohttp
import pytest
from yarl import URL

from tests.daemon.fleet import ESTATE, PY, FleetServer, real_workers, running_fleet
from tests.daemon.fleet import write_estate
from tests.harness.daemon import free_port
from tests.harness.wait import wait_for

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - the test extra installs it
    sync_playwright = None  # type: ignore[assignment]

HERE = Path(__file__).resolve().parent
HOSTILE = str(HERE / "hostile_session_app.py")
PLAIN = str(HERE.parent / "channels" / "session_app.py")


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[FleetServer]:
    estate = write_estate(tmp_path / "estate", ESTATE)
    yield from running_fleet(tmp_path, users=("alice",), estate=estate, ttl="10s")


@pytest.fixture
def real(fs: FleetServer, tmp_path: Path) -> Iterator[Any]:
    yield from real_workers(fs, tmp_path)


def fetch(
    method: str, url: str, token: str | None = None, jar: Any = None, **kw: Any
) -> tuple[int, bytes, Any]:
    async def go() -> tuple[int, bytes, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        headers.update(kw.pop("headers", {}))
        async with aiohttp.ClientSession(cookie_jar=jar) as http:
            async with http.request(
                method, url, headers=headers, allow_redirects=False, **kw
            ) as resp:
                return resp.status, await resp.read(), resp.headers

    return asyncio.run(go())


def start(fs: FleetServer, token: str, command: list[str]) -> dict:
    s = fs.ok(
        "POST",
        "/v1/sessions",
        {"resource": "team-a/one", "app": "shell", "command": command},
        token,
        expect=201,
    )
    wait_for(
        lambda: fetch("GET", s["url"], token)[0] == 200,
        60,
        f"session {s['id']} to answer through its URL",
    )
    return s


def link(fs: FleetServer, token: str, sid: str) -> str:
    return fs.ok("POST", f"/v1/sessions/{sid}/link", token=token)["url"]


def set_cookie(headers: Any, name: str) -> SimpleCookie:
    for raw in headers.getall("Set-Cookie", []):
        c: SimpleCookie = SimpleCookie()
        c.load(raw)
        if name in c:
            return c
    raise AssertionError(f"no Set-Cookie {name} in {headers}")


@pytest.mark.skipif(
    CHROMIUM is None or sync_playwright is None,
    reason="chromium or playwright is missing (tests/setup/system-packages.sh"
    " installs chromium; pip install -e '.[test]' playwright)",
)
def test_a_hostile_session_opened_by_an_admin_reads_nothing_of_the_dashboard(
    fs: FleetServer, real: Any
) -> None:
    real("w1")
    alice = fs.alice  # type: ignore[attr-defined]
    hostile = start(fs, alice, [PY, HOSTILE, fs.url])
    plain = start(fs, alice, [PY, PLAIN])
    # the control plane's own origin serves no session
    st, body, _ = fetch("GET", f"{fs.url}/sessions/{hostile['id']}/", alice)
    assert st == 404 and b"not served on the control plane" in body, body
    assert URL(hostile["url"]).origin() != URL(fs.url).origin()
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            ctx = b.new_context()
            page = ctx.new_page()
            page.goto(f"{fs.url}/")
            page.get_by_label("API token").fill((fs.admin or ""))
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_url(lambda u: "/signin" not in u)
            page.goto(f"{fs.url}/audit")
            assert "/signin" not in page.url
            dashboard = {c["name"]: c["value"] for c in ctx.cookies(fs.url)}
            signed = dashboard["klique_session"]
            # the dashboard's cookie ends with its token or its day (item 4)
            cookie = next(c for c in ctx.cookies(fs.url) if c["name"] == "klique_session")
            assert cookie["expires"] > 0 and cookie["httpOnly"]

            # the admin follows the link alice sent: her hostile page runs
            hp = ctx.new_page()
            resp = hp.goto(link(fs, alice, hostile["id"]))
            assert resp is not None and resp.status == 200
            headers = resp.headers
            assert "connect-src 'self'" in headers["content-security-policy"]
            assert "frame-ancestors 'self'" in headers["content-security-policy"]
            assert headers["x-frame-options"] == "SAMEORIGIN"
            assert "clear-site-data" not in headers
            assert "service-worker-allowed" not in headers
            hp.wait_for_function("window.done === true", timeout=30_000)
            results = hp.evaluate("window.results")
            text = json.dumps(results)
            assert "klique_" not in results["cookie"], results
            for path, got in results["reads"].items():
                assert got.startswith("refused"), (path, got)
            assert (
                results["frame"] is None
                or results["frame"].startswith("refused")
                or results["frame"] == ""
            ), results["frame"]
            for secret in ((fs.admin or ""), signed, "Audit", "t-0"):
                assert secret not in text, (secret, text)

            # the admin's dashboard: still signed in as the admin, the same cookie
            page.goto(f"{fs.url}/audit")
            assert "/signin" not in page.url
            assert page.get_by_text("role:admin").first.is_visible()
            page.goto(f"{fs.url}/orchestration")
            assert "/signin" not in page.url
            jar = [c for c in ctx.cookies(fs.url) if c["name"] == "klique_session"]
            assert signed in [c["value"] for c in jar]
            assert "planted-by-http" not in [c["value"] for c in jar]
            # and it refuses to be framed by a session's page
            dash = ctx.request.get(f"{fs.url}/audit")
            assert "frame-ancestors 'none'" in dash.headers["content-security-policy"]
            assert dash.headers["x-frame-options"] == "DENY"

            # a second session of the same browser never receives the first one's cookies
            pp = ctx.new_page()
            resp = pp.goto(link(fs, alice, plain["id"]))
            assert resp is not None and resp.status == 200
            assert pp.url == plain["url"]  # its app answers the headers it received
            cookies = json.loads(pp.inner_text("body"))["headers"].get("Cookie", "")
            assert "klique_" not in cookies and "hostile" not in cookies, cookies
            # and the hostile session's own path-scoped cookie went to its own app only
            hp.goto(hostile["url"] + "headers")
            mine = json.loads(hp.inner_text("body"))["headers"].get("Cookie", "")
            assert "own=hostile-own" in mine and "klique_" not in mine, mine
            assert "everywhere" not in mine and "widedomain" not in mine, mine
        finally:
            b.close()


def test_a_revoked_token_ends_its_session_cookie_and_its_dashboard_cookie_at_once(
    fs: FleetServer, real: Any
) -> None:
    real("w1")
    made = fs.ok("POST", "/v1/tokens", {"user": "alice", "expires_in": "1h"}, expect=201)
    token, token_id = made["token"], made["id"]
    s = start(fs, token, [PY, PLAIN])
    # the session's cookie: set by the link, expiring no later than its token
    st, _, headers = fetch("GET", link(fs, token, s["id"]))
    assert st == 303, headers
    c = set_cookie(headers, "klique_app_session")["klique_app_session"]
    assert 0 < int(c["max-age"]) <= 3600, c.OutputString()
    assert c["path"] == f"/sessions/{s['id']}/" and c["httponly"]
    app_cookie = {"Cookie": f"klique_app_session={c.value}"}
    assert fetch("GET", s["url"], headers=app_cookie)[0] == 200
    # the dashboard's cookie: the same
    st, _, headers = fetch("POST", f"{fs.url}/signin", data={"token": token, "next": "/"})
    assert st == 303, headers
    d = set_cookie(headers, "klique_session")["klique_session"]
    assert 0 < int(d["max-age"]) <= 3600, d.OutputString()
    dash_cookie = {"Cookie": f"klique_session={d.value}"}
    st, _, headers = fetch("GET", f"{fs.url}/my-work", headers=dash_cookie)
    assert st == 200, headers
    # the token revoked: both cookies are refused at their next request
    fs.ok("DELETE", f"/v1/tokens/{token_id}")
    st, body, _ = fetch("GET", s["url"], headers=app_cookie)
    assert st == 401 and b"from the session" not in body, body
    st, _, headers = fetch("GET", f"{fs.url}/my-work", headers=dash_cookie)
    assert st == 303 and "/signin" in headers["Location"], headers
    assert re.search(r"revoked", headers["Location"]), headers["Location"]


def test_with_a_sessions_domain_each_session_is_served_at_its_own_host_only(tmp_path: Path) -> None:
    port = free_port()
    estate = write_estate(tmp_path / "estate", ESTATE)
    gen = running_fleet(
        tmp_path,
        users=("alice",),
        estate=estate,
        ttl="10s",
        extra=[
            "--sessions-listen",
            f"127.0.0.1:{port}",
            "--sessions-domain",
            f"http://sessions.test:{port}",
        ],
    )
    fs = next(gen)
    workers = real_workers(fs, tmp_path)
    try:
        next(workers)("w1")
        alice = fs.alice  # type: ignore[attr-defined]
        s = fs.ok(
            "POST",
            "/v1/sessions",
            {"resource": "team-a/one", "app": "shell", "command": [PY, PLAIN]},
            alice,
            expect=201,
        )
        sid = s["id"]
        host = f"{sid.lower()}.sessions.test:{port}"
        assert s["url"] == f"http://{host}/sessions/{sid}/"
        at = f"http://127.0.0.1:{port}/sessions/{sid}/"
        page = wait_for(
            lambda: r if (r := fetch("GET", at, alice, headers={"Host": host}))[0] == 200 else None,
            60,
            "the session at its own host",
        )
        assert json.loads(page[1])["hello"] == "from the session"
        assert "connect-src 'self'" in page[2]["Content-Security-Policy"]
        # its root leads to its path; any other host, or its host with another session's
        # path, serves nothing; nor does the control plane's own host
        st, _, headers = fetch("GET", f"http://127.0.0.1:{port}/", headers={"Host": host})
        assert st == 303 and headers["Location"] == f"/sessions/{sid}/"
        for other in (
            f"127.0.0.1:{port}",
            f"t-0000000000000.sessions.test:{port}",
            f"{sid.lower()}.sessions.test.evil:{port}",
        ):
            st, body, _ = fetch("GET", at, alice, headers={"Host": other})
            assert st == 404 and b"from the session" not in body, (other, st, body)
        st, body, _ = fetch(
            "GET",
            f"http://127.0.0.1:{port}/sessions/t-0000000000000/",
            alice,
            headers={"Host": host},
        )
        assert st == 404, body
        st, body, _ = fetch("GET", f"{fs.url}/sessions/{sid}/", alice)
        assert st == 404 and b"from the session" not in body
        # a page of another host of the domain (another session) may not use the cookie
        st, _, headers = fetch(
            "GET",
            link(fs, alice, sid).replace(f"http://{host}", f"http://127.0.0.1:{port}"),
            headers={"Host": host},
        )
        assert st == 303
        c = set_cookie(headers, "klique_app_session")["klique_app_session"]
        own = {"Host": host, "Cookie": f"klique_app_session={c.value}"}
        assert fetch("GET", at, headers=own)[0] == 200
        assert fetch("GET", at, headers={**own, "Origin": f"http://{host}"})[0] == 200
        st, body, _ = fetch(
            "GET", at, headers={**own, "Origin": f"http://t-0000000000000.sessions.test:{port}"}
        )
        assert st == 403 and b"from the session" not in body, body
    finally:
        for g in (workers, gen):
            for _ in g:
                pass
