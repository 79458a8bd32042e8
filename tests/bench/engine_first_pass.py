"""The XL first pass alone, to time, profile and compare engine changes side by side.

``make bench`` reports medians; changing the engine's hot path needs more: the same first
pass timed in alternation with a baseline checkout (the machine is shared), a profile of it,
and a digest of every decision, to show that a faster engine decides exactly the same (the
same placements and preemptions, in the same order, and the same next pass moments).

    .venv/bin/python -m tests.bench.engine_first_pass --org            # time it
    .venv/bin/python -m tests.bench.engine_first_pass --org --profile  # where time goes
    .venv/bin/python -m tests.bench.engine_first_pass --org --digest --steady 20
    .venv/bin/python -m tests.bench.engine_first_pass --org --steady 100  # steady CPU times
    .venv/bin/python -m tests.bench.engine_first_pass --lending --steady 30 --profile-steady

Run from another checkout's directory (``cd ../base && <this venv's python> -m ...``), it
measures that checkout's engine: its own directory comes first on ``sys.path``.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import hashlib
import json
import pstats
import sys
import time

from kliqued import engine as engine_pkg
from kliqued.engine import run_pass

from .bench_engine import XL


def _digest(h: "hashlib._Hash", res) -> None:
    for d in res.decisions:
        h.update(repr(d).encode())
    h.update(repr(res.next_pass_at).encode())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--org", action="store_true", help="issue 12's three-level tree")
    ap.add_argument(
        "--lending",
        action="store_true",
        help="lending.md's three settings on (fair, protect_for, least_lost_work)",
    )
    ap.add_argument(
        "--profile-steady",
        action="store_true",
        help="with --steady: cProfile the steady passes instead of the first",
    )
    ap.add_argument("--runs", type=int, default=1, help="first passes, each on a new state")
    ap.add_argument("--profile", action="store_true", help="cProfile the first pass")
    ap.add_argument(
        "--digest",
        action="store_true",
        help="print a digest of the decisions (first pass and --steady passes)",
    )
    ap.add_argument(
        "--steady",
        type=int,
        default=0,
        help="steady passes after the first (100 ends + 100 submissions each): "
        "their CPU times, or with --digest their decisions",
    )
    args = ap.parse_args(argv)
    out: dict = {
        "engine": engine_pkg.__file__,
        "org": args.org,
        "lending": args.lending,
        "wall_s": [],
        "cpu_s": [],
    }
    h = hashlib.sha256()
    for _ in range(args.runs):
        xl = XL(org=args.org, lending=args.lending)
        xl.now += 1000
        prof = cProfile.Profile() if args.profile and not args.profile_steady else None
        c = time.process_time()
        t = time.perf_counter()
        if prof is not None:
            prof.enable()
        res = run_pass(xl.index, xl.state, xl.now)
        if prof is not None:
            prof.disable()
        out["wall_s"].append(round(time.perf_counter() - t, 4))
        out["cpu_s"].append(round(time.process_time() - c, 4))
        out["placed"] = len(res.placements)
        if prof is not None:
            pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(25)
        if args.digest:
            _digest(h, res)
            st = xl.state
            for _ in range(args.steady):
                xl.now += 1000
                for task in xl.rnd.sample(st.placed_tasks(), 100):
                    st.end(task.id, xl.now)
                xl.submit_many(100)
                _digest(h, run_pass(xl.index, st, xl.now))
            h.update(repr(sorted((task.id, task.pool) for task in st.placed_tasks())).encode())
        elif args.steady:
            xl.steady(3)  # as bench_xl: the first passes after the fill park waiting queues
            cpu: list[float] = []
            sprof = cProfile.Profile() if args.profile_steady else None
            if sprof is not None:
                sprof.enable()
            xl.steady(args.steady, cpu=cpu)
            if sprof is not None:
                sprof.disable()
                pstats.Stats(sprof, stream=sys.stderr).sort_stats("tottime").print_stats(30)
            out.setdefault("steady_cpu_ms", []).extend(round(x * 1000, 2) for x in cpu)
        del res
        xl.release()
        del xl
        gc.collect()
    if args.digest:
        out["digest"] = h.hexdigest()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
