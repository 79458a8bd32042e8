"""Worker protocol benchmarks (issue 5).

1. **1,000 workers long-polling.** ``kliqued serve`` on the example estate; 1,000 simulated
   workers (one process, aiohttp, spread over the 8 pools) register, hold long polls with no
   free GPU and heartbeat every 5 s, while a load generator submits 600 one-GPU tasks in
   bursts (every placement wakes the polls of its pool). The baseline is the same load with
   one worker per pool (a pool with no live worker takes no work, so a baseline without
   any worker would place nothing and time no pass). Measured: the engine pass time (the daemon's ``pass:`` log lines) and the
   latency from a task's submission to its placement (event log times). Target: within
   twice the baseline.
2. **1,000 trivial tasks end to end.** A real ``klique-worker`` with 8 declared GPUs on a
   pool of 8; 1,000 tasks ``true`` submitted at once; the time from the first submission to
   the last reported end (no target: a figure to watch; see docs/benchmarks.md for where
   the time goes).

Run: ``PATH=$PWD/.venv/bin:$PATH .venv/bin/python -m tests.bench bench_workers``.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.daemon.fleet import ESTATE, FleetServer, RealWorker, write_estate
from tests.harness.daemon import EXAMPLE_ESTATE, Server
from tests.harness.wait import wait_for

WORKERS = 1000
TASKS = 1000
BURSTS, PER_BURST = 30, 20
POOLS = [
    "onprem-k8s",
    "onprem-baremetal",
    "paris-k8s",
    "hpc-slurm",
    "aws-eu-burst",
    "azure-nl-reserved",
    "neocloud-nordic",
    "neocloud-de",
]
PROJECT = {"alice": "rlhf", "dave": "inspection", "frank": "recsys", "heidi": "ocean-2040"}
"""A project of each user's group (the example groups list projects)."""
LOAD = {
    "alice": ["llm-research/h100", "llm-research/bigmem-2x"],
    "dave": ["vision/standard", "vision/h100"],
    "frank": ["applied-ml/standard", "applied-ml/finetune-2x"],
    "heidi": ["climate/batch", "climate/train-4x"],
}


def _passes(log: str) -> list[float]:
    """The engine passes' times from the daemon's ``pass: 3 placed (1.2 ms)`` lines (the
    sequencer logs a pass that did something)."""
    return [float(m) / 1000 for m in re.findall(r"pass: .* \(([\d.]+) ms\)", log)]


def _samples(run: dict[str, Any], key: str, what: str) -> list[float]:
    """``run[key]``, or an error saying why there is nothing to take a median of."""
    got: list[float] = run[key]
    if not got:
        raise RuntimeError(
            f"bench_workers: no {what} with {run['workers']} workers ({run['tasks']} tasks "
            f"submitted): did any pool have a live worker? (the daemon's log: {run['log']})"
        )
    return got


async def _pollers(
    url: str,
    tokens: dict[str, str],
    n: int,
    stop: asyncio.Event,
    ready: asyncio.Event,
    counts: dict[str, int],
) -> None:
    import aiohttp

    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=conn, timeout=aiohttp.ClientTimeout(total=60)
    ) as session:
        registered = 0

        async def worker(i: int) -> None:
            nonlocal registered
            pool = POOLS[i % len(POOLS)]
            # the key a worker keeps in its state dir and proves itself with on every call
            h = {
                "Authorization": f"Bearer {tokens[pool]}",
                "X-Klique-Worker-Key": secrets.token_urlsafe(32),
            }
            wid = f"w-bench-{i:04d}"
            async with session.post(
                f"{url}/v1/workers/register",
                headers=h,
                json={
                    "worker_id": wid,
                    "pool": pool,
                    "hostname": f"h{i}",
                    "executor": "process",
                    "gpus": [{"index": 0}],
                    "version": "bench",
                },
            ) as r:
                assert r.status == 200, await r.text()
            registered += 1
            if registered == n:
                ready.set()

            async def beats() -> None:
                await asyncio.sleep(5 * i / n)  # staggered: 200 heartbeats/s in all
                while not stop.is_set():
                    async with session.post(
                        f"{url}/v1/workers/{wid}/heartbeat", headers=h, json={"running": []}
                    ) as r:
                        await r.read()
                    counts["heartbeats"] += 1
                    await asyncio.sleep(5)

            hb = asyncio.create_task(beats())
            try:
                while not stop.is_set():
                    async with session.post(
                        f"{url}/v1/workers/{wid}/lease?wait=30", headers=h, json={"free_gpus": []}
                    ) as r:
                        await r.read()
                    counts["polls"] += 1
            finally:
                hb.cancel()

        tasks = [asyncio.create_task(worker(i)) for i in range(n)]
        await stop.wait()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _submit_bursts(url: str, tokens: dict[str, str]) -> list[str]:
    import aiohttp

    ids: list[str] = []
    users = list(LOAD)
    async with aiohttp.ClientSession() as session:
        n = 0
        for _ in range(BURSTS):
            reqs = []
            for _ in range(PER_BURST):
                user = users[n % len(users)]
                res = LOAD[user][(n // len(users)) % 2]
                body: dict[str, Any] = {
                    "resource": res,
                    "command": ["true"],
                    "project": PROJECT[user],
                }
                if res.endswith("/batch"):
                    body["gpus"] = 1
                reqs.append(
                    session.post(
                        f"{url}/v1/tasks",
                        json=body,
                        headers={"Authorization": f"Bearer {tokens[user]}"},
                    )
                )
                n += 1
            for coro in asyncio.as_completed([_json(r) for r in reqs]):
                ids.append((await coro)["id"])
            await asyncio.sleep(0.1)
    return ids


async def _json(req: Any) -> Any:
    async with req as r:
        return await r.json()


def _latencies(s: Server) -> list[float]:
    """Submission to placement, from the event log (daemon times)."""
    rows = s.ok("POST", "/v1/ledger/sql", {"sql": "SELECT 1"})  # the server is up
    del rows
    submitted: dict[str, str] = {}
    out: list[float] = []
    seq = 0
    while True:
        page = s.ok("GET", f"/v1/events?since={seq}&limit=1000")
        for e in page["events"]:
            if e["kind"] == "submitted":
                submitted[e["task"]] = e["at"]
            elif e["kind"] == "placed" and e["task"] in submitted:
                out.append(_ms(e["at"]) - _ms(submitted.pop(e["task"])))
        if not page["next"]:
            return [x / 1000 for x in out]
        seq = page["next"]


def _ms(text: str) -> float:
    from kliqued.daemon.units import parse_iso

    return parse_iso(text)


def _one_run(workers: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        s = FleetServer(
            Path(tmp), estate=EXAMPLE_ESTATE, ttl="60s", extra=["--poll-wait", "30s"]
        ).start()
        try:
            users = {u: s.token({"user": u}) for u in LOAD}
            wtokens = {p: s.token({"worker": True, "pool": p}) for p in POOLS}
            counts = {"polls": 0, "heartbeats": 0}

            async def main() -> list[str]:
                stop, ready = asyncio.Event(), asyncio.Event()
                bg = None
                if workers:
                    bg = asyncio.create_task(_pollers(s.url, wtokens, workers, stop, ready, counts))
                    await asyncio.wait_for(ready.wait(), 60)
                    await asyncio.sleep(1.0)
                ids = await _submit_bursts(s.url, users)
                await asyncio.sleep(1.5)
                stop.set()
                if bg is not None:
                    await bg
                return ids

            ids = asyncio.run(main())
            lat = _latencies(s)
        finally:
            s.stop()
        passes = _passes(s.log())
        return {
            "passes": passes,
            "latency": lat,
            "tasks": len(ids),
            "workers": workers,
            "log": s.log()[-2000:],
            **counts,
        }


def bench_long_polls() -> list[dict]:
    base = _one_run(len(POOLS))
    busy = _one_run(WORKERS)
    rows = []
    for label, key in (("engine pass", "passes"), ("submit to placed", "latency")):
        b, w = _samples(base, key, label), _samples(busy, key, label)
        bm, wm = statistics.median(b), statistics.median(w)
        rows.append(
            {
                "name": f"{label} with {WORKERS} long-polling workers",
                "size": f"{busy['tasks']} tasks in bursts of {PER_BURST}; {len(w)} samples",
                "median_s": wm,
                "max_s": max(w),
                "target_s": max(2 * bm, 0.001),
                "extra": [
                    f"  baseline with {len(POOLS)} workers (one per pool): median {bm * 1000:.1f} ms, "
                    f"max {max(b) * 1000:.1f} ms; with them: {busy['polls']} "
                    f"polls answered, {busy['heartbeats']} heartbeats"
                ],
            }
        )
    return rows


def bench_end_to_end() -> list[dict]:
    files = {
        **ESTATE,
        "pools.yaml": ESTATE["pools.yaml"].replace("capacity: 2", "capacity: 8", 1),
        "policies.yaml": ESTATE["policies.yaml"]
        .replace("limit: 2\n  - name: team-b", "limit: 8\n  - name: team-b")
        .replace("reservation: 2\n", "reservation: 8\n", 1),
    }
    with tempfile.TemporaryDirectory() as tmp:
        root = write_estate(Path(tmp) / "estate", files)
        s = FleetServer(Path(tmp), estate=root, ttl="15s").start()
        w = None
        try:
            alice = s.token({"user": "alice"})
            w = RealWorker(
                s,
                s.token({"worker": True, "pool": "bare"}),
                Path(tmp) / "w",
                gpus="0,1,2,3,4,5,6,7",
            ).start()
            time.sleep(1.0)

            async def submit_all() -> None:
                import aiohttp

                conn = aiohttp.TCPConnector(limit=32)
                async with aiohttp.ClientSession(connector=conn) as session:

                    async def one(i: int) -> None:
                        async with session.post(
                            f"{s.url}/v1/tasks",
                            json={"resource": "team-a/one", "command": ["true"]},
                            headers={"Authorization": f"Bearer {alice}"},
                        ) as r:
                            assert r.status == 201, await r.text()

                    await asyncio.gather(*(one(i) for i in range(TASKS)))

            t0 = time.perf_counter()
            asyncio.run(submit_all())
            submitted = time.perf_counter() - t0
            wait_for(
                lambda: (
                    s.ok(
                        "POST",
                        "/v1/ledger/sql",
                        {"sql": "SELECT count(*) FROM ledger WHERE end_reason = 'finished'"},
                    )["rows"][0][0]
                    >= TASKS
                ),
                600,
                f"{TASKS} tasks to finish",
                every=0.1,
            )
            took = time.perf_counter() - t0
        finally:
            if w is not None:
                w.stop()
            s.stop()
    return [
        {
            "name": f"{TASKS} tasks `true` through a worker with 8 GPUs, submit to finished "
            "(time per task: the whole run divided by the tasks)",
            "size": f"{TASKS / took:.0f} tasks/s",
            "median_s": took / TASKS,
            "max_s": took / TASKS,
            "target_s": None,
            "extra": [f"  {took:.1f} s in all; submissions took {submitted:.1f} s"],
        }
    ]


def run() -> list[dict]:
    return bench_long_polls() + bench_end_to_end()


if __name__ == "__main__":
    for row in run():
        print(row, file=sys.stderr)
