"""Schedules for real: a ``kliqued serve`` process, a real ``klique-worker``, the daemon's
clock moved by a restart (``KLIQUED_TEST_CLOCK_OFFSET_MS``: the daemon "was down" over due
times without the test waiting for them), and a real kill -9 of the daemon just after a run:
the run is never made twice. The CLI's refusals name the problem and create nothing."""

from __future__ import annotations

import json
import os
import subprocess
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator

import pytest

from kliqued.daemon.server import CLOCK_OFFSET_ENV
from tests.daemon.fleet import PY, FleetServer, real_workers, running_fleet
from tests.harness.daemon import ROOT
from tests.harness.wait import wait_for


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[FleetServer]:
    yield from running_fleet(tmp_path, users=("alice", "erin", "walter"))


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


def next_3am(now: datetime) -> datetime:
    t = now.replace(hour=3, minute=0, second=0, microsecond=0)
    return t if t > now else t + timedelta(days=1)


def restart_at(
    fs: FleetServer, monkeypatch: pytest.MonkeyPatch, offset_ms: int, kill: bool = False
) -> None:
    if kill:
        fs.kill()  # SIGKILL: no clean stop, no checkpoint
    else:
        assert fs.stop() == 0
    monkeypatch.setenv(CLOCK_OFFSET_ENV, str(offset_ms))
    fs.start()


def runs(fs: FleetServer, sid: str) -> list[dict]:
    return fs.ok("GET", f"/v1/schedules/{sid}", token=fs.alice)["last_runs"]


def test_a_missed_run_runs_once_and_a_kill_9_never_runs_it_twice(
    fs: FleetServer, real: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real("w1")
    out = tmp_path / "nightly.out"
    cmd = [PY, "-c", f"open({str(out)!r}, 'a').write('ran' + chr(10))"]
    once = fs.ok(
        "POST",
        "/v1/schedules",
        {"cron": "0 3 * * *", "resource": "team-a/one", "command": cmd, "name": "nightly"},
        token=fs.alice,
        expect=201,
    )
    skip = fs.ok(
        "POST",
        "/v1/schedules",
        {"cron": "0 3 * * *", "resource": "team-a/one", "command": cmd, "missed": "skip"},
        token=fs.alice,
        expect=201,
    )
    late = fs.ok(
        "POST",
        "/v1/schedules",
        {"cron": "0 3 * * *", "resource": "team-a/one", "command": cmd, "deadline": "5m"},
        token=fs.alice,
        expect=201,
    )
    now = datetime.now(timezone.utc)
    first = next_3am(now)
    assert once["next_runs"][0] == first.strftime("%Y-%m-%dT%H:%M:%SZ")
    # The daemon is down over three nights and comes back 10 minutes after the third 03:00.
    back = first + timedelta(days=2, minutes=10)
    offset = int((back - now).total_seconds() * 1000)
    restart_at(fs, monkeypatch, offset)
    r = wait_for(lambda: runs(fs, once["id"]), 20, "the missed run")
    assert len(r) == 1
    assert (r[0]["due"], r[0]["outcome"], r[0]["missed"]) == (
        (first + timedelta(days=2)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "submitted",
        2,
    )
    fs.kill()  # kill -9 right after the run was recorded
    monkeypatch.setenv(CLOCK_OFFSET_ENV, str(offset))
    fs.start()
    time.sleep(1.5)  # several looks of the loop
    assert len(runs(fs, once["id"])) == 1
    tid = r[0]["task"]
    assert wait_for(lambda: fs.task(tid)["state"] == "ended", 30, "the run's task")
    assert fs.task(tid)["end_reason"] == "finished"
    mine = [
        t
        for t in fs.ok("GET", "/v1/tasks?user=alice", token=fs.alice)["tasks"]
        if t["labels"].get("klique.schedule") == once["id"]
    ]
    assert [t["id"] for t in mine] == [tid]
    assert out.read_text() == "ran\n"
    # the run is in the log before the submission it makes (one commit)
    kinds = [e["kind"] for e in fs.events(task=tid)]
    assert kinds[:2] == ["schedule_run", "submitted"], kinds
    # skip: 10 minutes late is not on time; run-once past its 5-minute deadline: neither runs
    (s,) = runs(fs, skip["id"])
    assert (s["outcome"], s["missed"], s["task"]) == ("missed", 3, None)
    (lt,) = runs(fs, late["id"])
    assert (lt["outcome"], lt["missed"], lt["task"]) == ("missed", 3, None)
    events = fs.events(kind="schedule_run")
    assert sum(e["data"]["outcome"] == "submitted" for e in events) == 1


def test_the_cli_refuses_what_cannot_run_and_creates_nothing(fs: FleetServer) -> None:
    r = cli(
        fs,
        fs.alice,
        "schedule",
        "create",
        "--cron",
        "0 0 30 2 *",
        "--resource",
        "team-a/one",
        "--",
        "echo",
        "hi",
    )
    assert r.returncode == 1
    assert "would never fire" in r.stderr and "cron '0 0 30 2 *'" in r.stderr, r.stderr
    r = cli(
        fs,
        fs.alice,
        "schedule",
        "create",
        "--cron",
        "0 2 * * *",
        "--resource",
        "team-b/one",
        "--",
        "echo",
        "hi",
    )
    assert r.returncode == 1
    assert (
        "user 'alice' is not in the users of group 'team-b'; alice may submit to "
        "team-a/elsewhere, team-a/one"
    ) in r.stderr, r.stderr
    r = cli(
        fs,
        fs.alice,
        "schedule",
        "create",
        "--cron",
        "0 2 * * *",
        "--timezone",
        "Mars/Base",
        "--resource",
        "team-a/one",
        "--",
        "echo",
    )
    assert r.returncode == 1 and "unknown time zone 'Mars/Base'" in r.stderr
    assert fs.ok("GET", "/v1/schedules", token=fs.alice)["schedules"] == []
    r = cli(
        fs,
        fs.alice,
        "schedule",
        "create",
        "--cron",
        "0 2 * * *",
        "--timezone",
        "Europe/Paris",
        "--concurrency",
        "forbid",
        "--resource",
        "team-a/one",
        "--json",
        "--",
        "python",
        "train.py",
        "--epochs",
        "3",
    )
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["command"] == ["python", "train.py", "--epochs", "3"]
    assert (s["owner"], s["timezone"], s["concurrency"]) == ("alice", "Europe/Paris", "forbid")
    r = cli(fs, fs.alice, "schedule", "show", s["id"])
    assert r.returncode == 0 and "next runs:" in r.stdout, r.stdout
    r = cli(fs, fs.alice, "schedule", "list")
    assert r.returncode == 0 and s["id"] in r.stdout and "0 2 * * * Europe/Paris" in r.stdout
    r = cli(fs, fs.alice, "schedule", "pause", s["id"])
    assert r.returncode == 0 and "paused" in r.stdout
    assert fs.ok("GET", f"/v1/schedules/{s['id']}", token=fs.alice)["next_runs"] == []
    r = cli(fs, fs.alice, "schedule", "resume", s["id"])
    assert r.returncode == 0 and "active" in r.stdout
    # who sees it: its owner, the admins of the owner's groups (walter: the department),
    # platform admins; to erin (another team) it does not exist
    assert fs.call("GET", f"/v1/schedules/{s['id']}", token=fs.erin)[0] == 404
    assert fs.call("POST", f"/v1/schedules/{s['id']}/pause", token=fs.erin)[0] == 404
    assert fs.ok("GET", "/v1/schedules", token=fs.erin)["schedules"] == []
    assert fs.ok("GET", f"/v1/schedules/{s['id']}", token=fs.walter)["owner"] == "alice"
    st, body = fs.call(
        "POST", "/v1/schedules", {"cron": "0 2 * * *", "resource": "team-a/one", "command": ["x"]}
    )
    assert st == 403  # a schedule runs as the user who made it: an admin is none
    r = cli(fs, fs.alice, "schedule", "delete", s["id"])
    assert r.returncode == 0
    assert fs.call("GET", f"/v1/schedules/{s['id']}", token=fs.alice)[0] == 404
    assert fs.ok("GET", "/v1/tasks")["tasks"] == []  # nothing was ever submitted


BAD_SCHEDULES = [
    ({"cron": "0 2 * * *"}, 422, "either a `command` on a `resource` or a `pipeline`"),
    ({"cron": "0 2 * * *", "command": ["x"]}, 422, "resource: a command needs"),
    ({"cron": "0 2 * * * *", "resource": "team-a/one", "command": ["x"]}, 422, "expected 5 fields"),
    (
        {"cron": "0 2 * * *", "resource": "team-a/one", "command": ["x"], "deadline": "soon"},
        422,
        "deadline:",
    ),
    (
        {
            "cron": "0 2 * * *",
            "resource": "team-a/one",
            "command": ["x"],
            "missed": "skip",
            "deadline": "1h",
        },
        422,
        "a deadline is for missed: run-once",
    ),
    (
        {"cron": "0 2 * * *", "resource": "team-a/one", "command": ["x"], "gpus": 2},
        422,
        "fixed size",
    ),
    (
        {"cron": "0 2 * * *", "resource": "nope/none", "command": ["x"]},
        422,
        "unknown compute resource",
    ),
    (
        {
            "cron": "0 2 * * *",
            "resource": "team-a/one",
            "command": ["x"],
            "concurrency": "sometimes",
        },
        400,
        "/concurrency",
    ),
    (
        {"cron": "0 2 * * *", "pipeline": {"text": "- just\n- a list\n"}},
        422,
        "a pipeline is a mapping",
    ),
    (
        {"cron": "0 2 * * *", "pipeline": {"text": "pipeline: x\nsteps: []\n"}},
        422,
        "steps: List should have at least 1 item",
    ),
    (
        {
            "cron": "0 2 * * *",
            "resource": "team-a/one",
            "pipeline": {
                "text": "pipeline: x\nsteps:\n  - {name: a, resource: team-a/one, command: [x]}\n"
            },
        },
        422,
        "a pipeline's steps name their compute resources",
    ),
]


def test_bad_schedules_and_pipelines_get_a_clear_error_never_a_5xx(fs: FleetServer) -> None:
    for body, status, words in BAD_SCHEDULES:
        st, answer = fs.call("POST", "/v1/schedules", body, token=fs.alice)
        assert st == status and words in answer["error"]["message"], (body, st, answer)
    for text, words in (
        ("pipeline: x\nsteps:\n  - name: A!\n", "steps.0.name"),
        ("pipeline: [\n", "malformed YAML"),
        (
            "pipeline: x\nsteps:\n  - {name: a, resource: team-a/one, "
            "command: [x], gpus: 0.0001}\n",
            "steps.0.gpus",
        ),
    ):
        st, answer = fs.call("POST", "/v1/pipelines", {"text": text}, token=fs.alice)
        assert st == 422 and words in answer["error"]["message"], (text, st, answer)
    assert fs.call("GET", "/v1/schedules/s-nope", token=fs.alice)[0] == 404
    assert fs.call("POST", "/v1/pipelines/p-nope/cancel", token=fs.alice)[0] == 404
    assert fs.ok("GET", "/v1/schedules")["schedules"] == []
    assert fs.ok("GET", "/v1/pipelines")["pipelines"] == []
    assert "Traceback" not in fs.log()


def test_the_sdk_makes_lists_and_changes_schedules_and_pipelines(
    fs: FleetServer, tmp_path: Path
) -> None:
    from kliqued.sdk import Client, KliqueError

    k = Client(fs.url, fs.alice)
    path = tmp_path / "nightly.yaml"
    path.write_text(
        "pipeline: nightly\nparams:\n  day: null\nsteps:\n  - name: a\n"
        "    resource: team-a/one\n    command: [echo, '${params.day}']\n"
    )
    s = k.create_schedule(
        "15 4 * * 1",
        pipeline=path,
        params={"day": "monday"},
        timezone="Europe/Paris",
        concurrency="replace",
        deadline="2h",
    )
    assert s["pipeline"] == {"file": "nightly.yaml", "name": "nightly", "params": {"day": "monday"}}
    assert (s["concurrency"], s["missed"], s["deadline_s"]) == ("replace", "run-once", 7200)
    assert len(s["next_runs"]) == 5
    with pytest.raises(KliqueError) as exc:  # a required parameter not given
        k.create_schedule("15 4 * * 1", pipeline=path)
    assert exc.value.status == 422 and "parameter day has no default" in exc.value.message
    assert [x["id"] for x in k.schedules()] == [s["id"]]
    assert k.pause_schedule(s["id"])["state"] == "paused"
    assert k.pause_schedule(s["id"])["state"] == "paused"  # idempotent
    assert k.resume_schedule(s["id"])["state"] == "active"
    k.delete_schedule(s["id"])
    assert k.schedules() == []
    p = k.run_pipeline(path, {"day": "tuesday"})
    assert p["params"] == {"day": "tuesday"} and p["owner"] == "alice"
    assert [x["id"] for x in k.pipelines()] == [p["id"]]
    wait_for(lambda: k.pipeline(p["id"])["steps"][0]["task"], 10, "the first step's task")
    assert k.cancel_pipeline(p["id"])["state"] == "cancelled"
    assert k.cancel_pipeline(p["id"])["state"] == "cancelled"  # idempotent
    t = fs.task(k.pipeline(p["id"])["steps"][0]["task"])
    assert t["command"] == ["echo", "tuesday"] and t["state"] == "ended"
