"""The dashboard's HTML, checked without a browser: sign-in and sessions, CSRF, and that each
kind of person sees on each page what the API shows them and nothing more (issue 13)."""

from __future__ import annotations

import csv
import html as htmllib
import io
import json
import re
from decimal import Decimal

import duckdb

from tests.harness.daemon import Server
from tests.harness.typed import present

from .browser import Browser
from .conftest import People, Work

PAGES = ("orchestration", "policy", "my-work", "usage", "audit", "estate")


def signed_in(server: Server, token: str) -> Browser:
    b = Browser(server.url)
    b.sign_in(token)
    return b


# --------------------------------------------------------------------------- sessions
def test_without_a_session_pages_redirect_to_the_sign_in_form_and_fragments_are_401(
    server: Server,
) -> None:
    b = Browser(server.url)
    for page in PAGES:
        a = b.get(f"/{page}?x=1")
        assert a.status == 303, (page, a.status)
        assert a.location == f"/signin?next=%2F{page}%3Fx%3D1"
    assert b.get("/orchestration?live=1").status == 401
    assert b.get("/usage/export?format=csv").status == 401
    assert b.get("/my-work/t-000/log.txt").status == 401  # the raw log, for tools
    assert b.get("/my-work/t-000/log").status == 303  # the log's page: sign in first
    a = b.get("/")
    assert a.status == 303 and present(a.location).startswith("/signin")
    form = b.get("/signin")
    assert form.status == 200
    assert '<label for="token">' in form.text and 'type="password"' in form.text


def test_sign_in_sets_a_strict_http_only_session_cookie_and_lands_on_a_page(
    server: Server, people: People
) -> None:
    b = Browser(server.url)
    a = b.post("/signin", {"token": people.bob, "next": "/"})
    assert a.status == 303
    assert a.location == "/my-work"  # a developer lands on their work
    cookie = a.headers["Set-Cookie"]
    assert cookie.startswith("klique_session=")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    assert "Secure" not in cookie  # plain HTTP here; set over TLS (request.secure)
    assert people.bob not in cookie  # the token itself never goes into the cookie
    assert "Signed in as <strong>user:bob</strong>" in b.page("/my-work")
    # next= goes back where the person was headed, never to another site
    b2 = Browser(server.url)
    assert b2.post("/signin", {"token": people.bob, "next": "/audit?q=x"}).location == "/audit?q=x"
    for evil in ("//evil.example/x", "https://evil.example/", "/\\evil.example"):
        assert (
            Browser(server.url).post("/signin", {"token": people.bob, "next": evil}).location
            == "/my-work"
        )


def test_a_wrong_or_worker_token_is_refused_with_a_clear_message(
    server: Server, people: People
) -> None:
    b = Browser(server.url)
    a = b.post("/signin", {"token": "kq_not-a-token", "next": "/"})
    assert a.status == 401 and "token: unknown token" in a.text
    assert "Set-Cookie" not in a.headers
    a = b.post("/signin", {"token": people.worker, "next": "/"})
    assert a.status == 401 and "a worker token cannot sign in" in a.text
    a = b.post("/signin", {"token": "", "next": "/"})
    assert a.status == 401 and "token: paste your API token" in a.text
    assert 'aria-invalid="true"' in a.text


def test_csrf_a_post_without_the_session_value_or_from_another_site_is_refused(
    server: Server, people: People
) -> None:
    b = signed_in(server, people.alice)
    assert b.csrf
    a = b.post("/signout", {})
    assert a.status == 403 and "csrf" in a.text
    a = b.post("/signout", {"csrf": "forged"})
    assert a.status == 403
    a = b.post("/signout", {"csrf": b.csrf}, headers={"Origin": "http://evil.example"})
    assert a.status == 403 and "another site" in a.text
    assert b.get("/policy").status == 200  # still signed in after the refusals
    # login CSRF: a sign-in form posted from another site
    a = Browser(server.url).post(
        "/signin", {"token": people.alice}, headers={"Origin": "http://evil.example"}
    )
    assert a.status == 403
    a = b.post("/signout", {"csrf": b.csrf}, headers={"Origin": server.url})
    assert a.status == 303 and a.location == "/signin"
    assert 'klique_session=""' in a.headers["Set-Cookie"] or "Max-Age=0" in a.headers["Set-Cookie"]
    assert b.get("/policy").status == 303  # the session is gone


def test_revoking_the_token_ends_its_sessions(server: Server) -> None:
    made = server.ok("POST", "/v1/tokens", {"user": "bob", "name": "web"}, expect=201)
    b = signed_in(server, made["token"])
    assert b.get("/my-work").status == 200
    server.ok("DELETE", f"/v1/tokens/{made['id']}", expect=204)
    a = b.get("/my-work")
    assert (
        a.status == 303 and "why=token" in present(a.location) and "revoked" in present(a.location)
    )


# --------------------------------------------------------------------------- who sees what
def nav(html: str) -> list[str]:
    block = html.split('aria-label="Dashboard pages"', 1)[1].split("</nav>", 1)[0]
    return re.findall(r'href="/([a-z-]+)"', block)


def test_each_role_is_offered_and_may_open_only_its_pages(
    server: Server, people: People, work: Work
) -> None:
    want = {
        people.admin: set(PAGES),
        people.finance: {"orchestration", "policy", "usage", "audit", "estate"},
        people.planner: {"orchestration", "estate"},
        people.alice: set(PAGES),  # a team admin reads the ledger
        people.bob: set(PAGES) - {"usage"},  # a developer does not
    }
    for token, pages in want.items():
        b = signed_in(server, token)
        assert set(nav(b.page("/estate"))) == pages
        for page in set(PAGES) - pages:
            a = b.get(f"/{page}")
            assert a.status == 403, (page, a.status)
            assert "may not open" in a.text


def test_my_work_shows_own_tasks_and_admin_groups_tasks_only(
    server: Server, people: People, work: Work
) -> None:
    bob = signed_in(server, people.bob).page("/my-work")
    assert work.bob_task in bob
    assert work.alice_task not in bob and work.erin_task not in bob
    alice = signed_in(server, people.alice).page("/my-work")  # admin of team-a
    assert work.alice_task in alice and work.bob_task in alice
    assert work.erin_task not in alice
    admin = signed_in(server, people.admin).page("/my-work")
    assert all(t in admin for t in (work.alice_task, work.bob_task, work.erin_task))
    # why a task ended, in its owner's words
    assert "cancelled by user:bob: test" in bob


def test_a_task_log_is_for_who_may_see_the_task(server: Server, people: People, work: Work) -> None:
    erin = signed_in(server, people.erin)
    a = erin.get(f"/my-work/{work.bob_task}/log")
    assert a.status == 404 and f"no task {work.bob_task}" in a.text
    assert erin.get(f"/my-work/{work.bob_task}/log.txt").status == 404
    bob = signed_in(server, people.bob)
    # issue 32: a page in the site's frame (the live tail is tests/web/test_dashboard_browser)
    a = bob.get(f"/my-work/{work.bob_task}/log")
    assert a.status == 200 and a.headers["Content-Type"].startswith("text/html")
    assert (
        f"Log of {work.bob_task}" in a.text and "Signed in as <strong>user:bob</strong>" in a.text
    )
    assert f'href="/my-work/{work.bob_task}/log.txt"' in a.text
    # and the raw text at its own URL, for tools
    a = bob.get(f"/my-work/{work.bob_task}/log.txt")
    assert a.status == 200 and a.headers["Content-Type"].startswith("text/plain")
    assert a.headers["X-Klique-Task-State"] == "ended"
    a = bob.get(f"/my-work/{work.bob_task}/log.txt?offset=-1")
    assert a.status == 400 and "offset must be a byte count" in a.text
    assert a.headers["Content-Type"].startswith("text/plain")


def test_a_log_read_is_cut_at_whole_characters() -> None:
    from kliqued.web.logpage import utf8_end, utf8_start

    text = "ab é € 😀".encode()
    for cut in range(len(text) + 1):
        head = text[:cut][: utf8_end(text[:cut])]
        head.decode("utf-8")  # never a broken character at the end
        tail = text[cut:][utf8_start(text[cut:]) :]
        tail.decode("utf-8")  # nor at the start
        assert len(head) >= cut - 3
    assert utf8_end("é".encode()[:1]) == 0 and utf8_end(b"ab") == 2


def test_policy_view_shows_the_groups_and_department_a_person_may_see(
    server: Server, people: People, work: Work
) -> None:
    def policies(token: str) -> set[str]:
        return set(re.findall(r'data-policy="([^"]+)"', signed_in(server, token).page("/policy")))

    assert policies(people.bob) == {"team-a"}
    assert policies(people.erin) == {"team-b"}
    assert policies(people.walter) == {"team-a", "team-b"}  # the department's admin
    assert policies(people.finance) == {"team-a", "team-b"}
    html = signed_in(server, people.alice).page("/policy")
    assert "Burn-down: team-a" in html  # team-a has a budget
    assert "budget hours left" in html


def test_orchestration_workers_and_events_by_role(
    server: Server, people: People, work: Work
) -> None:
    admin = signed_in(server, people.admin).page("/orchestration")
    assert "Workers and their health" in admin
    assert 'data-pool="pool-1"' in admin and 'data-pool="pool-2"' in admin
    assert work.erin_task in admin and "placed on pool" in admin
    bob = signed_in(server, people.bob).page("/orchestration")
    assert "Workers and their health" not in bob
    assert 'data-pool="pool-1"' in bob  # pools are everyone's (GET /v1/pools)
    assert work.bob_task in bob and work.erin_task not in bob
    planner = signed_in(server, people.planner).page("/orchestration")
    assert "No events for you to see." in planner


def test_audit_trail_search_finds_visible_events_only(
    server: Server, people: People, work: Work
) -> None:
    admin = signed_in(server, people.admin)
    html = admin.page(f"/audit?q={work.erin_task}")
    assert work.erin_task in html and work.bob_task not in html
    assert "submitted to team-b/one by erin" in html
    assert "estate revision" in admin.page("/audit?kind=estate_applied")
    bob = signed_in(server, people.bob)
    assert "No event matches." in bob.page(f"/audit?q={work.erin_task}")
    a = bob.get("/audit?kind=nonsense")
    assert a.status == 400 and "kind: no event kind" in a.text


def test_bad_parameters_are_a_400_page_naming_them(server: Server, people: People) -> None:
    b = signed_in(server, people.admin)
    for path, field in (
        ("/orchestration?window=3y", "window"),
        ("/usage?from=yesterday", "from"),
        ("/usage?from=2026-12-02&to=2026-12-01", "before"),
        ("/usage?by=colour", "by"),
        ("/my-work?state=asleep", "state"),
        ("/usage?from=0001-01-01&to=9999-12-31", "to"),
        ("/usage/export?format=xlsx", "format"),
        ("/usage/export?from=2026-13-01", "from"),
    ):
        a = b.get(path)
        assert a.status == 400, path
        assert field in a.text and "Traceback" not in a.text
        assert a.headers["Content-Type"].startswith("text/html")


def test_live_fragment_and_its_no_change_answer(server: Server, people: People, work: Work) -> None:
    b = signed_in(server, people.admin)
    a = b.get("/orchestration?live=1")
    assert a.status == 200 and "<html" not in a.text and 'data-pool="pool-1"' in a.text
    seq = a.headers["X-Klique-Seq"]
    assert b.get(f"/orchestration?live=1&seq={seq}&fresh=1").status == 204
    assert b.get(f"/orchestration?live=1&seq={seq}&fresh=0").status == 200


def test_browsers_asking_at_once_get_the_same_live_fragment(server: Server, people: People) -> None:
    from concurrent.futures import ThreadPoolExecutor

    browsers = [signed_in(server, people.admin) for _ in range(8)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda b: b.get("/policy?live=1"), browsers))
    assert {a.status for a in answers} == {200}
    assert all(a.headers["Content-Type"].startswith("text/html") for a in answers)
    assert all('data-policy="team-a"' in a.text for a in answers)
    assert all(a.headers["X-Klique-Seq"] for a in answers)
    # another principal never gets the admin's fragment
    bob = signed_in(server, people.bob).get("/policy?live=1")
    assert 'data-policy="team-b"' not in bob.text


def test_usage_csv_and_parquet_sum_to_the_ledger_and_scope_by_group(
    server: Server, people: People, work: Work
) -> None:
    def sums(text: str) -> tuple[Decimal, set[str]]:
        rows = list(csv.DictReader(io.StringIO(text)))
        return sum((Decimal(r["gpu_hours"]) for r in rows), Decimal(0)), {r["task"] for r in rows}

    rng = "from=2000-01-01&to=2100-01-01"
    fin = signed_in(server, people.finance)
    a = fin.get(f"/usage/export?format=csv&{rng}")
    assert a.status == 200 and a.headers["Content-Type"].startswith("text/csv")
    assert "attachment" in a.headers["Content-Disposition"]
    total, tasks = sums(a.text)
    assert {work.bob_task, work.erin_task} <= tasks
    ended = server.ok(
        "POST",
        "/v1/ledger/sql",
        {
            "sql": f"SELECT sum(gpu_hours) FROM usage WHERE task IN ('{work.bob_task}', "
            f"'{work.erin_task}')"
        },
    )["rows"][0][0]
    rows = list(csv.DictReader(io.StringIO(a.text)))
    assert sum(Decimal(r["gpu_hours"]) for r in rows if r["task"] != work.alice_task) == Decimal(
        str(ended)
    )
    assert total > 0
    # a team admin downloads their team's rows only
    alice_total, alice_tasks = sums(
        signed_in(server, people.alice).get(f"/usage/export?format=csv&{rng}").text
    )
    assert work.bob_task in alice_tasks and work.erin_task not in alice_tasks
    # Parquet: the same rows
    pq = fin.get(f"/usage/export?format=parquet&{rng}")
    assert pq.status == 200 and pq.body[:4] == b"PAR1"
    con = duckdb.connect()
    con.execute("CREATE TABLE f AS SELECT * FROM read_parquet($1)", [_tmp_write(pq.body)])
    assert present(con.execute("SELECT count(*) FROM f").fetchone())[0] == len(rows)
    # the page's totals are over the same rows
    page = fin.page(f"/usage?{rng}")
    assert 'data-by="group"' in page and "team-a" in page and "team-b" in page
    # the CIO's figures for the month of `from` (issue 17): capacity against use per pool
    month = fin.page("/usage")
    assert "Use of the estate" in month and "data-estate-use" in month and "data-idle" in month
    assert "pool-1" in month.split("Use of the estate", 1)[1]
    bob = signed_in(server, people.bob).get(f"/usage/export?format=csv&{rng}")
    assert bob.status == 403


def _tmp_write(body: bytes) -> str:
    import tempfile

    f = tempfile.NamedTemporaryFile(suffix=".parquet", delete=False)
    f.write(body)
    f.close()
    return f.name


def test_static_files_come_from_the_packages_and_pages_carry_a_strict_csp(
    server: Server, people: People
) -> None:
    b = Browser(server.url)
    js = b.get("/static/plotly.min.js")
    assert js.status == 200 and b"plotly" in js.body[:2000].lower()
    assert b.get("/static/app.js").status == 200
    assert b.get("/static/../pyproject.toml").status == 404
    html = signed_in(server, people.admin).get("/estate")
    csp = html.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert "<script>" not in html.text  # chart data travels in JSON blocks only


def test_the_api_is_unchanged_by_the_dashboard(server: Server) -> None:
    """An unknown path is still the API's JSON 404, and /v1 still needs a bearer token."""
    status, body = server.call("GET", "/nothing-here")
    assert status == 404 and body["error"]["code"] == "not-found"
    status, body = server.call("GET", "/v1/tasks", token=None)
    assert status == 401


def test_estate_page_shows_the_last_plan_after_a_revision(tmp_path) -> None:
    import shutil
    from tests.harness.daemon import SMALL_ESTATE
    from tests.harness.wait import wait_for

    estate = tmp_path / "estate"
    shutil.copytree(SMALL_ESTATE, estate)
    s = Server(tmp_path, estate=estate).start()
    try:
        b = signed_in(s, s.admin or "")
        assert "Only one revision has been applied" in b.page("/estate")
        first = s.ok("GET", "/v1/estate")["revision"]
        pol = estate / "policies.yaml"
        pol.write_text(pol.read_text().replace("limit: 10", "limit: 12", 1))
        wait_for(lambda: s.ok("GET", "/v1/estate")["revision"] != first, 20, "the new revision")
        html = b.page("/estate")
        assert f"from <code>{first[:19]}</code>" in html
        assert "<strong>update</strong> policy <code>team-a</code>" in html
        assert "<code>limit</code>: 10 → 12" in html
    finally:
        assert s.stop() == 0


def test_odd_input_is_never_a_5xx(server: Server, people: People) -> None:
    """Every page and download with odd values of every parameter it reads: a 4xx or a page,
    never a 5xx (the module's teardown also checks the log has no traceback)."""
    from urllib.parse import quote

    b = signed_in(server, people.admin)
    odd = [
        "",
        "x" * 5000,
        "é ü 中",
        "%",
        "'; DROP TABLE events; --",
        "\\u0000",
        "<script>",
        "2026-02-30",
        "-1",
        "1e400",
        "..",
        "//evil",
    ]
    paths = [
        "/orchestration",
        "/policy",
        "/my-work",
        "/usage",
        "/audit",
        "/estate",
        "/usage/export",
        "/signin",
    ]
    params = [
        "window",
        "q",
        "state",
        "from",
        "to",
        "by",
        "kind",
        "format",
        "live",
        "seq",
        "fresh",
        "next",
    ]
    for path in paths:
        for name in params:
            for value in odd:
                a = b.get(f"{path}?{name}={quote(value)}")
                assert a.status < 500, (path, name, value, a.status, a.text[:300])
                assert "<script>" not in a.text or "&lt;script&gt;" in a.text
    for value in odd:
        a = Browser(server.url).post("/signin", {"token": value, "next": value})
        assert a.status in (401, 403), (value, a.status)


# --------------------------------------------------------------------------- numbers
NUMBER_NOISE = re.compile(r"\d\.\d+e-\d+|\b\d+\.0\b(?! ?%)")
"""What the CLI never prints (klique_util.fmt): an exponent (``3.4e-05``) or a whole
number with ``.0`` (``32.0``, ``600.0 h``)."""


def test_numbers_read_as_the_cli_prints_them(server: Server, people: People, work: Work) -> None:
    """Issue 32: GPU-hours came out as ``3.4e-05``, capacities as ``32.0``, budgets as
    ``600.0 h``. Every page's visible text is checked (attribute values are the machine's)."""
    b = signed_in(server, people.admin)
    for page in PAGES:
        html = b.page(f"/{page}")
        html = re.sub(r"<script.*?</script>", " ", html, flags=re.S)  # charts' data
        text = re.sub(r"<[^>]+>", " ", html)  # the visible text, not attributes or markup
        noise = [text[max(0, m.start() - 60) : m.end() + 20] for m in NUMBER_NOISE.finditer(text)]
        assert not noise, (page, noise)
    estate = re.sub(r"<[^>]+>", " ", b.page("/estate"))
    assert re.search(r"\b1000 h per month\b", estate), estate  # team-a's budget


# --------------------------------------------------------------------------- errors
def test_a_browser_gets_html_404_and_405_pages_and_a_client_json(
    server: Server, people: People
) -> None:
    """Issue 32: a wrong URL answered the API's raw JSON in the browser. A page request
    (Accept: text/html) gets a page in the site's frame; the API's paths and clients that
    do not ask for HTML keep the contract's JSON."""
    b = signed_in(server, people.bob)
    html = {"Accept": "text/html,application/xhtml+xml"}
    a = b.get("/no-such-page", headers=html)
    assert a.status == 404 and a.headers["Content-Type"].startswith("text/html")
    assert "404: not found" in a.text and "There is no page at /no-such-page." in a.text
    assert "Signed in as <strong>user:bob</strong>" in a.text  # the site's frame
    a = b.get("/signout", headers=html)  # a form's target: POST only
    assert a.status == 405 and a.headers["Content-Type"].startswith("text/html")
    assert "POST" in a.headers["Allow"] and "GET is not allowed on /signout" in a.text
    # the API's own paths, and a client without text/html: JSON, as the contract says
    for path, headers in (("/v1/nope", html), ("/no-such-page", {"Accept": "*/*"})):
        a = b.get(path, headers=headers)
        assert a.status == 404 and a.headers["Content-Type"].startswith("application/json")
        assert json.loads(a.text)["error"]["code"] == "not-found"


def test_one_time_convention_said_once(server: Server, people: People, work: Work) -> None:
    """Issue 32: "Updated 1:28:45 AM" (the browser's zone, 12-hour) beside "as of
    2026-12-07 01:28:44" (UTC). Every time is UTC and 24-hour, and each page says so once,
    in its footer; the live status line is written in UTC by app.js."""
    b = signed_in(server, people.admin)
    for page in PAGES:
        html = re.sub(r"<script.*?</script>", " ", b.page(f"/{page}"), flags=re.S)
        text = re.sub(r"<[^>]+>", " ", html)
        assert text.count("UTC") == 1 and "All times are UTC, 24-hour." in text, page
        assert not re.search(r"\b(AM|PM)\b", text), page
    js = b.get("/static/app.js").text
    assert "toLocaleTimeString" not in js and "toISOString().slice(11, 19)" in js


# --------------------------------------------------------------------------- actions
def test_cancel_from_my_work_has_the_apis_rights_and_csrf(server: Server, people: People) -> None:
    """Issue 32: a cancel button for one's own and one's team's tasks, with the API's
    rights (who may see the task) and the CSRF checks of every dashboard form."""
    tid = server.ok(
        "POST", "/v1/tasks", {"resource": "team-a/one", "command": ["true"]}, people.bob, expect=201
    )["id"]
    form = f'action="/my-work/{tid}/cancel"'
    bob = signed_in(server, people.bob)
    assert form in bob.page("/my-work")
    # the live part is shared by a person's sessions: no session value in it
    live = bob.get("/my-work?live=1").text
    assert form in live and 'name="csrf" value="" data-csrf' in live
    # another team's user: the API's 404, and nothing cancelled
    erin = signed_in(server, people.erin)
    erin.page("/my-work")
    a = erin.post(f"/my-work/{tid}/cancel", {"csrf": erin.csrf})
    assert a.status == 404 and f"no task {tid}" in a.text
    # finance sees no tasks and cancels none
    fin = signed_in(server, people.finance)
    fin.page("/usage")
    a = fin.post(f"/my-work/{tid}/cancel", {"csrf": fin.csrf})
    assert a.status == 403
    # no CSRF value, a wrong one, another site: refused
    assert bob.post(f"/my-work/{tid}/cancel", {}).status == 403
    assert bob.post(f"/my-work/{tid}/cancel", {"csrf": "forged"}).status == 403
    a = bob.post(
        f"/my-work/{tid}/cancel", {"csrf": bob.csrf}, headers={"Origin": "http://evil.example"}
    )
    assert a.status == 403 and "another site" in a.text
    assert server.ok("GET", f"/v1/tasks/{tid}")["state"] != "ended"
    # the team's admin cancels it, and lands back on My work
    alice = signed_in(server, people.alice)
    assert form in alice.page("/my-work?state=placed") or form in alice.page("/my-work")
    a = alice.post(f"/my-work/{tid}/cancel", {"csrf": alice.csrf, "back": "/my-work?state=ended"})
    assert a.status == 303 and a.location == "/my-work?state=ended"
    view = server.ok("GET", f"/v1/tasks/{tid}")
    assert view["state"] == "ended"
    assert view["end"]["text"] == "cancelled by user:alice: from the dashboard", view["end"]
    assert form not in bob.page("/my-work")  # no button for an ended task
    # a "back" elsewhere is not followed
    a = alice.post(f"/my-work/{tid}/cancel", {"csrf": alice.csrf, "back": "https://evil.example/"})
    assert a.status == 303 and a.location == "/my-work"


def test_a_sessions_link_is_for_its_owner(server: Server, people: People, work: Work) -> None:
    """Issue 32: a link to a running session: its URL on its own origin, and for its owner
    the one-time link that lets the browser in (docs/channels.md)."""
    s = server.ok(
        "POST", "/v1/sessions", {"resource": "team-a/one", "app": "shell"}, people.bob, expect=201
    )
    sid, url = s["id"], s["url"]
    assert not url.startswith(server.url)  # an origin of its own
    bob = signed_in(server, people.bob)
    page = bob.page("/my-work")
    assert f'data-session-url="{url}"' in page
    alice = signed_in(server, people.alice)  # the team's admin sees it, may not open it
    assert "(only bob may open it)" in alice.page("/my-work")
    a = alice.get(f"/my-work/{sid}/session")
    assert a.status == 403 and "only its owner may open it" in a.text
    assert signed_in(server, people.erin).get(f"/my-work/{sid}/session").status == 404
    a = bob.get(f"/my-work/{sid}/session")
    assert a.status == 303 and present(a.location).startswith(url + "?klique_ticket=")
    bob.post(f"/my-work/{sid}/cancel", {"csrf": bob.csrf})
    a = bob.get(f"/my-work/{sid}/session")
    assert a.status == 410 and "ended" in a.text
    # a plain task is no session
    a = bob.get(f"/my-work/{work.bob_task}/session")
    assert a.status == 404 and "is not a session" in a.text


# --------------------------------------------------------------------------- usage
MONEY = re.compile(r"^(< 0\.01|> -0\.01|-?\d{1,3}(,\d{3})*\.\d\d)( [A-Z]{3})?$")
"""One money format (klique_util.fmt.money): to the cent, thousands grouped, ``< 0.01`` for
a cost under half a cent."""


def test_costs_read_in_one_money_format(server: Server, people: People, work: Work) -> None:
    """Issue 32: cost rows read ``0.000267`` beside a total of ``0.00``."""
    fin = signed_in(server, people.finance)
    html = fin.page("/usage?from=2000-01-01&to=2100-01-01&by=user")
    cells = [
        (exact, htmllib.unescape(shown))
        for exact, shown in re.findall(
            r'<td class="num" data-cost="([^"]*)"><span data-money>([^<]*)</span></td>', html
        )
    ]
    assert cells, html[:2000]
    for exact, shown in cells:
        assert MONEY.match(shown), shown
        if Decimal(exact) != 0 and abs(Decimal(exact)) < Decimal("0.005"):
            assert shown.startswith("< 0.01"), (exact, shown)  # never "0.00" for a cost
    total = re.search(r'data-total-cost="([^"]*)"><span data-money>([^<]*)</span>', html)
    assert total is not None and MONEY.match(htmllib.unescape(total.group(2))), total
    exact = Decimal(total.group(1))
    assert exact == sum(Decimal(e) for e, _ in cells)  # the rows add up to the total
    # every cost the page shows, the estate's figures too
    for page in (html, fin.page("/usage"), signed_in(server, people.alice).page("/usage")):
        money = [htmllib.unescape(m) for m in re.findall(r"<span data-money>([^<]*)</span>", page)]
        assert money and all(MONEY.match(m) for m in money if m), money


def test_a_team_admins_usage_separates_the_estates_capacity_from_their_own_use(
    server: Server, people: People, work: Work
) -> None:
    """Issue 32: a team admin's Usage page mixed the estate's capacity and overhead with the
    team's own use without saying so."""
    alice = signed_in(server, people.alice)  # team-a's admin
    html = alice.page("/usage")
    own = html.split('data-estate-scope="own"', 1)[1]
    estate = html.split('data-estate-scope="team"', 1)[1].split('data-estate-scope="own"', 1)[0]
    assert "shared by every group" in estate and "data-estate-capacity" in estate
    assert "Your GPU-hours" not in estate and "Used GPU-hours" not in estate
    assert "Your groups' use of it" in own and "Your GPU-hours" in own
    assert "Capacity GPU-hours" not in own
    assert "Your groups' own use: team-a" in html
    # no estate-wide overhead beside a team's use: that is IT's and finance's figure
    assert "idle and unreserved <span data-money>" not in html and "(overhead)" not in html
    assert re.search(r"figures as of [\d-]+ [\d:]+ \(\d+s ago;", html), html
    # finance sees the whole estate's figures, labelled as such
    fin = signed_in(server, people.finance).page("/usage")
    assert 'data-estate-scope="estate"' in fin and 'data-estate-scope="own"' not in fin
    assert "Use by everyone" in fin and "(overhead)" in fin
