"""Issue 28's replay figures: the Chronus-Philly trace on the example estate (estate/), once
as it is (``order: ordered``, the default) and once with the lending settings on
(``order: fair``, ``protect_for: 30m``, ``victims: least_lost_work``), side by side: waits
p50/p95 per group, utilisation per pool, preemptions by kind and lost GPU-hours per group.

    python -m tests.bench.bench_lending_replay [--rows N] [--settings YAML] [--json FILE]

``--rows N`` replays only the first N tasks of the converted trace (a shorter window, when
``fair`` is slow); ``--settings`` replaces the lending mapping put into the copy of the
estate; ``--json`` writes both reports. The Markdown goes to stdout (docs/benchmarks.md and
docs/lending.md quote it); progress and timings go to stderr. Not in ``make bench``: it
measures what the settings do, not how fast the engine is.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compiler.api import compile_dir
from kliqued.sim.convert import convert
from kliqued.sim.report import PREEMPT_KINDS, fmt_duration
from kliqued.sim.trace import load_trace, replay

from .bench_engine import PHILLY, REPO

ESTATE = REPO / "estate"
LENDING = "{order: fair, protect_for: 30m, victims: least_lost_work}"


class SetupError(Exception):
    """The estate cannot take the lending settings: the message says where and what to do."""


def with_lending(src: Path, dest: Path, lending: str) -> Path:
    """A copy of the estate ``src`` at ``dest`` whose ``settings`` mapping gains
    ``lending: <lending>``: the estate's own files are never touched. The estate must have a
    block ``settings:`` at the start of a line, without a ``lending`` key already."""
    shutil.copytree(src, dest)
    for path in sorted(dest.rglob("*.yaml")):
        text = path.read_text()
        lines = text.splitlines(keepends=True)
        for i, line in enumerate(lines):
            if line.rstrip() == "settings:":
                if any(s.lstrip().startswith("lending:") for s in lines[i + 1 :]):
                    raise SetupError(
                        f"{src / path.relative_to(dest)}: settings already has "
                        "'lending'; remove it or pass --settings to replace it"
                    )
                lines.insert(i + 1, f"  lending: {lending}\n")
                path.write_text("".join(lines))
                return dest
    raise SetupError(
        f"{src}: no file has a block 'settings:' at the start of a line; add "
        "'settings:' to the estate's settings file"
    )


@dataclass(frozen=True)
class Run:
    label: str
    data: dict[str, Any]
    seconds: float


def run_both(rows: int | None, lending: str, work: Path) -> tuple[Run, Run, int]:
    """Convert the trace for the example estate, then replay it on the estate and on its
    copy with ``lending``. Returns both runs and the number of tasks replayed."""
    base = compile_dir(ESTATE).estate
    if base is None:
        raise SetupError(f"{ESTATE}: the example estate does not compile (kliqued plan says why)")
    lines = convert("chronus-philly", str(PHILLY), base).csv_text().splitlines()
    if rows is not None:
        lines = lines[: rows + 1]
    trace = work / "philly.csv"
    trace.write_text("\n".join(lines) + "\n")
    fair = compile_dir(with_lending(ESTATE, work / "estate", lending)).estate
    if fair is None:
        raise SetupError(f"lending: {lending}: the estate does not compile with it")
    runs = []
    for label, est in (("ordered", base), ("fair", fair)):
        print(f"replaying {len(lines) - 1:,} tasks with {label}...", file=sys.stderr, flush=True)
        t = time.perf_counter()
        data = replay(load_trace(str(trace), est), est, progress=sys.stderr).data
        runs.append(Run(label, data, time.perf_counter() - t))
        print(f"  {label}: {runs[-1].seconds:.1f} s", file=sys.stderr, flush=True)
    return runs[0], runs[1], len(lines) - 1


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.1f}%"


def _pair(a: str, b: str) -> str:
    return a if a == b else f"{a} → {b}"


def table(a: Run, b: Run) -> str:
    """Markdown: per pool utilisation, then per group waits, preemptions and lost work, each
    cell ``ordered → fair`` (one value when both are equal)."""
    out = [f"| pool | utilisation {a.label} | {b.label} |", "| --- | ---: | ---: |"]
    for pool, p in a.data["pools"].items():
        out.append(
            f"| {pool} | {_pct(p['utilisation'])} | {_pct(b.data['pools'][pool]['utilisation'])} |"
        )
    out.append(
        f"| all pools | {_pct(a.data['overall']['utilisation_all_pools'])} | "
        f"{_pct(b.data['overall']['utilisation_all_pools'])} |"
    )
    out.append("")
    kinds = " | ".join(PREEMPT_KINDS)
    out.append(f"| group | wait p50 | wait p95 | {kinds} | lost GPU-hours | GPU-hours |")
    out.append("| --- " + "| ---: " * (len(PREEMPT_KINDS) + 4) + "|")
    groups = [(g, s, b.data["groups"][g]) for g, s in a.data["groups"].items()]
    groups.append(("**all**", a.data["overall"], b.data["overall"]))
    for g, x, y in groups:
        cells = [
            _pair(fmt_duration(x["wait_s"]["p50"]), fmt_duration(y["wait_s"]["p50"])),
            _pair(fmt_duration(x["wait_s"]["p95"]), fmt_duration(y["wait_s"]["p95"])),
        ]
        cells += [
            _pair(f"{x['preemptions'][k]:,}", f"{y['preemptions'][k]:,}") for k in PREEMPT_KINDS
        ]
        cells.append(_pair(f"{x['lost_gpu_hours']:,.1f}", f"{y['lost_gpu_hours']:,.1f}"))
        cells.append(_pair(f"{x['gpu_hours']:,.0f}", f"{y['gpu_hours']:,.0f}"))
        out.append(f"| {g} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tests.bench.bench_lending_replay", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--rows", type=int, help="replay only the first N tasks")
    ap.add_argument("--settings", default=LENDING, help=f"the lending mapping ({LENDING})")
    ap.add_argument("--json", help="write both reports to this file")
    args = ap.parse_args(argv)
    if not PHILLY.exists():
        print(f"bench_lending_replay: {PHILLY} is absent (../shared): skipped", file=sys.stderr)
        return 0
    try:
        with tempfile.TemporaryDirectory() as tmp:
            a, b, n = run_both(args.rows, args.settings, Path(tmp))
    except SetupError as e:
        print(f"bench_lending_replay: {e}", file=sys.stderr)
        return 2
    print(
        f"{n:,} tasks of the Chronus-Philly trace on estate/ from {a.data['start']} "
        f"(simulated; the last task ended after {a.data['duration_h']:.1f} h with {a.label}, "
        f"{b.data['duration_h']:.1f} h with {b.label}); {a.label}: settings as they are; "
        f"{b.label}: settings.lending {args.settings}. Each cell: {a.label} → {b.label}.\n"
        f"Replay time: {a.label} {a.seconds:.0f} s, {b.label} {b.seconds:.0f} s.\n"
    )
    print(table(a, b), end="")
    if args.json:
        Path(args.json).write_text(json.dumps({a.label: a.data, b.label: b.data}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
