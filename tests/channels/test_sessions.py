"""Sessions for real (issue 14, item 4): a ``kliqued serve`` and a real ``klique-worker``;
the session's app (a real JupyterLab, and a small aiohttp app, tests/channels/session_app.py,
that shows what the relay passes on) listens on the worker's 127.0.0.1 only and is reached
through the control plane's URL by a test client, HTTP and WebSocket, over the tunnel the
worker opened. Another user's token is refused; an idle session is stopped for real and
frees its GPU at once."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any, Iterator

import aiohttp
import pytest
from yarl import URL

from tests.daemon.fleet import (
    ESTATE,
    PY,
    FleetServer,
    HttpWorker,
    real_workers,
    running_fleet,
    write_estate,
)
from tests.harness.daemon import ROOT
from tests.harness.wait import wait_for

APP = [PY, str(Path(__file__).with_name("session_app.py"))]
PROFILES = (
    ESTATE["profiles.yaml"].replace(
        "    policies: [team-a, team-b]\n",
        "    policies: [team-a, team-b]\n    idle: {wall: 8h, cpu: 30m}\n",
        1,
    )
    + """\
  - name: pair
    gpus: 2
    nodes: 2
    pools: [bare]
    policies: [team-a]
"""
)


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[FleetServer]:
    estate = write_estate(tmp_path / "estate", {**ESTATE, "profiles.yaml": PROFILES})
    # a worker TTL long enough for a worker restart to keep its tasks (the tasks' wrappers
    # stop orphans whose worker is away longer: workers/liveness.py)
    yield from running_fleet(tmp_path, users=("alice", "erin"), estate=estate, ttl="10s")


@pytest.fixture
def real(fs: FleetServer, tmp_path: Path) -> Iterator[Any]:
    yield from real_workers(fs, tmp_path)


def cli(fs: FleetServer, token: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "KLIQUE_URL": fs.url, "KLIQUE_TOKEN": token}
    env.pop("KLIQUE_CONFIG", None)
    return subprocess.run(
        [PY, "-m", "kliqued.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def start(fs: FleetServer, token: str, **kw: Any) -> dict:
    return fs.ok(
        "POST",
        "/v1/sessions",
        {"resource": "team-a/one", "app": "jupyter", "command": APP, **kw},
        token,
        expect=201,
    )


def session(fs: FleetServer, token: str, sid: str) -> dict:
    return fs.ok("GET", f"/v1/sessions/{sid}", token=token)


def fetch(method: str, url: str, token: str | None = None, **kw: Any) -> tuple[int, Any, Any]:
    """(status, body, headers) of one request made by a real HTTP client."""

    async def go() -> tuple[int, Any, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        headers.update(kw.pop("headers", {}))
        async with aiohttp.ClientSession(cookie_jar=kw.pop("jar", None)) as http:
            async with http.request(method, url, headers=headers, **kw) as resp:
                body = await resp.read()
                return resp.status, body, resp.headers

    return asyncio.run(go())


def reachable(fs: FleetServer, token: str, sid: str, url: str) -> dict:
    def up() -> Any:
        st, body, _ = fetch("GET", url, token)
        return st == 200 and body

    return json.loads(wait_for(up, 60, f"session {sid} to answer through its URL"))


def test_a_session_is_reached_through_the_control_plane_by_its_owner_only(
    fs: FleetServer, real: Any, tmp_path: Path
) -> None:
    w = real("w1")
    s = start(fs, fs.alice)  # type: ignore[attr-defined]
    sid, url = s["id"], s["url"]
    # served by the sessions' own listener (another origin), never the control plane's
    assert url.startswith("http://127.0.0.1:") and url.endswith(f"/sessions/{sid}/")
    assert URL(url).origin() != URL(fs.url).origin()
    assert s["idle"] == {"wall": "8h", "cpu": "30m"}  # the profile's limits
    task = fs.task(sid)
    assert task["labels"]["klique.channel"] == "session"
    assert task["channel"] == "session"  # issue 14, part 5: beside the user
    assert task["actor"] == "user:alice"
    # the app answers through the URL, with the owner's token; the token is not passed on
    page = reachable(fs, fs.alice, sid, url)  # type: ignore[attr-defined]
    assert page["hello"] == "from the session"
    assert page["path"] == f"/sessions/{sid}/"
    assert "Authorization" not in page["headers"]
    assert session(fs, fs.alice, sid)["state"] == "running"  # type: ignore[attr-defined]
    assert session(fs, fs.alice, sid)["connected"] is True  # type: ignore[attr-defined]
    # a body both ways
    st, body, _ = fetch("POST", url + "echo", fs.alice, data=b"\x00abc" * 1000)
    assert st == 200 and body == b"\x00abc" * 1000
    # a WebSocket through the tunnel

    async def ws() -> list[Any]:
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(
                url + "ws", headers={"Authorization": f"Bearer {fs.alice}"}
            ) as sock:  # type: ignore[attr-defined]
                await sock.send_str("ping")
                first = await sock.receive_str(timeout=10)
                await sock.send_bytes(b"abc")
                second = await sock.receive_bytes(timeout=10)
                return [first, second]

    assert asyncio.run(ws()) == ["echo: ping", b"cba"]
    # another user's token, an admin's, none, a forged one: refused, nothing of the app shown
    for token, status in (
        (fs.erin, 403),
        (fs.admin, 403),
        (None, 401),  # type: ignore[attr-defined]
        ("kq_forged", 401),
    ):
        st, body, _ = fetch("GET", url, token)
        assert st == status, (token, st, body)
        assert b"from the session" not in body
        assert b"error" in body
    st, body, _ = fetch("GET", url, fs.erin)  # type: ignore[attr-defined]
    assert b"the user who started it only" in body

    async def ws_as(token: str) -> int:
        async with aiohttp.ClientSession() as http:
            try:
                async with http.ws_connect(
                    url + "ws", headers={"Authorization": f"Bearer {token}"}
                ):
                    return 101
            except aiohttp.WSServerHandshakeError as exc:
                return exc.status

    assert asyncio.run(ws_as(fs.erin)) == 403  # type: ignore[attr-defined]
    # only the worker holding the session's lease may open its tunnel
    other_pool = fs.token({"worker": True, "pool": "other"})
    st, body = fs.call("GET", f"/v1/sessions/{sid}/tunnel?epoch=1", token=other_pool)
    assert st == 403, body
    # erin does not see it in the API either
    assert fs.call("GET", f"/v1/sessions/{sid}", token=fs.erin)[0] == 404  # type: ignore[attr-defined]
    # a browser: a one-time link sets a cookie bound to the session; the link is spent
    link = fs.ok("POST", f"/v1/sessions/{sid}/link", token=fs.alice)["url"]  # type: ignore[attr-defined]
    assert fs.call("POST", f"/v1/sessions/{sid}/link", token=fs.erin)[0] == 404  # type: ignore[attr-defined]

    async def browser() -> tuple[int, Any, int]:
        jar = aiohttp.CookieJar(unsafe=True)  # cookies of an IP address (127.0.0.1)
        # signed in to the dashboard too: its cookie (path /) goes to every path
        jar.update_cookies({"klique_session": "dashboard-sign-in"}, URL(fs.url))
        async with aiohttp.ClientSession(cookie_jar=jar) as http:
            async with http.get(link) as resp:  # follows the redirect, keeps the cookie
                page = await resp.json()
                final = str(resp.url)
            async with http.get(url) as resp2:  # the cookie alone; the app's cookie too
                page2 = await resp2.json()
            async with http.get(link, allow_redirects=False) as again:
                return resp.status, (page, final, page2), again.status

    status, (page, final, page2), again = asyncio.run(browser())
    assert status == 200 and page["hello"] == "from the session"
    assert final == url  # the ticket is gone from the address
    assert "klique" not in page["headers"].get("Cookie", "")
    # the app's own cookie went to the browser and comes back; ours (the session's, the
    # dashboard's) never reach the app
    assert page2["headers"].get("Cookie") == "_xsrf=app-cookie"
    assert again == 401
    # a worker restart keeps the session (its app runs on) and opens the tunnel again; so
    # does a kill -9 of the daemon (the worker connects to the new one)
    w.stop()
    assert fetch("GET", url, fs.alice)[0] == 503  # type: ignore[attr-defined]
    w.start()
    assert reachable(fs, fs.alice, sid, url)["hello"] == "from the session"  # type: ignore[attr-defined]
    fs.kill()
    fs.start()
    assert reachable(fs, fs.alice, sid, url)["hello"] == "from the session"  # type: ignore[attr-defined]
    # list and stop from the CLI
    out = cli(fs, fs.alice, "session", "list")  # type: ignore[attr-defined]
    assert out.returncode == 0, out.stderr
    assert sid in out.stdout and "running" in out.stdout and url in out.stdout
    out = cli(fs, fs.alice, "session", "stop", sid)  # type: ignore[attr-defined]
    assert out.returncode == 0, out.stderr
    wait_for(lambda: fs.task(sid)["state"] == "ended", 30, "the session to end")
    st, body, _ = fetch("GET", url, fs.alice)  # type: ignore[attr-defined]
    assert st == 410 and b"has ended" in body


def test_an_idle_session_is_stopped_and_frees_its_gpu_at_once(fs: FleetServer, real: Any) -> None:
    real("w1", gpus="0")
    s = start(fs, fs.alice, idle={"cpu": "2s"})  # type: ignore[attr-defined]
    sid = s["id"]
    assert s["idle"] == {"wall": "8h", "cpu": "2s"}  # lowered by the user
    reachable(fs, fs.alice, sid, s["url"])  # type: ignore[attr-defined]
    # the only GPU is the session's: another task waits behind it
    other = fs.submit(fs.erin, "team-b/one", [PY, "-c", "print('ran')"])  # type: ignore[attr-defined]
    assert fs.task(other)["state"] == "queued"
    ended = wait_for(
        lambda: (
            (t := session(fs, fs.alice, sid))["state"].startswith("stopped")  # type: ignore[attr-defined]
            and t
        ),
        60,
        "the idle session to stop",
    )
    assert ended["state"] == "stopped: idle (cpu 2s)"
    # its GPU went to the waiting task at once
    wait_for(
        lambda: fs.task(other)["state"] in ("placed", "running", "ended"),
        10,
        "the waiting task to get the freed GPU",
    )
    out = cli(fs, fs.alice, "session", "show", sid)  # type: ignore[attr-defined]
    assert out.returncode == 0 and "stopped: idle (cpu 2s)" in out.stdout, out


def test_a_session_may_lower_its_idle_limits_never_raise_them(fs: FleetServer) -> None:
    before = len(fs.ok("GET", "/v1/tasks")["tasks"])
    for idle, field, words in (
        ({"cpu": "1h"}, "idle.cpu", "more than the 30m"),
        ({"wall": "9h"}, "idle.wall", "more than the 8h"),
        ({"gpu": "soon"}, "idle.gpu", "soon"),
    ):
        st, body = fs.call(
            "POST",
            "/v1/sessions",
            {"resource": "team-a/one", "app": "shell", "idle": idle},
            fs.alice,
        )  # type: ignore[attr-defined]
        assert st == 422, body
        assert body["error"]["details"]["field"] == field
        assert words in body["error"]["message"]
    out = cli(
        fs,
        fs.alice,
        "session",
        "start",
        "--resource",
        "team-a/one",  # type: ignore[attr-defined]
        "--app",
        "shell",
        "--idle-cpu",
        "2h",
    )
    assert out.returncode == 1 and "idle.cpu: 2h is more than the 30m" in out.stderr, out
    # a kind the profile leaves open may be set
    out = cli(
        fs,
        fs.alice,
        "session",
        "start",
        "--resource",
        "team-a/one",  # type: ignore[attr-defined]
        "--app",
        "shell",
        "--idle-network",
        "10m",
    )
    assert out.returncode == 0, out.stderr
    assert "idle limits: wall 8h, cpu 30m, network 10m" in out.stdout
    sid = out.stdout.split()[0]
    assert f"/sessions/{sid}/ " in out.stdout and f"url: {fs.url}/sessions" not in out.stdout
    assert session(fs, fs.alice, sid)["app"] == "shell"  # type: ignore[attr-defined]
    # a resource the user may not use: refused, naming those they may
    st, body = fs.call("POST", "/v1/sessions", {"resource": "team-a/one", "app": "shell"}, fs.erin)  # type: ignore[attr-defined]
    assert st == 422 and "erin may submit to team-b/one" in body["error"]["message"]
    # a gang profile (several machines): a session runs on one
    st, body = fs.call(
        "POST", "/v1/sessions", {"resource": "team-a/pair", "app": "shell"}, fs.alice
    )  # type: ignore[attr-defined]
    assert st == 422 and "a session runs on one machine" in body["error"]["message"], body
    # a plain task may not claim to be a session
    st, body = fs.call(
        "POST",
        "/v1/tasks",
        {"resource": "team-a/one", "command": ["true"], "labels": {"klique.channel": "session"}},
        fs.alice,
    )  # type: ignore[attr-defined]
    assert st == 422 and body["error"]["details"]["field"] == "labels.klique.channel"
    assert len(fs.ok("GET", "/v1/tasks")["tasks"]) == before + 1


def _jupyter() -> str | None:
    """The directory of a `jupyter` with JupyterLab: beside this Python (the test extra), or
    on PATH."""
    here = Path(PY).parent / "jupyter"
    found = str(here) if here.exists() else shutil.which("jupyter")
    if found is None:
        return None
    ok = subprocess.run([found, "lab", "--version"], capture_output=True, timeout=60)
    return str(Path(found).parent) if ok.returncode == 0 else None


def test_a_real_jupyterlab_session_runs_code_through_the_control_plane(
    fs: FleetServer, real: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The app's own command (``--app jupyter``: kliqued/daemon/api/sessions.py APPS) on the
    worker, JupyterLab's page and REST API through the URL, and a kernel run over its
    WebSocket, through the tunnel."""
    where = _jupyter()
    if where is None:
        pytest.skip("JupyterLab is not installed (pip install -e '.[test]' installs it)")
    monkeypatch.setenv("PATH", f"{where}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(fs.tmp / "jupyter-runtime"))  # type: ignore[attr-defined]
    real("w1")
    s = fs.ok(
        "POST", "/v1/sessions", {"resource": "team-a/one", "app": "jupyter"}, fs.alice, expect=201
    )  # type: ignore[attr-defined]
    sid, url = s["id"], s["url"]
    token = fs.alice  # type: ignore[attr-defined]
    status = json.loads(
        wait_for(
            lambda: (r := fetch("GET", url + "api/status", token))[0] == 200 and r[1],
            120,
            "JupyterLab to answer through the session's URL",
        )
    )
    assert "started" in status
    st, page, _ = fetch("GET", url + "lab", token)
    assert st == 200 and b"JupyterLab" in page
    assert fetch("GET", url + "api/status", fs.erin)[0] == 403  # type: ignore[attr-defined]

    async def run_code() -> str:
        auth = {"Authorization": f"Bearer {token}"}
        jar = aiohttp.CookieJar(unsafe=True)
        async with aiohttp.ClientSession(cookie_jar=jar) as http:
            # as JupyterLab's page does: its _xsrf cookie (relayed) echoed in a header
            async with http.get(url + "lab", headers=auth) as resp:
                assert resp.status == 200
            xsrf = {c.key: c.value for c in jar}["_xsrf"]
            async with http.post(
                url + "api/kernels", json={"name": "python3"}, headers={**auth, "X-XSRFToken": xsrf}
            ) as resp:
                assert resp.status == 201, await resp.text()
                kernel = (await resp.json())["id"]
            async with http.ws_connect(f"{url}api/kernels/{kernel}/channels", headers=auth) as sock:
                msg_id = uuid.uuid4().hex
                await sock.send_json(
                    {
                        "header": {
                            "msg_id": msg_id,
                            "username": "test",
                            "session": msg_id,
                            "msg_type": "execute_request",
                            "version": "5.3",
                        },
                        "parent_header": {},
                        "metadata": {},
                        "channel": "shell",
                        "content": {"code": "print(6 * 7)", "silent": False},
                    }
                )
                while True:
                    msg = await sock.receive_json(timeout=60)
                    if (
                        msg.get("msg_type") == "stream"
                        and msg["parent_header"].get("msg_id") == msg_id
                    ):
                        return str(msg["content"]["text"])

    assert asyncio.run(run_code()).strip() == "42"
    out = cli(fs, fs.alice, "session", "stop", sid)  # type: ignore[attr-defined]
    assert out.returncode == 0, out.stderr
    wait_for(lambda: fs.task(sid)["state"] == "ended", 60, "the session to end")


def test_only_the_worker_holding_the_sessions_lease_opens_its_tunnel(fs: FleetServer) -> None:
    """The protocol spoken by hand (tests/daemon/fleet.py HttpWorker): the lease's holder
    with its epoch; another worker of the same pool (another key), an old or unknown epoch,
    or a task that is no session: refused before any WebSocket."""
    holder = HttpWorker(fs, fs.wt, "w-holder")  # type: ignore[attr-defined]
    holder.register()
    s = start(fs, fs.alice)  # type: ignore[attr-defined]
    leases = wait_for(lambda: holder.lease(wait=1), 30, "the session's lease")
    assert [(lease["task"], lease["epoch"]) for lease in leases] == [(s["id"], 1)]
    assert leases[0]["labels"]["klique.channel"] == "session"
    path = f"/v1/sessions/{s['id']}/tunnel"
    other = HttpWorker(fs, fs.wt, "w-other")  # type: ignore[attr-defined]
    other.register()
    st, body = other.call("GET", path + "?epoch=1")
    assert st == 403 and body["error"]["code"] == "not-lease-holder", body
    st, body = holder.call("GET", path + "?epoch=2")
    assert st == 409 and body["error"]["code"] == "stale-epoch", body
    st, body = holder.call("GET", path)
    assert st == 400 and "epoch is required" in body["error"]["message"], body
    # the holder itself: admitted (a plain GET is no WebSocket upgrade: 400, not a tunnel)
    st, body = holder.call("GET", path + "?epoch=1")
    assert st == 400 and body["error"]["code"] != "stale-epoch", body
    plain = fs.submit(fs.alice, "team-a/one", ["true"])  # type: ignore[attr-defined]
    st, body = holder.call("GET", f"/v1/sessions/{plain}/tunnel?epoch=1")
    assert st in (409, 403), body
