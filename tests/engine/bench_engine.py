"""XL engine benchmark (issue 3's targets): ``.venv/bin/python -m tests.engine.bench_engine``.

200 pools / 50,000 GPUs, 2,000 policies, 10,000 compute resources, 100,000 queued tasks.
Reports the first pass from empty, steady-state passes after 100 completions and 100
submissions (median, p99), and a pass with nothing new.
"""

from __future__ import annotations

import random
import statistics
import sys
import time

from kliqued.engine import EstateIndex, State, run_pass

from .helpers import START, build_estate


def xl_estate(n_pools: int = 200, gpus_per_pool: int = 250, n_policies: int = 2000,
              n_profiles: int = 500, policies_per_profile: int = 20, pools_per_profile: int = 3,
              seed: int = 7):
    rnd = random.Random(seed)
    pools = [{"name": f"p{i:03d}", "capacity": gpus_per_pool} for i in range(n_pools)]
    pols = [{"name": f"g{i:04d}", "reservation": 10, "limit": 40,
             **({"budget": {"hours": 5000, "period": "month"}} if i % 4 == 0 else {})}
            for i in range(n_policies)]
    profiles = []
    for j in range(n_profiles):
        # Policies spread so each is on n_profiles*ppp/n_policies profiles.
        ps = [pols[(j * policies_per_profile + k) % n_policies]["name"]
              for k in range(policies_per_profile)]
        # Pools near each other, so each policy's reservations are reachable.
        base = (j * 200 // n_profiles) % n_pools
        pl = [pools[(base + k) % n_pools]["name"] for k in range(pools_per_profile)]
        profiles.append({"name": f"r{j:03d}", "gpus": rnd.choice([1, 1, 1, 2]),
                         "weight": rnd.choice([0, 1, 2]), "pools": pl, "policies": ps,
                         "queueing": "strict" if j % 5 else "best_effort"})
    return build_estate(pools, profiles, pols)


def main() -> int:
    t0 = time.perf_counter()
    est = xl_estate()
    t1 = time.perf_counter()
    idx = EstateIndex.build(est)
    t2 = time.perf_counter()
    print(f"estate build {t1 - t0:.2f}s ({len(est.compute_resources)} CRs), "
          f"index {t2 - t1:.3f}s")
    st = State(idx, START)
    crs = sorted(idx.resources)
    n = 0
    for i in range(100_000):
        st.submit(f"t{n}", crs[i % len(crs)], "u", None, None, at=START)
        n += 1
    t3 = time.perf_counter()
    print(f"100k submissions {t3 - t2:.2f}s")
    now = START + 1000
    t4 = time.perf_counter()
    res = run_pass(idx, st, now)
    t5 = time.perf_counter()
    placed = len(res.placements)
    print(f"first pass: {t5 - t4:.3f}s, {placed} placements, {len(res.preemptions)} "
          f"preemptions, repeats {res.repeats}")
    rnd = random.Random(1)
    times = []
    for k in range(60):
        now += 1000
        placed_ids = [t.id for t in rnd.sample(st.placed_tasks(), 100)]
        for tid in placed_ids:
            st.end(tid, now)
        for i in range(100):
            st.submit(f"t{n}", crs[rnd.randrange(len(crs))], "u", None, None, at=now)
            n += 1
        a = time.perf_counter()
        res = run_pass(idx, st, now)
        times.append(time.perf_counter() - a)
    times.sort()
    print(f"steady: median {statistics.median(times) * 1000:.1f} ms, "
          f"p99 {times[int(len(times) * 0.99) - 1] * 1000:.1f} ms, max {times[-1] * 1000:.1f} ms"
          f" (last: {len(res.placements)} placed, {len(res.preemptions)} preempted)")
    idle = []
    for k in range(50):
        now += 1000
        a = time.perf_counter()
        run_pass(idx, st, now)
        idle.append(time.perf_counter() - a)
    print(f"nothing new: median {statistics.median(idle) * 1000:.2f} ms, "
          f"max {max(idle) * 1000:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
