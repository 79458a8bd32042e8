"""A schedule or a pipeline must not outlive the token that made it (issue 25, item 3:
carol's every-minute schedule kept submitting as ``user:carol`` after her token was
revoked). Over real HTTP against a real ``kliqued serve`` (and a real ``klique-worker`` for
the pipeline): a revocation pauses what ran on the token in its own commit, with the reason
in the API and the CLI; the revoked token, another user, a group admin and the platform
admin cannot resume it; its owner resumes it with a live token, and it runs on that one; a
pipeline in flight lets its running step finish and sends no further step until resumed;
a restart (replay) shows the same."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.daemon.fleet import PY, FleetServer, real_workers, running_fleet
from tests.harness.daemon import ROOT
from tests.harness.wait import wait_for


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[FleetServer]:
    yield from running_fleet(tmp_path, users=("alice", "erin", "walter"))


@pytest.fixture
def real(fs: FleetServer, tmp_path: Path) -> Iterator[Any]:
    yield from real_workers(fs, tmp_path)


def new_token(fs: FleetServer, user: str) -> tuple[str, str]:
    """(id, secret) of a new token of ``user``'s."""
    t = fs.ok("POST", "/v1/tokens", {"user": user}, expect=201)
    return t["id"], t["token"]


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


def test_a_revoked_token_pauses_its_schedule_and_only_its_owner_resumes_it(fs: FleetServer) -> None:
    tid, secret = new_token(fs, "alice")
    s = fs.ok(
        "POST",
        "/v1/schedules",
        {"cron": "* * * * *", "resource": "team-a/one", "command": ["true"]},
        token=secret,
        expect=201,
    )
    sid = s["id"]
    assert s["state"] == "active"
    fs.ok("DELETE", f"/v1/tokens/{tid}", expect=204)
    # paused in the revocation's own commit: no wait for the next minute
    s = fs.ok("GET", f"/v1/schedules/{sid}", token=fs.alice)
    assert s["state"] == "paused" and s["next_runs"] == [], s
    assert s["token"] == tid  # the id of the token that made it, never the secret
    assert s["reason"].startswith(f"paused: token {tid} was revoked on "), s["reason"]
    r = cli(fs, fs.alice, "schedule", "show", sid)
    assert r.returncode == 0 and f"paused (paused: token {tid} was revoked on" in r.stdout
    # the attacks: the dead token itself, a user of another group (it does not exist to
    # them), the department's admin and the platform admin (not on alice's dead token)
    status, body = fs.call("POST", f"/v1/schedules/{sid}/resume", token=secret)
    assert status == 401 and "was revoked" in body["error"]["message"]
    status, _ = fs.call("POST", f"/v1/schedules/{sid}/resume", token=fs.erin)
    assert status == 404
    for who in (fs.walter, "admin"):
        status, body = fs.call("POST", f"/v1/schedules/{sid}/resume", token=who)
        assert status == 409, body
        assert "only alice may resume it, with a live token of theirs" in body["error"]["message"]
    assert fs.ok("GET", f"/v1/schedules/{sid}", token=fs.alice)["state"] == "paused"
    assert not [
        t
        for t in fs.ok("GET", "/v1/tasks?user=alice", token=fs.alice)["tasks"]
        if t["labels"].get("klique.schedule") == sid
    ]
    # a restart replays the pause as it was
    assert fs.stop() == 0
    fs.start()
    again = fs.ok("GET", f"/v1/schedules/{sid}", token=fs.alice)
    assert (again["state"], again["reason"], again["token"]) == ("paused", s["reason"], tid)
    # alice resumes it with a live token: it runs on that token from now on
    (live,) = [
        t["id"]
        for t in fs.ok("GET", "/v1/tokens")["tokens"]
        if t["principal"] == "user:alice" and t["id"] != tid
    ]  # fs.alice's
    r = cli(fs, fs.alice, "schedule", "resume", sid)
    assert r.returncode == 0, r.stderr
    s = fs.ok("GET", f"/v1/schedules/{sid}", token=fs.alice)
    assert (s["state"], s["reason"], s["token"]) == ("active", None, live)
    assert s["next_runs"]


def test_a_pipeline_in_flight_finishes_its_step_and_sends_no_further_one_until_resumed(
    fs: FleetServer, real: Any, tmp_path: Path
) -> None:
    real("w1")
    go = tmp_path / "go"
    first = json.dumps(
        [PY, "-c", f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.1)"]
    )
    text = f"""\
pipeline: two
steps:
  - name: first
    resource: team-a/one
    command: {first}
  - name: second
    resource: team-a/one
    needs: [first]
    command: [{json.dumps(PY)}, -c, "print('two')"]
"""
    tid, secret = new_token(fs, "alice")
    pid = fs.ok("POST", "/v1/pipelines", {"text": text}, token=secret, expect=201)["id"]

    def view() -> dict:
        return fs.ok("GET", f"/v1/pipelines/{pid}", token=fs.alice)

    step = wait_for(lambda: view()["steps"][0]["task"], 30, "the first step's task")
    wait_for(lambda: fs.task(step)["state"] == "running", 30, "the first step to run")
    fs.ok("DELETE", f"/v1/tokens/{tid}", expect=204)
    p = view()
    assert p["state"] == "paused", p
    assert p["token"] == tid
    assert p["text"].startswith(f"paused: token {tid} was revoked on "), p["text"]
    assert "no further step is sent until alice resumes it" in p["text"]
    go.touch()  # the step already sent runs to its end...
    wait_for(lambda: fs.task(step)["state"] == "ended", 30, "the first step to end")
    assert fs.task(step)["end_reason"] == "finished"
    time.sleep(1.5)  # ...and several looks of the loop send nothing after it
    p = view()
    assert p["state"] == "paused" and p["steps"][1]["tasks"] == []
    for who in (fs.walter, "admin"):
        status, body = fs.call("POST", f"/v1/pipelines/{pid}/resume", token=who)
        assert status == 409 and "only alice may resume it" in body["error"]["message"], body
    assert fs.call("POST", f"/v1/pipelines/{pid}/resume", token=fs.erin)[0] == 404
    assert fs.stop() == 0  # a restart replays the pause
    fs.start()
    assert view()["state"] == "paused" and view()["steps"][1]["tasks"] == []
    r = cli(fs, fs.alice, "pipeline", "resume", pid)
    assert r.returncode == 0, r.stderr
    done = wait_for(lambda: (v := view())["state"] != "running" and v, 60, "the pipeline")
    assert done["state"] == "succeeded", done
    assert done["token"] != tid and len(done["steps"][1]["tasks"]) == 1
    kinds = [e["data"]["state"] for e in fs.events(kind="pipeline_changed")]
    assert kinds == ["paused", "running"]
