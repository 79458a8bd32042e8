"""Pipelines for real: a ``kliqued serve`` with a real ``klique-worker`` running the steps'
processes. Values pass from a step to later ones through $KLIQUE_OUTPUTS; a failed step is
retried; fail-fast cancels what runs; a restart of the daemon mid-pipeline carries on; a
step on a compute resource the user may not use refuses the whole run."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.daemon.fleet import PY, FleetServer, real_workers, running_fleet
from tests.harness.daemon import ROOT
from tests.harness.wait import wait_for


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[FleetServer]:
    yield from running_fleet(tmp_path, users=("alice", "erin"))


@pytest.fixture
def real(fs: FleetServer, tmp_path: Path) -> Iterator[Any]:
    yield from real_workers(fs, tmp_path)


def py(code: str, *args: str) -> str:
    """A YAML flow list for a Python one-liner (JSON is YAML)."""
    return json.dumps([PY, "-c", code, *args])


def write(tmp: Path, name: str, text: str) -> Path:
    path = tmp / name
    path.write_text(text)
    return path


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


def pipeline(fs: FleetServer, token: str, pid: str) -> dict:
    return fs.ok("GET", f"/v1/pipelines/{pid}", token=token)


def ended(fs: FleetServer, token: str, pid: str, timeout: float = 60) -> dict:
    return wait_for(
        lambda: (p := pipeline(fs, token, pid))["state"] != "running" and p,
        timeout,
        f"pipeline {pid} to end",
    )


def test_values_pass_between_steps_and_a_failed_step_is_retried(
    fs: FleetServer, real: Any, tmp_path: Path
) -> None:
    real("w1")
    out, marker = tmp_path / "result.txt", tmp_path / "flaky.once"
    make = py(
        "import os, sys; open(os.environ['KLIQUE_OUTPUTS'], 'w').write("
        "'GREETING=' + sys.argv[1] + '\\n# a comment\\nSIZE=42\\n')",
        "${params.word}",
    )
    flaky = py(
        f"import os, sys; p = {str(marker)!r}\n"
        "if not os.path.exists(p): open(p, 'w').close(); sys.exit(3)"
    )
    use = py(
        f"import sys; open({str(out)!r}, 'w').write(' '.join(sys.argv[1:]))",
        "${steps.make.outputs.GREETING}",
        "${steps.make.outputs.SIZE}",
    )
    text = f"""\
pipeline: etl
params:
  word: hello
steps:
  - name: make
    resource: team-a/one
    command: {make}
  - name: flaky
    resource: team-a/one
    needs: [make]
    retries: 2
    command: {flaky}
  - name: use
    resource: team-a/one
    needs: [flaky]
    command: {use}
"""
    path = write(tmp_path, "etl.yaml", text)
    r = cli(fs, fs.alice, "pipeline", "run", str(path), "--param", "word=hi", "--json")
    assert r.returncode == 0, r.stderr
    pid = json.loads(r.stdout)["id"]
    p = ended(fs, fs.alice, pid)
    assert p["state"] == "succeeded", p
    assert out.read_text() == "hi 42"
    steps = {s["name"]: s for s in p["steps"]}
    assert steps["make"]["outputs"] == {"GREETING": "hi", "SIZE": "42"}
    assert steps["flaky"]["attempts"] == 2
    assert [s["state"] for s in p["steps"]] == ["succeeded"] * 3
    # every step's task was sent as alice, through the pipeline channel
    for s in p["steps"]:
        for tid in s["tasks"]:
            t = fs.task(tid)
            assert (t["user"], t["actor"]) == ("alice", "user:alice")
            assert t["labels"]["klique.pipeline"] == pid
            assert t["labels"]["klique.channel"] == "pipeline"
            assert t["channel"] == "pipeline"  # issue 14, part 5: beside the user
    r = cli(fs, fs.alice, "pipeline", "status", pid)
    assert r.returncode == 0 and "succeeded" in r.stdout, r.stdout + r.stderr
    r = cli(fs, fs.alice, "pipeline", "status")
    assert r.returncode == 0 and pid in r.stdout and "etl" in r.stdout, r.stdout


def test_fail_fast_cancels_the_running_steps_and_continue_skips_only_dependents(
    fs: FleetServer, real: Any, tmp_path: Path
) -> None:
    real("w1")
    body = """\
steps:
  - name: long
    resource: team-a/one
    command: {long}
  - name: bad
    resource: team-a/one
    command: {bad}
  - name: after
    resource: team-a/one
    needs: [bad]
    command: {ok}
"""
    fmt = dict(
        long=py("import time; time.sleep(60)"), bad=py("import sys; sys.exit(3)"), ok=py("pass")
    )
    fast = fs.ok(
        "POST",
        "/v1/pipelines",
        {"file": "f.yaml", "text": "pipeline: fast\n" + body.format(**fmt)},
        token=fs.alice,
        expect=201,
    )
    p = ended(fs, fs.alice, fast["id"])
    steps = {s["name"]: s for s in p["steps"]}
    assert p["state"] == "failed" and p["text"].startswith(
        "step bad failed: failed: exit code 3"
    ), p
    assert steps["long"]["state"] == "cancelled" and steps["after"]["state"] == "cancelled"
    wait_for(
        lambda: fs.task(steps["long"]["task"])["state"] == "ended",
        20,
        "the long step's task to be cancelled",
    )
    assert fs.task(steps["long"]["task"])["end_reason"] == "cancelled"
    assert steps["after"]["task"] is None  # never submitted

    fmt["long"] = py("import time; time.sleep(1)")
    cont = fs.ok(
        "POST",
        "/v1/pipelines",
        {"file": "c.yaml", "text": "pipeline: cont\non_failure: continue\n" + body.format(**fmt)},
        token=fs.alice,
        expect=201,
    )
    p = ended(fs, fs.alice, cont["id"])
    steps = {s["name"]: s for s in p["steps"]}
    assert (steps["long"]["state"], steps["bad"]["state"], steps["after"]["state"]) == (
        "succeeded",
        "failed",
        "skipped",
    )
    assert steps["after"]["text"] == "skipped: needs bad, which failed"
    assert p["state"] == "failed"


def test_a_pipeline_survives_a_kill_9_of_the_daemon(
    fs: FleetServer, real: Any, tmp_path: Path
) -> None:
    real("w1")
    started, out = tmp_path / "first.started", tmp_path / "second.out"
    first = py(f"import time; open({str(started)!r}, 'w').close(); time.sleep(3)")
    second = py(f"open({str(out)!r}, 'a').write('ran' + chr(10))")
    text = f"""\
pipeline: long
steps:
  - name: first
    resource: team-a/one
    command: {first}
  - name: second
    resource: team-a/one
    needs: [first]
    command: {second}
"""
    pid = fs.ok(
        "POST", "/v1/pipelines", {"file": "long.yaml", "text": text}, token=fs.alice, expect=201
    )["id"]
    wait_for(started.exists, 30, "the first step to start")
    fs.kill()  # kill -9 while the first step runs
    fs.start()
    p = ended(fs, fs.alice, pid)
    assert p["state"] == "succeeded", p
    assert out.read_text() == "ran\n"  # once
    assert [s["attempts"] for s in p["steps"]] == [1, 1]
    kinds = [e["kind"] for e in fs.events(kind="pipeline_started")]
    assert kinds == ["pipeline_started"]


def test_cancel_stops_the_running_step(fs: FleetServer, real: Any, tmp_path: Path) -> None:
    real("w1")
    started = tmp_path / "s.started"
    slow = py(f"import time; open({str(started)!r}, 'w').close(); time.sleep(60)")
    text = f"""\
pipeline: c
steps:
  - name: slow
    resource: team-a/one
    command: {slow}
"""
    pid = fs.ok("POST", "/v1/pipelines", {"text": text}, token=fs.alice, expect=201)["id"]
    wait_for(started.exists, 30, "the step to start")
    r = cli(fs, fs.alice, "pipeline", "cancel", pid)
    assert r.returncode == 0, r.stderr
    p = pipeline(fs, fs.alice, pid)
    assert p["state"] == "cancelled" and p["text"] == "cancelled by user:alice"
    tid = p["steps"][0]["task"]
    wait_for(lambda: fs.task(tid)["state"] == "ended", 20, "the task to stop")


def test_bad_pipelines_are_refused_with_their_place_and_nothing_submitted(
    fs: FleetServer, tmp_path: Path
) -> None:
    denied = write(
        tmp_path,
        "denied.yaml",
        """\
pipeline: denied
steps:
  - name: ok
    resource: team-a/one
    command: [echo, ok]
  - name: theirs
    resource: team-b/one
    needs: [ok]
    command: [echo, no]
""",
    )
    r = cli(fs, fs.alice, "pipeline", "run", str(denied))
    assert r.returncode == 1
    assert (
        "kliqued: denied.yaml: step theirs: user 'alice' is not in the users of group "
        "'team-b'; alice may submit to team-a/elsewhere, team-a/one"
    ) in r.stderr
    cyc = write(
        tmp_path,
        "cycle.yaml",
        denied.read_text().replace(
            "    command: [echo, ok]", "    needs: [theirs]\n    command: [echo, ok]"
        ),
    )
    r = cli(fs, fs.alice, "pipeline", "run", str(cyc))
    assert (
        r.returncode == 1
        and (
            "kliqued: cycle.yaml:9:13: the steps form a cycle (A -> B: "
            "A needs B): theirs -> ok -> theirs"
        )
        in r.stderr
    ), r.stderr
    unknown = write(tmp_path, "unknown.yaml", denied.read_text().replace("[ok]", "[ko]"))
    r = cli(fs, fs.alice, "pipeline", "run", str(unknown))
    assert (
        r.returncode == 1
        and ("kliqued: unknown.yaml:8:13: step theirs needs unknown step ko") in r.stderr
    ), r.stderr
    assert fs.ok("GET", "/v1/pipelines", token=fs.alice)["pipelines"] == []
    assert fs.ok("GET", "/v1/tasks")["tasks"] == []
    # another user's pipeline does not exist for erin; the platform admin sees it
    ok = write(
        tmp_path,
        "ok.yaml",
        "pipeline: mine\nsteps:\n  - name: a\n    resource: team-a/one\n    command: [echo, ok]\n",
    )
    pid = fs.ok("POST", "/v1/pipelines", {"text": ok.read_text()}, token=fs.alice, expect=201)["id"]
    assert fs.call("GET", f"/v1/pipelines/{pid}", token=fs.erin)[0] == 404
    assert fs.call("POST", f"/v1/pipelines/{pid}/cancel", token=fs.erin)[0] == 404
    assert fs.ok("GET", f"/v1/pipelines/{pid}")["owner"] == "alice"
    st, body = fs.call("POST", "/v1/pipelines", {"text": ok.read_text()})
    assert st == 403  # an admin is no user: pipelines run as their user
