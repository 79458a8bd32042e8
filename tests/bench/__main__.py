"""`make bench`: runs every benchmark module and prints a Markdown table for
docs/benchmarks.md, with the machine and the date."""

from __future__ import annotations

import datetime
import importlib
import os
import platform
import sys

MODULES = [
    "bench_compiler",
    "bench_engine",
    "bench_ledger",
    "bench_finance",
    "bench_daemon",
    "bench_slurm",
    "bench_workers",
    "bench_whatif",
    "bench_web",
    "bench_failover",
    "bench_state",
    "bench_dryrun",
]


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB, Python "
        f"{platform.python_version()}, {platform.system()} {platform.release()}"
    )


def main() -> int:
    only = set(sys.argv[1:])
    print(f"# Benchmarks, {datetime.date.today().isoformat()}\n\nMachine: {machine()}\n")
    print("| benchmark | size | median | max | target | |")
    print("| --- | --- | --- | --- | --- | --- |")
    failed = False
    notes: list[str] = []
    for name in MODULES:
        if only and name not in only:
            continue
        module = importlib.import_module(f"tests.bench.{name}")
        print(f"running {name}...", file=sys.stderr, flush=True)
        for row in module.run():
            ok = row["median_s"] <= row["target_s"] if row.get("target_s") else True
            failed |= not ok
            target = f"{row['target_s'] * 1000:g} ms" if row.get("target_s") else ""
            print(
                f"| {row['name']} | {row.get('size', '')} | {row['median_s'] * 1000:.1f} ms "
                f"| {row['max_s'] * 1000:.1f} ms | {target} | {'ok' if ok else 'MISS'} |",
                flush=True,
            )
            notes.extend(row.get("extra", []))
    # Notes and sub-tables after the main table, so it stays one Markdown table.
    if notes:
        print()
        for line in notes:
            print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
