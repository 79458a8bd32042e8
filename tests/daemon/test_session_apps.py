"""A session goes only to a worker that can start its app (issue 32): workers say at
registration which session apps they can start (the apps whose program their tasks find on
their PATH); a session of an app no known worker of the resource's pools has is refused at
once, naming how to enable it; one whose app only a worker now gone had waits, placed, with
that reason, and no worker without the app is leased it (it would fail with exit code 127).
On a real daemon (in process) with workers speaking the protocol by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.daemon.fleet import ESTATE, HttpWorker, write_estate
from tests.harness.inproc import InProcServer
from tests.harness.wait import wait_for


def register(
    s: InProcServer, token: str, wid: str, apps: list[str] | None, w: HttpWorker | None = None
) -> HttpWorker:
    """``w``: the same worker again (its key)."""
    w = w or HttpWorker(s, token, wid)
    body: dict[str, Any] = {
        "worker_id": wid,
        "hostname": wid,
        "pool": "bare",
        "executor": "process",
        "version": "test",
        "gpus": [{"index": i, "uuid": f"g-{i}", "memory_mb": None} for i in range(2)],
    }
    if apps is not None:
        body["apps"] = apps
    st, answer = w.call("POST", "/v1/workers/register", body)
    assert st == 200, answer
    return w


def start(s: InProcServer, app: str) -> tuple[int, Any]:
    body = {"resource": "team-a/one", "app": app}
    return s.call("POST", "/v1/sessions", body, s.token("alice"))


def server(tmp: Path) -> InProcServer:
    estate = write_estate(tmp / "estate", ESTATE)
    return InProcServer(tmp, estate=estate, workers=True, extra=["--worker-ttl", "5s"]).start()


def test_a_session_no_worker_of_its_pools_can_start_is_refused_at_once(tmp_path: Path) -> None:
    s = server(tmp_path)
    try:
        wt = s.token({"worker": True, "pool": "bare"})
        register(s, wt, "w-1", ["shell"])
        st, body = start(s, "jupyter")
        assert st == 422, body
        err = body["error"]
        assert err["code"] == "app-unavailable" and err["details"]["field"] == "app"
        assert "no worker of bare" in err["message"]
        assert "pip install jupyterlab" in err["message"]
        workers = s.ok("GET", "/v1/workers")["workers"]
        assert [(w["id"], w["apps"]) for w in workers] == [("w-1", ["shell"])]
        # an app it has goes to it; so does a session of one's own command (-- CMD...)
        st, body = start(s, "shell")
        assert st == 201, body
        own = {"resource": "team-a/one", "app": "jupyter", "command": ["my-server"]}
        st, body = s.call("POST", "/v1/sessions", own, s.token("alice"))
        assert st == 201, body
    finally:
        assert s.stop() == 0, s.log()


def test_a_worker_that_does_not_say_is_sent_any_session(tmp_path: Path) -> None:
    s = server(tmp_path)
    try:
        wt = s.token({"worker": True, "pool": "bare"})
        w = register(s, wt, "w-old", None)  # a worker older than the field
        st, body = start(s, "jupyter")
        assert st == 201, body
        tid = body["id"]
        wait_for(lambda: [x["task"] for x in w.lease()] == [tid], 10, "the session leased")
    finally:
        assert s.stop() == 0, s.log()


def test_a_session_waits_for_a_worker_with_its_app_and_says_so(tmp_path: Path) -> None:
    s = server(tmp_path)
    try:
        wt = s.token({"worker": True, "pool": "bare"})
        gone = register(s, wt, "w-jupyter", ["jupyter", "shell"])
        s.step(10)  # w-jupyter falls silent: lost
        wait_for(
            lambda: s.ok("GET", "/v1/workers")["workers"][0]["state"] == "lost",
            15,
            "w-jupyter declared lost",
        )
        shell_only = register(s, wt, "w-shell", ["shell"])
        st, body = start(s, "jupyter")  # a worker of the pool had it: accepted, it waits
        assert st == 201, body
        tid = body["id"]

        def reason() -> Any:
            t = s.ok("GET", f"/v1/tasks/{tid}")
            r = t.get("waiting_reason") or {}
            return t["state"] == "placed" and r.get("text")

        wait_for(reason, 15, "the session placed")
        assert shell_only.lease() == []  # never leased to a worker without Jupyter
        text = reason()
        assert text == (
            "placed on bare, not started: no live worker of bare can start jupyter (their "
            "apps: w-shell: shell); install JupyterLab where the worker finds it (pip install "
            "jupyterlab, in the worker's environment or on its PATH), then restart the worker"
        ), text
        back = register(s, wt, "w-jupyter", ["jupyter", "shell"], gone)  # it comes back
        wait_for(lambda: [x["task"] for x in back.lease()] == [tid], 10, "leased to w-jupyter")
    finally:
        assert s.stop() == 0, s.log()
