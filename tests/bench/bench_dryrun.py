"""Dry-run benchmark (issue 31): 200 dry runs a second at p99 <= 50 ms on the XL state.

The XL state of bench_engine (200 pools / 50,000 GPUs, 2,000 policies, 10,000 compute
resources, 100,000 tasks, the first pass run: 50,000 placed, 50,000 queued), flat and with
lending.md's settings (order: fair, protection, least lost work: the reclaim, rebalance and
protection questions are the costly ones). Dry runs of random compute resources and sizes
are sent open loop at 200 a second for 5 s (dry run i is due at i/200 s; its latency counts
from when it was due, so falling behind shows), each on the live state, which is checked
unchanged afterwards. For comparison, once: the same question answered on a copy of the
state (pickle round trip, submit, pass), the way the issue's wording first suggests.

Run alone: ``.venv/bin/python -m tests.bench bench_dryrun``.
"""

from __future__ import annotations

import gc
import pickle
import statistics
import time

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


def run() -> list[dict]:
    return bench(lending=False) + bench(lending=True)


if __name__ == "__main__":
    for r in run():
        print(r)
