"""``kliqued plan --what-if`` at the issue's scale (issue 16): the Chronus-Philly load (about
30,000 tasks on the Philly-sized estate of bench_engine: 1,280 GPUs, 11 groups) replayed on
the base and on a head that lowers one group's limit, the whole command timed: git, both
compiles, reading the demand, two replays, the comparison, the markdown. Target: 10 s."""

from __future__ import annotations

import contextlib
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

from compiler.api import compile_files
from kliqued.cli import main
from tests.plan.helpers import commit_all, init_repo

from .bench_engine import PHILLY, philly_estate_files

TARGET_S = 10.0


def _plan(repo: Path, demand: Path) -> tuple[float, int, str]:
    out, err = io.StringIO(), io.StringIO()
    t = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(
            [
                "plan",
                "--repo",
                str(repo),
                "--base",
                "main",
                "--what-if",
                str(demand),
                "--format",
                "markdown",
            ]
        )
    return time.perf_counter() - t, code, out.getvalue() + err.getvalue()


def bench_whatif(repeat: int = 2, limit: int | None = None) -> dict | None:
    """``limit``: only the first rows of the trace (a quick check of this module)."""
    if not PHILLY.exists():
        print(f"bench_whatif: {PHILLY} is absent: skipped", file=sys.stderr)
        return None
    from kliqued.sim.convert import convert

    files = philly_estate_files()
    est = compile_files(files).estate
    assert est is not None
    conv = convert("chronus-philly", str(PHILLY), est)
    lines = conv.csv_text().splitlines()
    if limit is not None:
        lines = lines[: limit + 1]
    with tempfile.TemporaryDirectory() as tmp:
        repo = init_repo(Path(tmp) / "repo")
        estate = repo / "estate"
        estate.mkdir()
        for f in files:
            (estate / Path(f.path).name).write_bytes(f.data)
        commit_all(repo, "philly")
        path = estate / "estate.yaml"
        text = path.read_text()
        path.write_text(
            text.replace("reservation: 96, limit: 512", "reservation: 96, limit: 128", 1)
        )
        demand = Path(tmp) / "demand.csv"
        demand.write_text("\n".join(lines) + "\n")
        runs = [_plan(repo, demand) for _ in range(repeat)]
    for _, code, output in runs:
        assert code == 2, output[-2000:]
    times = [t for t, _, _ in runs]
    return {
        "name": "kliqued plan --what-if (git, compile, two replays, comparison, markdown)",
        "size": f"{len(lines) - 1:,} tasks of the Chronus-Philly load, 11 groups, "
        "1,280 GPUs, one limit lowered",
        "median_s": statistics.median(times),
        "max_s": max(times),
        "target_s": TARGET_S,
    }


def run() -> list[dict]:
    row = bench_whatif()
    return [row] if row else []
