"""Bounded state benchmarks (issue 18, part 3).

1. **Memory and restart with 10 million ended tasks in history.** A DuckDB file with the
   example estate, an admin token, 1,000 live tasks and ``ENDED`` tasks submitted and
   cancelled long ago: their events (``submitted``, ``cancelled``) and their task history
   rows are generated straight into the file by SQL (minutes through the API would be
   days), then a snapshot of the state after them is taken through the daemon's own code
   (the ended tasks evicted, as a live daemon would have them). Measured: ``kliqued serve``
   start to its first healthy answer (target 5 s), and its resident memory once it has
   answered a listing of ended tasks and an old task read back from the history (target
   1 GiB; the peak too).
2. **kill -9 restart with the largest write-ahead log the daemon lets build up.** The daemon
   checkpoints inside the commit that crosses ``store.CHECKPOINT_WAL`` (256 MB) and at a clean
   stop, so that is the most WAL a crash can leave. Submissions and engine passes are
   committed through the daemon's own prepare/commit path, with a snapshot every
   ``snapshot.EVERY`` events as ``kliqued serve`` takes them, until the WAL is just under the
   threshold; the writer then dies without a checkpoint (``os._exit``, as ``kill -9``), and
   ``kliqued serve`` is timed from start to its first healthy answer (the WAL replayed by
   DuckDB, then the log after the last snapshot). Recorded, no target.

Sizes: ``KLIQUE_BENCH_ENDED`` (default 10,000,000) and ``KLIQUE_BENCH_WAL_MB`` (default the
checkpoint threshold, 256), smaller for a quick run:
``KLIQUE_BENCH_ENDED=200000 KLIQUE_BENCH_WAL_MB=16 .venv/bin/python -m tests.bench bench_state``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.bench.bench_daemon import example_task
from tests.harness.daemon import ADMIN, EXAMPLE_ESTATE, ROOT, Server
from tests.harness.typed import present

ENDED = int(os.environ.get("KLIQUE_BENCH_ENDED", "10000000"))
WAL_MB = int(os.environ.get("KLIQUE_BENCH_WAL_MB", "256"))
LIVE = 1000
DAY_MS = 86_400_000


def _b32_sql(expr: str, width: int) -> str:
    """SQL for ``ids._b32(expr, width)`` (Crockford base32, most significant first)."""
    alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
    return " || ".join(
        f"substr('{alphabet}', ((({expr}) >> {5 * k}) & 31)::INTEGER + 1, 1)"
        for k in reversed(range(width))
    )


def _generate(
    conn: Any, n: int, first_seq: int, base_ms: int, kinds: list[tuple[str, str, str, str]]
) -> None:
    """``n`` tasks submitted and cancelled from ``base_ms`` on: their two events each and
    their history rows; ``kinds``: (user, resource, project, group) of task ``i`` by
    ``i % len(kinds)``."""
    conn.execute("SET enable_progress_bar = false")

    def case(k: int) -> str:
        return (
            f"CASE i % {len(kinds)} "
            + " ".join(f"WHEN {j} THEN '{u[k]}'" for j, u in enumerate(kinds))
            + " END"
        )

    conn.execute(f"""
        CREATE TEMP TABLE gen AS
        SELECT i, 't-' || {_b32_sql(f"{base_ms} + i // 1000", 10)}
                      || {_b32_sql("i % 1000", 4)} AS id,
               {base_ms} + i // 1000 AS at_ms, {case(0)} AS usr, {case(1)} AS res,
               {case(2)} AS project, {case(3)} AS grp
          FROM range({n}) t(i)""")
    conn.execute(f"""
        INSERT INTO events
        SELECT {first_seq} + 2 * i, at_ms, 'submitted', id, 'user:' || usr, 'bench', grp,
               usr, json_object('resource', res, 'user', usr, 'project', project,
                                'gpus_milli', NULL, 'command', ['python', 'job.py'],
                                'payload', NULL, 'labels', json_object(),
                                'channel', 'api', 'idempotency_key', NULL)
          FROM gen""")
    conn.execute(f"""
        INSERT INTO events
        SELECT {first_seq} + 2 * i + 1, at_ms + 1000, 'cancelled', id, 'user:' || usr,
               'bench', grp, usr,
               json_object('text', 'cancelled by user:' || usr, 'by', 'request',
                           'was', 'queued', 'pool', NULL, 'interval', NULL, 'channel', 'api')
          FROM gen""")
    conn.execute("""
        INSERT INTO task_history
        SELECT id, usr, grp, res, NULL, 'user:' || usr, NULL, at_ms, at_ms + 1000,
               json_object('id', id, 'resource', res, 'policy', split_part(res, '/', 1),
                           'profile', split_part(res, '/', 2), 'group', grp, 'user', usr,
                           'actor', 'user:' || usr, 'project', project,
                           'labels', json_object(), 'command', ['python', 'job.py'],
                           'payload', NULL, 'gpus_milli', NULL, 'submitted_at', at_ms,
                           'revision', 'bench', 'idempotency_key', NULL, 'state', 'ended',
                           'ended_at', at_ms + 1000, 'end_reason', 'cancelled',
                           'end_note', 'cancelled by user:' || usr,
                           'ended_by', 'user:' || usr, 'channel', 'api')::VARCHAR
          FROM gen""")
    conn.execute("DROP TABLE gen")


def build_history(db: Path, n: int) -> dict[str, Any]:
    """The file of benchmark 1 (see the module's docstring)."""
    from compiler.api import compile_dir
    from kliqued.daemon.state import snapshot
    from kliqued.daemon.storage import keyfile
    from kliqued.daemon.auth import Principal
    from kliqued.daemon.state.daemon import Daemon
    from kliqued.daemon.state.prepared import Overlay
    from kliqued.daemon.state.submission import Submission
    from kliqued.daemon.storage.store import Batch, Store

    store = Store(str(db))
    store.ensure_schema()
    d = Daemon()
    d.tokens.hasher, _ = keyfile.open_hasher(db, store)
    estate = compile_dir(EXAMPLE_ESTATE).estate
    assert estate is not None

    def commit(prepared: list, now: int) -> None:
        batch = Batch()
        for p in prepared:
            for ev in p.events:
                d.seq += 1
                batch.rows.append(ev.row(d.seq, now))
            batch.ops.extend(p.ops)
        store.commit_sync(batch)
        for p in prepared:
            p.apply()

    base = d.clock.now() - 400 * DAY_MS
    commit([d.prepare_estate(estate, str(EXAMPLE_ESTATE), "bench", base, Overlay())], base)
    commit([d.prepare_token(None, "role:admin", "bench", base, Overlay(), secret=ADMIN)], base)
    t = time.perf_counter()
    kinds = [
        (t["user"], t["resource"], t["project"], d.idx().resources[t["resource"]].group)
        for t in (example_task(i) for i in range(8))
    ]
    store.write_local(lambda conn: _generate(conn, n, d.seq + 1, base + 1, kinds))
    last_seq = d.seq + 2 * n
    first = store.read_sync(
        lambda cur: present(cur.execute("SELECT min(id) FROM task_history").fetchone())[0]
    )
    last = store.read_sync(
        lambda cur: present(cur.execute("SELECT max(id) FROM task_history").fetchone())[0]
    )
    generated_s = time.perf_counter() - t
    d.seq = last_seq
    d.task_ids.seed(last)
    d.clock.at_least(base + n // 1000 + 2000)
    now = d.clock.now()
    ov = Overlay()
    commit(
        [
            d.prepare_submit(Principal("user", f["user"]), Submission(**f), now, ov)
            for f in (example_task(i) for i in range(LIVE))
        ],
        now,
    )
    snap = snapshot.take(d)
    store.write_local(lambda conn: snapshot.write(conn, snap, d.clock.now()))
    store.close()
    return {
        "events": d.seq,
        "first": first,
        "generated_s": generated_s,
        "snapshot_mb": len(snap.body) / 2**20,
    }


def rss_mib(pid: int) -> tuple[float, float]:
    """(resident, peak resident) of ``pid`` in MiB."""
    fields = dict(
        line.split(":", 1)
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if ":" in line
    )
    return (int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024)


def bench_history() -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "k.duckdb"
        t = time.perf_counter()
        info = build_history(db, ENDED)
        build_s = time.perf_counter() - t
        s = Server(Path(tmp), estate=EXAMPLE_ESTATE, db=db)
        t = time.perf_counter()
        s.start(timeout=600)
        start_s = time.perf_counter() - t
        assert s.ok("GET", f"/v1/tasks/{info['first']}")["state"] == "ended"
        assert len(s.ok("GET", "/v1/tasks?state=ended&limit=1000")["tasks"]) == 1000
        assert s.proc is not None
        rss, peak = rss_mib(s.proc.pid)
        log = s.log()
        s.stop(timeout=600)
        m = re.findall(r"replayed (\d+) events \((\d+) tasks\) in ([\d.]+) s", log)
    size = f"{ENDED:,} ended tasks in history, {LIVE} live, {info['events']:,} events"
    return [
        {
            "name": "restart with ended tasks in history: start to first healthy answer "
            "(snapshot, whole process)",
            "size": size,
            "median_s": start_s,
            "max_s": start_s,
            "target_s": 5.0,
            "extra": [
                f"  replayed after the snapshot: {m[-1][0] if m else '?'} events; "
                f"snapshot {info['snapshot_mb']:.1f} MiB; generating the history "
                f"{info['generated_s']:.0f} s ({build_s:.0f} s in all)"
            ],
        },
        {
            "name": "daemon memory with ended tasks in history (resident, after reading "
            "some back; ms = MiB)",
            "size": size,
            "median_s": rss / 1000,
            "max_s": peak / 1000,
            "target_s": 1024 / 1000,
            "extra": [f"  resident {rss:.0f} MiB, peak {peak:.0f} MiB (target 1 GiB)"],
        },
    ]


# --------------------------------------------------------------------------- WAL
WAL_WRITER = r"""
import os, sys, time
from pathlib import Path
from tests.bench.bench_daemon import example_task
from tests.harness.daemon import ADMIN, EXAMPLE_ESTATE
from compiler.api import compile_dir
from kliqued.daemon.state import snapshot
from kliqued.daemon.storage import keyfile
from kliqued.daemon.auth import Principal
from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.state.prepared import Overlay
from kliqued.daemon.state.submission import Submission
from kliqued.daemon.storage.store import Batch, Store

db, wal_bytes = Path(sys.argv[1]), int(sys.argv[2])
store = Store(str(db))
store.ensure_schema()
d = Daemon()
d.tokens.hasher, _ = keyfile.open_hasher(db, store)
estate = compile_dir(EXAMPLE_ESTATE).estate

def commit(prepared, events=(), ops=(), now=0):
    batch = Batch(ops=list(ops))
    for ev in events:
        d.seq += 1
        batch.rows.append(ev.row(d.seq, now))
    for p in prepared:
        for ev in p.events:
            d.seq += 1
            batch.rows.append(ev.row(d.seq, now))
        batch.ops.extend(p.ops)
    store.commit_sync(batch)
    for p in prepared:
        p.apply()

now = d.clock.now()
commit([d.prepare_estate(estate, str(EXAMPLE_ESTATE), "bench", now, Overlay())], now=now)
commit([d.prepare_token(None, "role:admin", "bench", now, Overlay(), secret=ADMIN)], now=now)
store.close()  # checkpointed: what follows is all in the WAL
store = Store(str(db))
store.ensure_schema()
wal = Path(str(db) + ".wal")
i = last_snap = 0
while not wal.exists() or wal.stat().st_size < wal_bytes:
    now = d.clock.now()
    ov = Overlay()
    prepared = [d.prepare_submit(Principal("user", f["user"]), Submission(**f), now, ov)
                for f in (example_task(i + k) for k in range(500))]
    i += 500
    commit(prepared, now=now)
    events, ops, _ = d.run_pass(d.clock.now())
    commit([], events, ops, d.clock.now())
    if d.seq - last_snap >= snapshot.EVERY:
        snap = snapshot.take(d)
        store.write_local(lambda conn: snapshot.write(conn, snap, d.clock.now()))
        last_snap = d.seq
print(d.seq, i, last_snap, wal.stat().st_size, flush=True)
os._exit(0)  # no checkpoint: as kill -9 leaves it
"""


def bench_wal() -> list[dict]:
    from kliqued.daemon.storage.store import CHECKPOINT_WAL

    threshold = int(CHECKPOINT_WAL.removesuffix("MB")) * 1000 * 1000
    want = min(threshold, WAL_MB * 1000 * 1000) - 4 * 1000 * 1000  # the last commit's room
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "k.duckdb"
        out = subprocess.run(
            [sys.executable, "-c", WAL_WRITER, str(db), str(want)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=3600,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        seq, tasks, snap_seq, wal = (int(x) for x in out.stdout.split())
        s = Server(Path(tmp), estate=EXAMPLE_ESTATE, db=db)
        t = time.perf_counter()
        s.start(timeout=600)
        start_s = time.perf_counter() - t
        assert s.ok("GET", "/v1/tasks?limit=1")["tasks"]
        s.stop(timeout=600)
    return [
        {
            "name": "kill -9 restart with the largest WAL (start to first healthy answer)",
            "size": f"WAL {wal / 2**20:.0f} MiB, {tasks:,} tasks, {seq:,} events, "
            f"{seq - snap_seq:,} after the last snapshot",
            "median_s": start_s,
            "max_s": start_s,
            "target_s": None,
        }
    ]


def run() -> list[dict]:
    return bench_history() + bench_wal()


if __name__ == "__main__":
    for row in run():
        print(row)
