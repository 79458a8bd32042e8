"""Dry-run benchmark (issue 31): 200 dry runs a second at p99 <= 50 ms on the XL state.

The XL state of bench_engine (200 pools / 50,000 GPUs, 2,000 policies, 10,000 compute
resources, 100,000 tasks, the first pass run: 50,000 placed, 50,000 queued), flat and with
lending.md's settings (order: fair, protection, least lost work: the reclaim, rebalance and
protection questions are the costly ones). Dry runs of random compute resources and sizes
are sent open loop at 200 a second for 5 s (dry run i is due at i/200 s; its latency counts
from when it was due, so falling behind shows), each on the live state, which is checked
unchanged afterwards. For comparison, once: the same question answered on a copy of the
state (pickle round trip, submit, pass), the way the issue's wording first suggests.

Then the same through the whole daemon: ``kliqued serve`` (a subprocess) on the example
estate holding 100,000 tasks (bench_daemon's state: the events a live daemon logs, with its
passes), and dry runs over loopback HTTP (``POST /v1/tasks`` with ``dry_run: true``) at 200
a second for 10 s, open loop, four users in turn: the API's checks, the engine's answer and
the view, as a client sees them.

Run alone: ``.venv/bin/python -m tests.bench bench_dryrun``.
"""

from __future__ import annotations

import asyncio
import gc
import pickle
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from kliqued.engine import run_pass
from kliqued.engine.dryrun import dry_run

from tests.bench.bench_engine import XL

RATE = 200
SECONDS = 5
TARGET_P99_S = 0.050


def _open_loop(x: XL, rate: int, seconds: float) -> tuple[list[float], dict[str, int]]:
    """Latencies (from each dry run's due time) and the outcomes' counts."""
    st, idx = x.state, x.index
    crs = x.crs
    total = int(rate * seconds)
    lat: list[float] = []
    outcomes: dict[str, int] = {}
    now = x.now
    t0 = time.perf_counter()
    for i in range(total):
        due = t0 + i / rate
        wait = due - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        cr = idx.resources[crs[x.rnd.randrange(len(crs))]]
        gpus = None if cr.fixed_size is not None else x.rnd.choice((1000, 2000, 4000))
        a = dry_run(idx, st, cr.name, "u", None, gpus, now)
        lat.append(time.perf_counter() - due)
        key = a.phase or (a.reason.kind if a.reason is not None else "?")
        outcomes[key] = outcomes.get(key, 0) + 1
    return lat, outcomes


def _copied(x: XL) -> float:
    """One dry run the copying way: the state pickled and read back, the task submitted,
    a pass run on the copy."""
    cr = x.crs[0]
    a = time.perf_counter()
    copy = pickle.loads(pickle.dumps(x.state, protocol=pickle.HIGHEST_PROTOCOL))
    copy.submit("dry", cr, "u", None, None, at=x.now)
    run_pass(x.index, copy, x.now)
    return time.perf_counter() - a


def bench(lending: bool) -> list[dict]:
    x = XL(lending=lending)
    try:
        x.first_pass()
        x.steady(3)  # some completions and submissions: a state in motion, settled
        st = x.state
        version, ntasks = st.version, len(st.tasks)
        gc.collect()
        lat, outcomes = _open_loop(x, RATE, SECONDS)
        assert (st.version, len(st.tasks)) == (version, ntasks), "a dry run changed the state"
        lat.sort()
        p99 = lat[int(len(lat) * 0.99) - 1]
        label = "XL + fair, protect_for, least_lost_work" if lending else "XL"
        seen = ", ".join(f"{k} {n}" for k, n in sorted(outcomes.items()))
        rows = [
            {
                "name": f"dry run, {label}: {RATE}/s open loop for {SECONDS} s, p99 "
                f"(median column; {seen})",
                "size": f"{len(lat):,} dry runs",
                "median_s": p99,
                "max_s": lat[-1],
                "target_s": TARGET_P99_S,
            },
            {
                "name": f"dry run, {label}: median latency",
                "size": f"{len(lat):,} dry runs",
                "median_s": statistics.median(lat),
                "max_s": lat[-1],
            },
        ]
        if not lending:
            copied = _copied(x)
            rows.append(
                {
                    "name": "dry run on a copied XL state (pickle round trip, submit, pass): "
                    "for comparison",
                    "size": "1",
                    "median_s": copied,
                    "max_s": copied,
                }
            )
        return rows
    finally:
        x.release()


HTTP_SECONDS = 10
SETTLE_S = 20
TASKS_IN_STATE = 100_000


async def _http_load(
    url: str, tokens: dict[str, str], rate: int, seconds: float, whoami: bool = False
) -> dict:
    """Dry runs (or, ``whoami``, ``GET /v1/whoami`` for reference) open loop at ``rate``."""
    import aiohttp

    from tests.bench.bench_daemon import PROJECT, USERS

    total = int(rate * seconds)
    lat: list[float] = []
    statuses: dict[int, int] = {}
    outcomes: dict[str, int] = {}
    users = list(tokens)
    t0 = time.perf_counter() + 0.2
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=20)) as session:

        async def one(i: int) -> None:
            due = t0 + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            user = users[i % len(users)]
            res = USERS[user][(i // len(users)) % len(USERS[user])]
            body: dict[str, Any] = {
                "resource": res,
                "project": PROJECT[user],
                "command": ["python", "job.py"],
                "dry_run": True,
            }
            if res.endswith("/batch"):
                body["gpus"] = 1 + i % 3
            async with session.request(
                "GET" if whoami else "POST",
                f"{url}/v1/whoami" if whoami else f"{url}/v1/tasks",
                json=None if whoami else body,
                headers={"Authorization": f"Bearer {tokens[user]}"},
            ) as resp:
                data = await resp.json()
                statuses[resp.status] = statuses.get(resp.status, 0) + 1
            lat.append(time.perf_counter() - due)
            key = (
                "whoami"
                if whoami
                else (data.get("phase") or (data.get("waiting_reason") or {}).get("kind", "?"))
            )
            outcomes[key] = outcomes.get(key, 0) + 1

        await asyncio.gather(*(one(i) for i in range(total)))
    lat.sort()
    return {
        "n": len(lat),
        "p50_s": lat[len(lat) // 2],
        "p99_s": lat[int(len(lat) * 0.99) - 1],
        "max_s": lat[-1],
        "statuses": statuses,
        "outcomes": outcomes,
    }


def bench_http() -> list[dict]:
    from tests.bench.bench_daemon import USERS, build_state
    from tests.harness.daemon import EXAMPLE_ESTATE, Server

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "k.duckdb"
        info = build_state(db, TASKS_IN_STATE)
        s = Server(Path(tmp), estate=EXAMPLE_ESTATE, db=db).start(timeout=120)
        try:
            tokens = {u: s.token({"user": u}) for u in USERS}
            # The daemon's work after a start (warming the usage figures, the first passes
            # over 100,000 tasks) is not what is measured: time passing is the point here.
            time.sleep(SETTLE_S)
            ref = asyncio.run(_http_load(s.url, tokens, RATE, HTTP_SECONDS, whoami=True))
            r = asyncio.run(_http_load(s.url, tokens, RATE, HTTP_SECONDS))
            # nothing stored: no submission logged after the state written before the start
            later = s.ok("GET", f"/v1/events?since={info['events']}&kind=submitted")["events"]
            assert later == [], f"a dry run was stored: {later[:1]}"
        finally:
            s.stop()
    ok = set(r["statuses"]) == {200}
    seen = ", ".join(f"{k} {n}" for k, n in sorted(r["outcomes"].items()))
    return [
        {
            "name": f"dry run over HTTP, kliqued serve with {info['tasks']:,} tasks "
            f"({info['placed']:,} placed): {RATE}/s open loop for {HTTP_SECONDS} s, p99 "
            f"(median column; {seen})",
            "size": f"{r['n']:,} dry runs, statuses {r['statuses']}",
            "median_s": r["p99_s"] if ok else float("inf"),
            "max_s": r["max_s"],
            "target_s": TARGET_P99_S,
            "extra": [
                f"  dry runs over HTTP: p50 {r['p50_s'] * 1000:.1f} ms; for reference, "
                f"GET /v1/whoami at the same rate just before: p50 {ref['p50_s'] * 1000:.1f} "
                f"ms, p99 {ref['p99_s'] * 1000:.1f} ms"
            ],
        }
    ]


def run() -> list[dict]:
    return bench(lending=False) + bench(lending=True) + bench_http()


if __name__ == "__main__":
    for r in run():
        print(r)
