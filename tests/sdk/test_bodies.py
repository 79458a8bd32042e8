"""The SDK's request bodies are made by the API's models (kliqued/sdk/bodies.py, issue 27 item
3): every body it sends is valid against the request schema of the generated OpenAPI document,
checked by the daemon's own validator; an argument of the wrong shape is refused in the SDK,
before any request, with the SDK's error naming it (never a pydantic traceback).

The bodies are read off the wire: the client sends them over HTTP to a recorder on a free
loopback port, which keeps each request and answers ``{}``. No daemon is needed to read a
body (what a real daemon does with them: the rest of tests/sdk)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kliqued.daemon.api.openapi import document, validator
from kliqued.sdk import Client, KliqueError
from kliqued.sdk.login import _exchange

WORKER_PROTOCOL = {
    "registerWorker",
    "leaseTasks",
    "workerHeartbeat",
    "reportTask",
    "reportTasks",
    "uploadTaskLog",
}
"""The operations with a body the SDK does not send: a worker's (workers/client.py)."""


class Recorder:
    """An HTTP server that keeps every request (method, path, JSON body) and answers 200
    ``{}``."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, Any]] = []
        seen = self.seen

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                seen.append(("post", self.path, json.loads(raw) if raw else None))
                out = b"{}"
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    r = Recorder()
    r.thread.start()
    try:
        yield r
    finally:
        r.server.shutdown()
        r.server.server_close()
        r.thread.join(timeout=10)


def _operations() -> list[tuple[str, re.Pattern[str], str, str, bool]]:
    """Each operation with a JSON body: (method, path pattern, operation id, the body's
    schema, whether a body is required)."""
    out = []
    for path, ops in document()["paths"].items():
        pattern = re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", path) + "$")
        for method, op in ops.items():
            body = op.get("requestBody", {})
            content = body.get("content", {}).get("application/json")
            if content is not None:
                name = content["schema"]["$ref"].rsplit("/", 1)[1]
                out.append((method, pattern, op["operationId"], name, bool(body.get("required"))))
    return out


def _sent(recorder: Recorder, tmp_path: Path) -> None:
    """Every SDK call that sends a body, with every argument its body has, and with the
    fewest."""
    k = Client(recorder.url, "kq_test", retries=0)
    pipe = tmp_path / "nightly.yaml"
    pipe.write_text("steps:\n  - name: a\n    resource: team-a/one\n    command: [true]\n")
    k.submit("team-a/one", "python train.py --fast")
    k.submit(
        "team-a/one",
        ["python", "train.py"],
        payload={"rows": [1, None, "x"]},
        gpus=0.5,
        project="evals",
        labels={"run": "7"},
        idempotency_key="key-1",
        user="alice",
    )
    k.dry_run("team-a/one", ["true"])
    k.dry_run("team-a/one", "true", gpus=2, project="evals", labels={"a": "b"}, user="alice")
    k.cancel("t-1")
    k.cancel("t-1", reason="not needed")
    k.set_engine(False)
    k.create_schedule("0 2 * * *", "team-a/one", "python nightly.py")
    k.create_schedule(
        "0 2 * * *",
        "team-a/one",
        ["python", "nightly.py"],
        timezone="Europe/Paris",
        concurrency="forbid",
        missed="skip",
        deadline="2h",
        name="nightly",
        project="evals",
        gpus=1,
        labels={"k": "v"},
    )
    k.create_schedule("0 3 * * *", pipeline=pipe, params={"day": "mon"}, missed="run-once")
    k.start_session("team-a/one")
    k.start_session(
        "team-a/one",
        "shell",
        command=["python", "-m", "http.server"],
        project="evals",
        gpus=0.25,
        idle={"cpu": "15m", "wall": 3600},
    )
    k.run_pipeline(pipe)
    k.run_pipeline(pipe, {"day": "tue"})
    k.create_token("alice")
    k.create_token(worker=True, pool="burst", name="w", expires_in="90d")
    k.create_token(role="finance", expires_in="1h")
    k.rotate_token("tok-1")
    k.rotate_token("tok-1", grace="1h", expires_in="30d")
    k.ledger_sql("SELECT 1")
    k.ledger_sql("SELECT 1", limit=5)
    k.record_cloud_node("burst", "i-0abc", "ec2", "p4d.24xlarge", "spot", 8)
    k.autoscaler_heartbeat("burst", 10)
    k.report_scaling("burst", "capacity", "no p4d in eu-west-1", 3)
    k.report_scaling("burst", None)
    _exchange(recorder.url, "header.payload.signature", "admin", None)
    _exchange(recorder.url, "header.payload.signature", None, None)


def test_every_body_the_sdk_sends_is_valid_against_the_document(
    recorder: Recorder, tmp_path: Path
) -> None:
    _sent(recorder, tmp_path)
    operations = _operations()
    covered = set()
    for method, path, body in recorder.seen:
        op = [o for o in operations if o[0] == method and o[1].match(path)]
        assert len(op) == 1, (method, path)
        _, _, op_id, schema, required = op[0]
        covered.add(op_id)
        if body is None:
            assert not required, (op_id, "sent no body")
            continue
        errors = [e.message for e in validator(schema).iter_errors(body)]
        assert errors == [], (op_id, body, errors)
    every = {o[2] for o in operations}
    assert covered == every - WORKER_PROTOCOL, (every - WORKER_PROTOCOL) ^ covered


def test_a_body_carries_what_was_given_and_no_defaults(recorder: Recorder, tmp_path: Path) -> None:
    """The model's JSON, minus what the caller did not give: no ``null`` but a scaling
    report's cause, none of the model's defaults (the handlers apply theirs), a payload as
    given."""
    _sent(recorder, tmp_path)
    by_path = [(p, b) for _, p, b in recorder.seen]
    assert by_path[0] == (
        "/v1/tasks",
        {"resource": "team-a/one", "command": ["python", "train.py", "--fast"], "labels": {}},
    )
    assert by_path[1][1]["payload"] == {"rows": [1, None, "x"]} and by_path[1][1]["gpus"] == 0.5
    assert type(by_path[3][1]["gpus"]) is int  # as given: the daemon's fast check takes ints
    assert by_path[2][1] == {
        "resource": "team-a/one",
        "command": ["true"],
        "labels": {},
        "dry_run": True,
    }
    assert by_path[4] == ("/v1/tasks/t-1/cancel", None)
    assert ("/v1/ledger/sql", {"sql": "SELECT 1", "limit": 10000}) in by_path
    assert ("/v1/pools/burst/scaling", {"cause": None, "reason": None, "waiting": 0}) in by_path
    assert ("/v1/signin", {"id_token": "header.payload.signature"}) in by_path


@pytest.mark.parametrize(
    ("call", "place", "words"),
    [
        (lambda k: k.submit("team-a/one", ["x"], gpus=0.0005), "gpus", "multiple of 0.001"),
        (lambda k: k.submit("", ["x"]), "resource", "at least 1 character"),
        (lambda k: k.submit("team-a/one", ["x", 3]), "command[1]", "valid string"),
        (lambda k: k.submit("team-a/one", 'python "x'), "command", "close the quote"),
        (lambda k: k.dry_run("team-a/one", ["x"], labels={"k": 5}), "labels['k']", "string"),
        (lambda k: k.start_session("team-a/one", "emacs"), "app", "'jupyter', 'vscode'"),
        (
            lambda k: k.start_session("team-a/one", idle={"gpus": "1h"}),
            "idle['gpus']",
            "Extra inputs are not permitted",
        ),
        (
            lambda k: k.create_schedule("0 2 * * *", "team-a/one", "x", concurrency="often"),
            "concurrency",
            "'allow', 'forbid', 'replace'",
        ),
        (
            lambda k: k.create_schedule("0 2 * * *", "team-a/one", "x", deadline="x" * 40),
            "deadline",
            "at most 32 characters",
        ),
        (lambda k: k.create_token(), "user, worker=True (with pool) or role", "none was given"),
        (lambda k: k.create_token(worker=True), "pool", "Field required"),
        (lambda k: k.create_token(role="root"), "role", "'admin', 'finance' or 'planner'"),
        (lambda k: k.ledger_sql("SELECT 1", limit=0), "limit", "greater than or equal to 1"),
        (lambda k: k.report_scaling("burst", "money"), "cause", "'spend_cap'"),
        (
            lambda k: k.record_cloud_node("burst", "i-1", "ec2", "p4d", "reserved", 8),
            "lifecycle",
            "'spot' or 'on-demand'",
        ),
    ],
)
def test_a_wrong_argument_is_refused_before_any_request(
    recorder: Recorder, call: Any, place: str, words: str
) -> None:
    k = Client(recorder.url, "kq_test", retries=0)
    with pytest.raises(KliqueError) as err:
        call(k)
    e = err.value
    assert e.status is None and e.code == "invalid-request"
    assert f"{place}: " in e.message or f"{place};" in e.message, e.message
    assert words in e.message, e.message
    shown = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    assert shown is None, f"a traceback would show {shown!r}"
    assert recorder.seen == []


def test_a_pipeline_file_too_long_is_named_by_its_path(recorder: Recorder, tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("#" * 262145)
    k = Client(recorder.url, "kq_test", retries=0)
    for call in (lambda: k.run_pipeline(big), lambda: k.create_schedule("0 2 * * *", pipeline=big)):
        with pytest.raises(KliqueError) as err:
            call()
        assert f"the pipeline file {big}: String should have at most 262144" in err.value.message
    assert recorder.seen == []


def test_importing_the_sdk_loads_no_model() -> None:
    """The models (pydantic, ~0.2 s) load at the first call that sends a body: `import
    kliqued.sdk`, and every `kliqued` command that sends none, stay quick."""
    code = (
        "import sys, kliqued.sdk, kliqued.sdk.client\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pydantic'"
        " or m.startswith('kliqued.api_models')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"
