"""State that survives: a clean restart rebuilds the same state, ``kill -9`` under load loses
no acknowledged task and duplicates none, the ledger stays consistent with the engine, and
start-up refuses what it must (a second daemon on the file, an invalid estate)."""

from __future__ import annotations

import itertools
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.harness.daemon import ROOT, SMALL_ESTATE, Server
from tests.harness.wait import wait_for

CMD = {"command": ["true"]}  # a task needs a command or a payload


def all_tasks(s: Server) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    after = ""
    while True:
        page = s.ok("GET", f"/v1/tasks?limit=1000{'&after=' + after if after else ''}")
        out += page["tasks"]
        if not page["next"]:
            return out
        after = page["next"]


def last_seq(s: Server) -> int:
    seq = 0
    while True:
        page = s.ok("GET", f"/v1/events?since={seq}&limit=1000")
        if not page["events"]:
            return seq
        seq = page["events"][-1]["seq"]


def settled(s: Server) -> None:
    """Waits until nothing is logged for a while: the passes after the last change ran."""

    def quiet() -> bool:
        last = last_seq(s)
        time.sleep(0.15)
        return not s.ok("GET", f"/v1/events?since={last}")["events"]

    wait_for(quiet, timeout=10)


def snapshot(s: Server) -> dict[str, Any]:
    pols = s.ok("GET", "/v1/policies")["policies"]
    for p in pols:  # budget use grows with time; compare the rest exactly
        if p["budget"]:
            for k in ("used_hours", "left_hours", "runout_at"):
                p["budget"].pop(k)
    queues = {
        r["name"]: s.ok("GET", f"/v1/resources/{r['name']}/queue")["queue"]
        for r in s.ok("GET", "/v1/resources")["resources"]
    }
    resources = s.ok("GET", "/v1/resources")
    for r in resources["resources"]:  # a group's room: its budget use grows with time too
        if r["room"]["budget"]:
            for k in ("used_hours", "left_hours"):
                r["room"]["budget"].pop(k)
    tasks = all_tasks(s)
    for t in tasks:  # a placed task's GPU-hours and lost work grow with time too; an ended
        if t["state"] != "ended":  # one's are fixed
            t.pop("gpu_hours")
            t.pop("lost_work_s", None)
    return {
        "tasks": tasks,
        "policies": pols,
        "pools": s.ok("GET", "/v1/pools"),
        "resources": resources,
        "queues": queues,
        "tokens": s.ok("GET", "/v1/tokens"),
    }


def test_restart_rebuilds_the_same_state(tmp_path: Path, db: str | None) -> None:
    s = Server(tmp_path, db=db).start()
    bob = s.token({"user": "bob"})
    erin = s.token({"user": "erin"})
    a = [s.ok("POST", "/v1/tasks", {"resource": "team-a/one", **CMD}, bob)["id"] for _ in range(4)]
    wait_for(lambda: all(s.ok("GET", f"/v1/tasks/{t}")["state"] == "placed" for t in a))
    for _ in range(3):
        s.ok("POST", "/v1/tasks", {"resource": "team-b/one", **CMD}, erin)
    sized = [
        s.ok("POST", "/v1/tasks", {"resource": "team-a/sized", "gpus": g, **CMD}, bob)["id"]
        for g in (4, 3, 2, 0.5)
    ]
    s.ok("POST", f"/v1/tasks/{sized[-1]}/cancel", token=bob)
    settled(s)
    before = snapshot(s)
    pre = [t for t in before["tasks"] if t["preemptions"]]
    assert len(pre) == 2 and all(
        t["last_preemption"]["text"] == "reclaimed by team-b" for t in pre
    )  # a reclaim happened, and is rebuilt
    assert {t["state"] for t in before["tasks"]} == {"queued", "placed", "ended"}
    seq = last_seq(s)
    assert s.stop() == 0
    s.start()
    wait_for(lambda: s.ok("GET", "/v1/engine")["last_pass_at"])
    after = snapshot(s)
    assert after == before
    new = s.ok("GET", f"/v1/events?since={seq}")["events"]
    assert not [e for e in new if e["kind"] in ("placed", "preempted", "cancelled")], new
    assert "replayed" in s.log() and "(unchanged)" in s.log()
    s.estate = None  # a restart without --estate runs the estate from the log
    assert s.stop() == 0
    s.start()
    assert s.ok("GET", "/v1/estate")["revision"] == after["tasks"][0]["revision"]
    assert s.stop() == 0


class Load(threading.Thread):
    """Submits (and sometimes cancels) with Idempotency-Keys until the daemon dies; records
    every acknowledged key and every key whose answer never came."""

    def __init__(self, s: Server, tokens: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.s = s
        self.tokens = tokens
        self.acked: dict[str, str] = {}
        self.unknown: set[str] = set()
        self.bodies: dict[str, tuple[str, dict[str, Any]]] = {}
        self.stop = threading.Event()
        self.errors: list[str] = []

    def run(self) -> None:
        rnd = random.Random(7)
        for i in itertools.count():
            if self.stop.is_set():
                return
            who = rnd.choice(["bob", "erin"])
            res = "team-a" if who == "bob" else "team-b"
            body: dict[str, Any] = (
                {"resource": f"{res}/one", **CMD}
                if rnd.random() < 0.5
                else {"resource": f"{res}/sized", **CMD, "gpus": rnd.choice([0.5, 1, 2])}
            )
            key = f"k{i}"
            body["labels"] = {"key": key}
            self.bodies[key] = (who, body)
            try:
                status, data = self.s.call(
                    "POST",
                    "/v1/tasks",
                    body,
                    self.tokens[who],
                    headers={"Idempotency-Key": key},
                    timeout=5,
                )
            except OSError:
                self.unknown.add(key)
                return
            if status == 201:
                self.acked[key] = data["id"]
                if rnd.random() < 0.2:
                    try:
                        self.s.call(
                            "POST",
                            f"/v1/tasks/{data['id']}/cancel",
                            token=self.tokens[who],
                            timeout=5,
                        )
                    except OSError:
                        return
            else:
                self.errors.append(f"{status} {data}")
                return


def ledger_sql(s: Server, sql: str) -> list[list[Any]]:
    return s.ok("POST", "/v1/ledger/sql", {"sql": sql})["rows"]


def killed_under_load(s: Server, acked: int, timeout: float = 60) -> tuple[Load, dict]:
    """``s`` started, loaded by :class:`Load` as bob and erin, and killed with SIGKILL once
    ``acked`` submissions were acknowledged (however loaded the machine is: not after a
    fixed time); returns the load (joined, without errors) and the tokens."""
    s.start()
    tokens = {"bob": s.token({"user": "bob"}), "erin": s.token({"user": "erin"})}
    load = Load(s, tokens)
    load.start()
    wait_for(
        lambda: len(load.acked) > acked or load.errors,
        timeout=timeout,
        what=f"{acked} acknowledged submissions",
    )
    s.kill()
    load.join(10)
    assert not load.errors, load.errors[:3]
    assert len(load.acked) > acked, "the load did not get going"
    return load, tokens


def test_kill_9_under_load(tmp_path: Path, db: str | None) -> None:
    s = Server(tmp_path, db=db)
    load, tokens = killed_under_load(s, 50)
    s.start()
    # Every acknowledged task is there, exactly once; a retry finds it.
    resources = s.ok("GET", "/v1/resources")
    for r in resources["resources"]:  # a group's room: its budget use grows with time too
        if r["room"]["budget"]:
            for k in ("used_hours", "left_hours"):
                r["room"]["budget"].pop(k)
    tasks = all_tasks(s)
    by_key: dict[str, list[str]] = {}
    for t in tasks:
        by_key.setdefault(t["labels"]["key"], []).append(t["id"])
    assert all(len(v) == 1 for v in by_key.values()), "a key made two tasks"
    for key, tid in load.acked.items():
        assert by_key.get(key) == [tid], key
    for key in list(load.acked) + sorted(load.unknown):
        who, body = load.bodies[key]
        status, data = s.call(
            "POST", "/v1/tasks", body, tokens[who], headers={"Idempotency-Key": key}
        )
        if key in load.acked:
            assert (status, data["id"]) == (200, load.acked[key])
        else:
            assert status in (200, 201)
    assert len(all_tasks(s)) == len(tasks) + sum(1 for k in load.unknown if k not in by_key)
    settled(s)
    # The ledger: no overlapping intervals of one task; one open interval per placed task.
    overlaps = ledger_sql(
        s,
        """
        SELECT a.interval_id, b.interval_id FROM ledger a JOIN ledger b
          ON a.task = b.task AND a.interval_id < b.interval_id
         AND a.start_at < coalesce(b.end_at, TIMESTAMP '9999-01-01')
         AND b.start_at < coalesce(a.end_at, TIMESTAMP '9999-01-01')""",
    )
    assert overlaps == []
    open_rows = ledger_sql(
        s, "SELECT task, count(*) FROM ledger WHERE end_at IS NULL GROUP BY task"
    )
    placed = {t["id"] for t in all_tasks(s) if t["state"] == "placed"}
    assert {r[0]: r[1] for r in open_rows} == {t: 1 for t in placed}
    # Budgets and the ledger agree: stop everything, then compare team-a's budget use
    # with the ledger's weighted hours of team-a this month.
    for t in all_tasks(s):
        if t["state"] != "ended":
            s.ok("POST", f"/v1/tasks/{t['id']}/cancel")
    settled(s)
    pol = s.ok("GET", "/v1/policies/team-a")["budget"]
    # in SQL both DuckDB and PostgreSQL run (finance's SQL runs in the ledger's database)
    start = f"extract(epoch FROM TIMESTAMP '{pol['period_start'][:19]}')"
    rows = ledger_sql(
        s,
        f"""
        SELECT coalesce(sum(CAST(time_weight AS DOUBLE PRECISION) * CAST(extract(epoch FROM
                 end_at) - greatest(extract(epoch FROM start_at), {start}) AS DOUBLE PRECISION))
                 / 3600.0, 0), count(*)
          FROM ledger WHERE "group" = 'team-a' AND end_at IS NOT NULL""",
    )
    ledger_hours, n = float(rows[0][0]), int(rows[0][1])
    assert n > 0
    one_ms = 2 * n / 3_600_000  # weight 2, 1 ms per interval
    assert abs(pol["used_hours"] - ledger_hours) <= one_ms, (pol["used_hours"], ledger_hours)
    assert s.stop() == 0


def test_second_daemon_on_the_same_file_fails(tmp_path: Path) -> None:
    s = Server(tmp_path).start()
    try:
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "kliqued.cli",
                "serve",
                "--db",
                str(s.db),
                "--estate",
                str(SMALL_ESTATE),
                "--listen",
                "127.0.0.1:0",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode == 1
        assert "in use by another process" in p.stderr and "only one kliqued serve" in p.stderr
    finally:
        assert s.stop() == 0


def test_invalid_estate_refuses_to_start(tmp_path: Path) -> None:
    bad = tmp_path / "estate"
    bad.mkdir()
    (bad / "pools.yaml").write_text("pools:\n  - name: p\n    kind: kubernetes\n")
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "kliqued.cli",
            "serve",
            "--db",
            str(tmp_path / "k.duckdb"),
            "--estate",
            str(bad),
            "--listen",
            "127.0.0.1:0",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2
    assert "not valid" in p.stderr and "pools.yaml" in p.stderr


def test_first_admin_token_is_printed_once(tmp_path: Path) -> None:
    s = Server(tmp_path, admin=None).start()
    log = s.log()
    assert log.count("FIRST ADMIN TOKEN") == 1
    token = next(w for w in log.split() if w.startswith("kq_"))
    s.admin = token
    assert s.ok("GET", "/v1/whoami")["principal"] == "role:admin"
    assert s.stop() == 0
    s.start()
    assert s.log().count("FIRST ADMIN TOKEN") == 1
    assert s.stop() == 0
