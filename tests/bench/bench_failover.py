"""Failover benchmark (issue 18 part 2): ``kill -9`` of the leader to the first placement by
the new leader. Target: within 5 s.

A real PostgreSQL (tests/harness/postgres.py), two ``kliqued serve`` on one database (the
small test estate, ``--lease-ttl 2s``, ``--place-without-workers``: no worker process to
start), ``TASKS`` tasks submitted to the leader first so that the takeover replays a log of
some size. Then the leader is killed (SIGKILL) and, at once, the SDK given both URLs submits
a task and polls it until it is placed: the time from the kill to the first poll that sees
it placed (the SDK's own retries included, as a user would see it). ``ROUNDS`` rounds, each
on a fresh database. The lease's TTL is the main part: a standby may take the lease only
once it has expired (docs/ha.md).

Run: ``PATH=$PWD/.venv/bin:$PATH .venv/bin/python -m tests.bench bench_failover``.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from kliqued.sdk import Client
from tests.harness.daemon import Server
from tests.harness.postgres import Postgres, unavailable

ROUNDS = 3
TASKS = 1000
TTL = "2s"
TARGET_S = 5.0
KEY = "kliqued-ledger.duckdb.token-key"


def _pair(tmp: Path, url: str) -> tuple[Server, Server]:
    servers = []
    for name in ("a", "b"):
        (tmp / name).mkdir()
        s = Server(tmp / name, db=url)
        s.extra += ["--lease-ttl", TTL, "--advertise-url", s.url]
        servers.append(s)
    a, b = servers
    a.start()
    shutil.copy(a.tmp / KEY, b.tmp / KEY)
    b.start(wait="standby")
    return a, b


def _round(pg: Postgres, n: int) -> float:
    tmp = Path(tempfile.mkdtemp(prefix="klique-failover-"))
    a, b = _pair(tmp, pg.createdb(f"failover_{n}"))
    try:
        token = a.token({"user": "bob"})
        k = Client([a.url, b.url], token, timeout=5, failover_s=60)
        for _ in range(TASKS):
            k.submit("team-a/sized", command=["true"], gpus=0.001)
        killed = time.monotonic()
        a.kill()
        task = k.submit("team-a/one", command=["true"])
        while k.task(task["id"])["state"] != "placed":
            time.sleep(0.02)
        return time.monotonic() - killed
    finally:
        for s in (a, b):
            if s.proc is not None and s.proc.poll() is None:
                s.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def run() -> list[dict[str, Any]]:
    why = unavailable()
    if why:
        return [
            {
                "name": "failover: kill -9 to the first placement by the new leader",
                "size": f"skipped: {why}",
                "median_s": 0.0,
                "max_s": 0.0,
            }
        ]
    pg = Postgres().start()
    try:
        times = [_round(pg, i) for i in range(ROUNDS)]
    finally:
        pg.stop()
    return [
        {
            "name": "failover: kill -9 of the leader to the first placement by the new leader",
            "size": f"2 daemons, lease TTL {TTL}, {TASKS} tasks in the log, {ROUNDS} rounds",
            "median_s": statistics.median(times),
            "max_s": max(times),
            "target_s": TARGET_S,
        }
    ]


if __name__ == "__main__":
    for row in run():
        print(row)
