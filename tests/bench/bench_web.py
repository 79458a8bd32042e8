"""Dashboard benchmark (issue 13): each page of the dashboard rendered by the server against
the XL state: the XL estate (200 pools, 2,000 policies, 10,000 compute resources) with
100,000 tasks in state (written through the daemon's own code, as bench_daemon's restart
benchmark does), and the placements' ledger rows.

Measured: a full page (``GET /<page>``) and its live fragment, as an admin (who sees
everything) and as a developer (``My work``: their tasks among the 100,000), over loopback
from a signed-in session, the server's whole answer. Target: within 300 ms.

While 50 browsers hold the Orchestration page's live updates open (each asks for its live
part every pass, as the page's script does), the engine's passes (``/metrics``' pass
duration histogram: mean over the window) and a live answer's latency are measured too.

Run: ``PATH=$PWD/.venv/bin:$PATH .venv/bin/python -m tests.bench bench_web``.
"""

from __future__ import annotations

import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tests.harness.daemon import ADMIN, Server
from tests.harness.typed import present
from tests.web.browser import Browser

from .bench_daemon import TASKS_IN_STATE, build_state
from .xl_estate import write_xl

TARGET_S = 0.3
REPEAT = 7
PAGES = ["orchestration", "policy", "my-work", "usage", "audit", "estate"]


def xl_task(resources: list[str]) -> Any:
    """The ``i``-th submission: the compute resources in turn, by one of their group's
    users, one GPU where the task sets its size."""

    def task(i: int) -> dict[str, Any]:
        res = resources[i % len(resources)]
        team = res.split("/", 1)[0]
        k = int(team.rsplit("-", 1)[1])
        return {
            "resource": res,
            "user": f"user-{k:04d}{'ab'[i % 2]}",
            "project": f"proj-{k % 7}",
            "gpus_milli": None,
            "command": ["python", "job.py", str(i)],
            "payload": None,
            "labels": {},
        }

    return task


def timed(b: Browser, path: str) -> list[float]:
    """Each request a rendering: a live part gets a parameter of its own each time, or the
    browsers' shared rendering (one per second and view) would answer it."""
    times = []
    for i in range(REPEAT):
        t = time.perf_counter()
        a = b.get(f"{path}&n={i}" if "?" in path else path)
        times.append(time.perf_counter() - t)
        assert a.status == 200, (path, a.status, a.text[:300])
    return times


BROWSERS = 50
HOLD_S = 10.0


def _passes(s: Server) -> tuple[float, float]:
    text = s.call("GET", "/metrics")[1]
    total = float(
        present(re.search(r"^klique_pass_duration_seconds_sum (\S+)$", text, re.M)).group(1)
    )
    count = float(
        present(re.search(r"^klique_pass_duration_seconds_count (\S+)$", text, re.M)).group(1)
    )
    return total, count


def fifty_browsers(s: Server, size: str) -> dict[str, Any]:
    """``BROWSERS`` signed-in sessions polling the live part at the pass rate (1 s) for
    ``HOLD_S``: the latency of their answers, and the engine's mean pass meanwhile."""
    sessions = []
    for _ in range(BROWSERS):
        b = Browser(s.url)
        b.sign_in(ADMIN)
        sessions.append(b)
    latencies: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + HOLD_S

    def poll(b: Browser, i: int) -> None:
        seq = ""
        time.sleep(i / BROWSERS)  # browsers opened over a second, not at one instant
        while time.monotonic() < stop:
            t = time.perf_counter()
            a = b.get(f"/orchestration?live=1&seq={seq}&fresh=1")
            took = time.perf_counter() - t
            assert a.status in (200, 204), a.status
            seq = a.headers.get("X-Klique-Seq") or seq
            with lock:
                latencies.append(took)
            time.sleep(max(0.0, 1.0 - took))

    before = _passes(s)
    threads = [threading.Thread(target=poll, args=(b, i)) for i, b in enumerate(sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = _passes(s)
    passes = after[1] - before[1]
    mean_pass = (after[0] - before[0]) / passes if passes else 0.0
    latencies.sort()
    return {
        "name": f"{BROWSERS} browsers holding live updates: a live answer",
        "size": size,
        "median_s": statistics.median(latencies),
        "max_s": latencies[-1],
        "target_s": TARGET_S,
        "extra": [
            f"  meanwhile {passes:.0f} engine passes, mean {mean_pass * 1000:.2f} ms; "
            f"p99 live answer {latencies[int(len(latencies) * 0.99)] * 1000:.1f} ms"
        ],
    }


def run(tasks: int = TASKS_IN_STATE) -> list[dict]:
    from compiler.api import compile_dir

    with tempfile.TemporaryDirectory() as tmp:
        estate = Path(tmp) / "estate"
        write_xl(estate)
        compiled = compile_dir(estate).estate
        assert compiled is not None
        resources = sorted(cr.name for cr in compiled.compute_resources)
        t = time.perf_counter()
        info = build_state(Path(tmp) / "k.duckdb", tasks, estate, xl_task(resources))
        build_s = time.perf_counter() - t
        s = Server(Path(tmp), estate=estate, db=Path(tmp) / "k.duckdb", admin=ADMIN)
        s.start(timeout=300)
        try:
            admin = Browser(s.url)
            admin.sign_in(ADMIN)
            dev = Browser(s.url)
            dev.sign_in(s.token({"user": "user-0007a"}))
            size = (
                f"{info['tasks']} tasks ({info['placed']} placed), "
                f"{len(resources)} compute resources"
            )
            rows = []
            for who, b, pages in (("admin", admin, PAGES), ("developer", dev, ["my-work"])):
                for page in pages:
                    for path, what in ((f"/{page}", "page"), (f"/{page}?live=1", "live")):
                        times = timed(b, path)
                        rows.append(
                            {
                                "name": f"dashboard {page} ({what}) as {who}",
                                "size": size,
                                "median_s": statistics.median(times),
                                "max_s": max(times),
                                "target_s": TARGET_S,
                            }
                        )
                        if (page, what) == ("usage", "page"):
                            # the month's CIO figures: computed at start, then held
                            rows[-1]["extra"] = [
                                f"  usage page's first load "
                                f"{times[0] * 1000:.0f} ms (the month's CIO "
                                f"figures computed at the daemon's start)"
                            ]
            rows[0]["extra"] = [f"  dashboard state written in {build_s:.1f} s"]
            rows.append(fifty_browsers(s, size))
            return rows
        finally:
            s.stop()


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else TASKS_IN_STATE
    for row in run(n):
        print(row)
