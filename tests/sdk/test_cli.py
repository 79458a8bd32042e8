"""The user commands against a real running `kliqued serve`, run in-process (main(argv)) with
one subprocess to check the whole process (exit code, no traceback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import duckdb
import pytest

from kliqued.sdk import Client
from tests.conftest import REPO

from tests.harness.daemon import free_port
from tests.harness.wait import wait_for


def test_submit_status_queue_cancel(server, as_user):
    admin = Client(server.url, server.admin)
    admin.set_engine(False)
    try:
        rc, out, err = as_user(
            "alice",
            "submit",
            "--resource",
            "llm-research/h100",
            "--project",
            "rlhf",
            "--label",
            "run=7",
            "--",
            "python",
            "train.py",
            "--epochs",
            "3",
        )
        assert rc == 0, err
        task_id, state = out.split()[:2]
        assert task_id.startswith("t-") and state == "queued"
        assert "position" in out and "waiting:" in out
        rc, out, _ = as_user("alice", "status", task_id)
        assert rc == 0 and "python train.py --epochs 3" in out and "run=7" in out
        assert "via cli" in out  # the CLI declares its channel (docs/channels.md)
        rc, out, _ = as_user("alice", "events", "--task", task_id, "--kind", "submitted")
        assert rc == 0 and "via cli" in out
        rc, out, _ = as_user("alice", "status")
        assert rc == 0 and task_id in out and out.startswith("ID")
        rc, out, _ = as_user("alice", "queue", "llm-research/h100")
        assert rc == 0 and task_id in out and "POS" in out
        rc, out, _ = as_user("alice", "queue", "llm-research/h100", "--json")
        assert task_id in [i["id"] for i in json.loads(out)["queue"]]
        rc, out, _ = as_user("alice", "cancel", task_id)
        assert rc == 0 and f"{task_id}  cancelled" in out
        rc, out, _ = as_user("alice", "status", task_id, "--json")
        assert json.loads(out)["end_reason"] == "cancelled"
    finally:
        admin.set_engine(True)


def test_submit_json_and_refusal(as_user):
    rc, out, _ = as_user(
        "alice", "submit", "-r", "llm-research/h100", "-p", "evals", "--json", "--", "true"
    )
    assert rc == 0 and json.loads(out)["resource"] == "llm-research/h100"
    as_user("alice", "cancel", json.loads(out)["id"])
    rc, out, err = as_user("alice", "submit", "-r", "vision/h100", "--", "true")
    assert rc == 1 and err.startswith("kliqued: ") and "vision" in err and out == ""
    rc, _, err = as_user("alice", "submit", "-r", "llm-research/h100")
    assert rc == 1 and "nothing to run" in err
    rc, _, err = as_user("alice", "cancel", "t-nope")
    assert rc == 1 and "t-nope" in err


def test_budget_and_pools(as_user):
    rc, out, _ = as_user("alice", "budget")
    assert rc == 0 and "llm-research" in out and "RUN-OUT" in out
    rc, out, _ = as_user("alice", "budget", "llm-research")
    assert rc == 0 and "burn rate" in out and "resets" in out
    rc, out, _ = as_user("alice", "budget", "--json")
    assert any(p["name"] == "llm-research" for p in json.loads(out)["policies"])
    rc, out, _ = as_user("alice", "pools")
    assert rc == 0 and "onprem-k8s" in out and out.splitlines()[-1].startswith("total")
    rc, out, _ = as_user("role:finance", "pools", "--json")
    assert {p["name"] for p in json.loads(out)["pools"]} >= {"onprem-k8s"}


def test_budget_and_pools_by_level_for_a_business_unit(as_user):
    """The example estate's tree as its heads see it: victor's business unit (commercial >
    digital > its teams), ursula's department with its envelope's detail and subtree."""
    rc, out, _ = as_user("victor", "budget")
    table = out.split("\n\n")[0].splitlines()
    assert rc == 0 and table[0].startswith("POLICY") and "WAITING" in table[0]
    indented = [(len(line) - len(line.lstrip()), line.split()[0]) for line in table[1:]]
    assert indented == [
        (0, "commercial"),
        (2, "digital"),
        (4, "customer-ai"),
        (4, "finance-analytics"),
    ], out
    rc, out, _ = as_user("ursula", "budget", "digital")
    assert (
        rc == 0 and "envelope     over finance-analytics, customer-ai; shared reservation 2" in out
    ), out
    assert "counted at   digital > commercial" in out
    tree = out.split("\n\n")[-1].splitlines()
    assert [line.split()[0] for line in tree[1:]] == [
        "digital",
        "customer-ai",
        "finance-analytics",
    ], out
    rc, out, _ = as_user("mallory", "budget")  # a team lead: the team, on its own
    assert rc == 0 and [line.split()[0] for line in out.split("\n\n")[0].splitlines()[1:]] == [
        "customer-ai"
    ], out
    rc, out, err = as_user("ursula", "pools", "--by-level")
    assert rc == 0 and ("LEVEL" in out or "no GPUs in use" in out), err


def test_ledger_sql_and_export(as_user, tmp_path):
    rc, out, _ = as_user(
        "alice", "submit", "-r", "llm-research/h100", "-p", "evals", "--json", "--", "sleep", "5"
    )
    tid = json.loads(out)["id"]
    sql = f"SELECT task, \"user\", gpus FROM ledger WHERE task = '{tid}'"
    rows = wait_for(
        lambda: json.loads(as_user("role:finance", "ledger", "sql", "--json", sql)[1])["rows"],
        10,
        "the ledger row",
    )
    assert rows == [[tid, "alice", "1.000"]]
    rc, out, err = as_user("role:finance", "ledger", "sql", sql)
    assert rc == 0 and tid in out and "1 row" in err
    rc, out, _ = as_user("role:finance", "ledger", "sql", "--csv", sql)
    assert out.splitlines() == ["task,user,gpus", f"{tid},alice,1.000"]
    # numbers as the query returns them (issue 10, bug 1: 3.49 showed as 3.5, 0.0004 as 0)
    rc, out, _ = as_user(
        "role:finance",
        "ledger",
        "sql",
        "SELECT 3.49::DOUBLE AS a, 0.0004::DOUBLE AS b, "
        "round(2.34567::DOUBLE, 3) AS c, 1.85::DECIMAL(18,6) AS d",
    )
    assert rc == 0 and out.splitlines()[1].split() == ["3.49", "0.0004", "2.346", "1.850000"]
    rc, _, err = as_user("role:finance", "ledger", "sql", "UPDATE ledger SET gpus = 0")
    assert rc == 1 and "only SELECT" in err
    rc, _, err = as_user("bob", "ledger", "sql", "SELECT 1")  # a member: administers nothing
    assert rc == 1 and "finance" in err and "group admins" in err
    rc, out, _ = as_user("alice", "ledger", "sql", sql)  # llm-research's admin: her team's rows
    assert rc == 0 and tid in out
    as_user("alice", "cancel", tid)
    out_file = tmp_path / "nov.parquet"
    rc, _, err = as_user(
        "role:finance",
        "ledger",
        "export",
        "--from",
        "2026-01-01",
        "--to",
        "2100-01-01",
        "-o",
        str(out_file),
    )
    assert rc == 0, err
    got = (
        duckdb.connect()
        .execute(f"SELECT task, end_reason FROM read_parquet('{out_file}') WHERE task = ?", [tid])
        .fetchall()
    )
    assert got == [(tid, "cancelled")]
    rc, _, err = as_user(
        "role:finance",
        "ledger",
        "export",
        "--from",
        "yesterday",
        "--to",
        "2100-01-01",
        "-o",
        str(tmp_path / "x.csv"),
    )
    assert rc == 1 and "--from" in err and not (tmp_path / "x.csv").exists()


def test_errors_are_one_line_without_traceback(server, tmp_path):
    env = {
        "PATH": "/usr/bin:/bin",
        "KLIQUE_CONFIG": str(tmp_path / "absent.yaml"),
        "KLIQUE_URL": f"http://127.0.0.1:{free_port()}",
        "KLIQUE_TOKEN": "kq_x",
    }

    def kliqued(*argv, **extra):
        return subprocess.run(
            [sys.executable, "-m", "kliqued.cli", *argv],
            cwd=REPO,
            capture_output=True,
            text=True,
            env={**env, **extra},
        )

    p = kliqued("pools")
    assert p.returncode == 1 and p.stderr.startswith("kliqued: cannot reach http://127.0.0.1:")
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
    p = kliqued("status", KLIQUE_URL=server.url, KLIQUE_TOKEN="kq_wrong")
    assert p.returncode == 1 and "token" in p.stderr and "Traceback" not in p.stderr
    p = kliqued("queue", "llm-research/h100", KLIQUE_URL="", KLIQUE_TOKEN="")
    assert p.returncode == 1 and "no server URL" in p.stderr and "KLIQUE_URL" in p.stderr


def test_context_flag(server, tmp_path, monkeypatch, no_klique_env, run):
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        f"current-context: a\ncontexts:\n"
        f"  - name: a\n    url: http://127.0.0.1:9\n    token: kq_x\n"
        f"  - name: b\n    url: {server.url}\n    token: {server.token('alice')}\n"
    )
    monkeypatch.setenv("KLIQUE_CONFIG", str(cfg))
    rc, out, err = run(["pools", "--context", "b", "--json"])
    assert rc == 0, err
    rc, out, err = run(["pools", "--url", server.url, "--token", server.token("alice")])
    assert rc == 0 and "onprem-k8s" in out


def test_status_into_a_closed_pipe_is_silent(server, tmp_path):
    """`kliqued status | head -1` once head has gone: no `kliqued: Broken pipe` (bug 9)."""
    alice = Client(server.url, server.token("alice"))
    tid = alice.submit("llm-research/h100", command=["true"], project="evals")["id"]
    env = {
        "PATH": "/usr/bin:/bin",
        "KLIQUE_CONFIG": str(tmp_path / "absent.yaml"),
        "KLIQUE_URL": server.url,
        "KLIQUE_TOKEN": server.token("alice"),
    }
    try:
        for argv in (["status", "--state", "all"], ["status", tid], ["pools"]):
            r, w = os.pipe()
            os.close(r)
            try:
                p = subprocess.run(
                    [sys.executable, "-m", "kliqued.cli", *argv],
                    cwd=REPO,
                    env=env,
                    stdout=w,
                    stderr=subprocess.PIPE,
                    text=True,
                    timeout=60,
                )
            finally:
                os.close(w)
            assert (p.returncode, p.stderr) == (141, ""), argv
        p = subprocess.run(
            f"'{sys.executable}' -m kliqued.cli status --state all | head -1",
            shell=True,
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.stdout.startswith("ID") and p.stderr == ""
    finally:
        alice.cancel(tid)


def test_status_lists_the_newest_first_and_limit_takes_the_newest(server, as_user, capsys):
    """``status --limit N`` shows the newest N, newest first (as squeue, sacct and the
    dashboard), across pages of the API's ``order=newest``; a limit below 1 is refused."""
    admin = Client(server.url, server.admin)
    admin.set_engine(False)
    ids = []
    try:
        for _ in range(5):
            rc, out, err = as_user(
                "alice", "submit", "-r", "llm-research/h100", "-p", "evals", "--", "true"
            )
            assert rc == 0, err
            ids.append(out.split()[0])
        rc, out, err = as_user("alice", "status", "--limit", "2", "--json")
        assert rc == 0, err
        assert [t["id"] for t in json.loads(out)["tasks"]] == [ids[4], ids[3]]
        rc, out, _ = as_user("alice", "status", "--limit", "3")
        listed = [line.split()[0] for line in out.splitlines()[1:]]
        assert listed == [ids[4], ids[3], ids[2]]
        # the API's pages, newest first, one task a page: no task twice, none missed
        alice = Client(server.url, server.token("alice"))
        paged = [t["id"] for t in alice.tasks(state="queued", page_size=1, newest_first=True)]
        assert paged[:5] == ids[::-1] and len(paged) == len(set(paged))
        with pytest.raises(SystemExit) as refused:  # argparse's usage error
            as_user("alice", "status", "--limit", "0")
        assert refused.value.code == 2
        assert "'0' is not a positive whole number" in capsys.readouterr().err
    finally:
        for i in ids:
            as_user("alice", "cancel", i)
        admin.set_engine(True)


def test_logs_of_a_queued_task_says_why_there_is_none(server, as_user):
    admin = Client(server.url, server.admin)
    admin.set_engine(False)
    try:
        rc, out, err = as_user(
            "alice", "submit", "-r", "llm-research/h100", "-p", "evals", "--", "true"
        )
        assert rc == 0, err
        task_id = out.split()[0]
        rc, out, err = as_user("alice", "logs", task_id)
        assert rc == 0 and out == ""
        assert err.startswith(f"==> {task_id} no log yet: queued (")
        as_user("alice", "cancel", task_id)
        rc, out, err = as_user("alice", "logs", task_id)
        assert rc == 0 and "no log yet" not in err and "ended: cancelled" in err
    finally:
        admin.set_engine(True)
