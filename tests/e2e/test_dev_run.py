"""``make run`` end to end: ``kliqued dev`` starts the daemon on the example estate and a
local worker for the bare-metal pool, prints ready-to-use tokens; a user's ``kliqued submit``
then really runs on the worker, ends, and its log, status and GPU-hours are read back; Ctrl-C
stops everything cleanly, and a second start reuses what the first made."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from kliqued.commands.dev import _listen
from tests.harness.daemon import ROOT, free_port
from tests.harness.typed import present
from tests.harness.wait import wait_for
from tests.web.browser import Browser

KLIQUED = [sys.executable, "-m", "kliqued.cli"]


def start(tmp: Path, port: int) -> tuple[subprocess.Popen, str]:
    out = tmp / f"dev-{time.monotonic_ns()}.out"
    proc = subprocess.Popen(
        [
            *KLIQUED,
            "dev",
            "--dir",
            str(tmp / "run"),
            "--listen",
            f"127.0.0.1:{port}",
            # the kernel's choice: port + 1 (the default) is an ephemeral port here, which
            # parallel tests' connections may hold (a CI run met it)
            "--sessions-listen",
            f"127.0.0.1:{free_port()}",
        ],
        cwd=ROOT,
        stdout=open(out, "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )

    def ready() -> bool:
        assert proc.poll() is None, out.read_text()
        return "Ctrl-C stops" in out.read_text()

    try:
        wait_for(ready, 60, "kliqued dev's banner")
    except AssertionError as exc:
        raise AssertionError(f"{exc}:\n{out.read_text()}") from None
    return proc, out.read_text()


def cli(env: dict, *args: str) -> str:
    p = subprocess.run(
        [*KLIQUED, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr + p.stdout
    return p.stdout


def test_make_run_runs_a_users_command_end_to_end(tmp_path) -> None:
    port = free_port()
    proc, banner = start(tmp_path, port)
    try:
        url = f"http://127.0.0.1:{port}"
        assert f"Klique is running at {url}" in banner
        files = dict(
            re.findall(
                r"# ([\w.@-]+) \([^)]*\)\n  export KLIQUE_URL=\S+ "
                r"KLIQUE_TOKEN=\$\(cat (\S+)\)",
                banner,
            )
        )
        assert set(files) >= {"alice", "heidi", "zoe"}
        exports = {u: Path(f).read_text().strip() for u, f in files.items()}
        admin = tmp_path / "run" / "tokens" / "admin.token"
        assert f"KLIQUE_TOKEN=$(cat {admin})" in banner
        assert oct(admin.stat().st_mode & 0o777) == "0o600"
        for token in (*exports.values(), admin.read_text().strip()):
            assert token not in banner  # no lasting token on the terminal
        # the dashboard's URL and a short-lived sign-in token (issue 13)
        assert f"Dashboard  {url}/  sign in as alice" in banner
        assert "Sessions (kliqued session start --app APP): the workers can start" in banner
        sign_in = present(re.search(r"sign-in token: (\S+)", banner)).group(1)
        b = Browser(url)
        assert b.post("/signin", {"token": sign_in}).location == "/orchestration"
        made = [
            t
            for t in json.loads(
                cli(
                    {**os.environ, "KLIQUE_URL": url, "KLIQUE_TOKEN": admin.read_text().strip()},
                    "token",
                    "list",
                    "--json",
                )
            )["tokens"]
            if t["name"] == "dashboard sign-in (kliqued dev)"
        ]
        assert len(made) == 1 and made[0]["principal"] == "user:alice" and made[0]["expires_at"]
        assert (tmp_path / "run" / "url").read_text().strip() == url
        assert (tmp_path / "run" / "tokens" / "heidi.token").read_text().strip() == exports["heidi"]
        env = {**os.environ, "KLIQUE_URL": url, "KLIQUE_TOKEN": exports["alice"]}
        out = cli(
            env,
            "submit",
            "--json",
            "--resource",
            "llm-research/l40s-1x",
            "-p",
            "evals",
            "--",
            "python",
            "-c",
            "import time; print('hello'); time.sleep(0.5)",
        )
        tid = json.loads(out)["id"]
        wait_for(
            lambda: json.loads(cli(env, "status", tid, "--json"))["state"] == "ended",
            30,
            "the task's end",
            every=0.2,
        )
        task = json.loads(cli(env, "status", tid, "--json"))
        assert (task["end_reason"], task["exit_code"], task["pool"]) == (
            "finished",
            0,
            "onprem-baremetal",
        )
        # one GPU, held while it ran (0.5 s at least: GPU-hours are shown to 4 decimals, and
        # the worker reports a task's end within milliseconds now)
        assert task["worker"] and task["gpu_hours"] > 0
        assert "state     ended (finished)" in cli(env, "status", tid)
        assert cli(env, "logs", tid) == "hello\n"
        fin = {**env, "KLIQUE_TOKEN": (tmp_path / "run/tokens/finance.token").read_text().strip()}
        rows = json.loads(
            cli(
                fin,
                "ledger",
                "sql",
                "--json",
                f"SELECT end_reason, gpu_hours FROM usage WHERE task = '{tid}'",
            )
        )
        assert rows["rows"][0][0] == "finished", rows
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(40) == 0
    log = (tmp_path / "run" / "kliqued.log").read_text()
    assert "stopped:" in log and "Traceback" not in log
    # tokens, the database, task and worker logs: private (issue 9, finding 14)
    loose = {
        str(p): oct(p.stat().st_mode & 0o777)
        for p in [tmp_path / "run", *(tmp_path / "run").rglob("*")]
        if p.stat().st_mode & 0o077
    }
    assert not loose, f"readable by others: {loose}"
    # A second start reuses the database, the tokens and the worker's state.
    proc, banner2 = start(tmp_path, port)
    try:
        assert f"KLIQUE_TOKEN=$(cat {files['heidi']})" in banner2
        assert (tmp_path / "run/tokens/heidi.token").read_text().strip() == exports["heidi"]
        env = {
            **os.environ,
            "KLIQUE_URL": f"http://127.0.0.1:{port}",
            "KLIQUE_TOKEN": exports["alice"],
        }
        assert json.loads(cli(env, "status", tid, "--json"))["end_reason"] == "finished"
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(40) == 0


def test_a_second_dev_on_the_same_dir_stops_without_touching_the_first(tmp_path) -> None:
    """Bug 13: it used to start a daemon that failed on the locked database and wrote its
    error into the running daemon's log."""
    port = free_port()
    proc, _ = start(tmp_path, port)
    try:
        log = tmp_path / "run" / "kliqued.log"
        size = log.stat().st_size
        p = subprocess.run(
            [
                *KLIQUED,
                "dev",
                "--dir",
                str(tmp_path / "run"),
                "--listen",
                f"127.0.0.1:{free_port()}",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode == 1, p.stdout + p.stderr
        assert (
            f"already running in {tmp_path / 'run'}/ (pid {proc.pid}, "
            f"http://127.0.0.1:{port})" in p.stderr
        ), p.stderr
        assert log.stat().st_size == size and "Traceback" not in p.stderr
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(40) == 0


def test_a_taken_default_port_is_said_and_used() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        first = busy.getsockname()[1]
        listen, note = _listen(None, first)
    assert listen != f"127.0.0.1:{first}" and note is not None
    assert f"port {first} is in use: listening on {listen}" in note
    assert _listen("127.0.0.1:9999", first) == ("127.0.0.1:9999", None)
