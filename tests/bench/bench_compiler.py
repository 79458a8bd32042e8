"""Compiler benchmarks: validate + compile an XL estate, and plan between two XL revisions.

Targets (issue 2): validate + compile within 3 s, plan within 5 s, on a 2-core machine.
"""

from __future__ import annotations

import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from compiler.api import compile_files
from tests.harness.typed import present

from .xl_estate import write_xl, xl_files


def _timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def bench_compile(repeat: int = 3) -> dict:
    files = xl_files()
    result = compile_files(files)
    assert result.ok, [d.render() for d in result.errors[:5]]
    est = present(result.estate)
    times = _timed(lambda: compile_files(files), repeat)
    return {
        "name": "validate + compile XL estate",
        "target_s": 3.0,
        "median_s": statistics.median(times),
        "max_s": max(times),
        "size": f"{len(est.pools)} pools, {len(est.policies)} policies, "
        f"{len(est.profiles)} profiles, {len(est.compute_resources)} compute "
        f"resources, {sum(len(f.data) for f in files) / 1e6:.1f} MB YAML",
    }


def bench_plan(repeat: int = 3) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        git = lambda *a: subprocess.run(
            ["git", *a],
            cwd=repo,
            check=True,  # noqa: E731
            capture_output=True,
        )
        git("init", "-q", "-b", "main")
        git("config", "user.email", "bench@example.com")
        git("config", "user.name", "bench")
        write_xl(repo / "estate")
        git("add", "-A")
        git("commit", "-qm", "base")
        write_xl(repo / "estate", capacity_bump=8, weight_bump=1)
        git("commit", "-qam", "head")

        def run() -> int:
            p = subprocess.run(
                [
                    "kliqued",
                    "plan",
                    "--base",
                    "HEAD~1",
                    "--head",
                    "HEAD",
                    "--format",
                    "json",
                    "-o",
                    str(repo / "plan.json"),
                ],
                cwd=repo,
                capture_output=True,
                text=True,
            )
            # exit 2 = changes; argparse also exits 2, so the written plan is checked too
            assert p.returncode == 2 and (repo / "plan.json").exists(), p.stdout + p.stderr
            (repo / "plan.json").unlink()
            return p.returncode

        times = _timed(run, repeat)
    return {
        "name": "plan between two XL revisions (git objects, whole CLI process)",
        "target_s": 5.0,
        "median_s": statistics.median(times),
        "max_s": max(times),
        "size": "20 pools' capacity and 10 profiles' weights changed",
    }


def run() -> list[dict]:
    return [bench_compile(), bench_plan()]
