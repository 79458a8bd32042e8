"""The store away, for real: a full disk under the DuckDB file (a small tmpfs) and a stopped
PostgreSQL. While it is away writes get 507/503 with ``Retry-After``, reads keep answering,
health says ``degraded``, and the daemon does not exit; once it is back, writes work again
without a restart, and every acknowledged submission is in the log exactly once, none of the
refused ones (loop.py, storefault.py)."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.test_durability import CMD, all_tasks
from tests.harness.daemon import Server
from tests.harness.wait import wait_for


def _submit(s: Server, token: str) -> tuple[int, Any, str]:
    key = uuid.uuid4().hex
    code, body = s.call(
        "POST",
        "/v1/tasks",
        {"resource": "team-a/one", **CMD},
        token,
        headers={"Idempotency-Key": key},
        timeout=10,
    )
    return code, body, key


def _submitted_ids(s: Server) -> list[str]:
    out: list[str] = []
    seq = 0
    while True:
        page = s.ok("GET", f"/v1/events?since={seq}&limit=1000")
        if not page["events"]:
            return out
        out += [e["task"] for e in page["events"] if e["kind"] == "submitted"]
        seq = page["events"][-1]["seq"]


def _check_exactly_once(s: Server, accepted: list[str]) -> None:
    ids = _submitted_ids(s)
    assert len(ids) == len(set(ids)), "a submission was logged twice"
    assert set(accepted) <= set(ids), "an acknowledged submission was lost"
    tasks = {t["id"] for t in all_tasks(s)}
    assert set(ids) == tasks, "the log and the State disagree"


@pytest.fixture
def small_fs(tmp_path: Path):
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs (a disk that fills) needs root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(where: Path) -> Path:
    filler = where / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    return filler


def test_full_disk_refuses_writes_serves_reads_and_recovers(tmp_path: Path, small_fs: Path) -> None:
    s = Server(tmp_path, db=small_fs / "kliqued.duckdb").start()
    try:
        bob = s.token({"user": "bob"})
        accepted = [b["id"] for c, b, _ in (_submit(s, bob) for _ in range(5)) if c == 201]
        assert len(accepted) == 5
        filler = _fill(small_fs)
        codes = []
        refused = None
        for _ in range(40):  # the WAL has some room left: a few may still go through
            code, body, _ = _submit(s, bob)
            codes.append(code)
            if code == 201:
                accepted.append(body["id"])
            else:
                refused = (code, body)
                break
        assert refused is not None, f"never refused on a full disk: {codes}"
        code, body = refused
        assert code == 507, refused
        assert body["error"]["code"] == "insufficient-storage"
        assert "No space left on device" in body["error"]["message"]
        status, _, raw = _raw(s, "POST", "/v1/tasks", bob)
        assert status == 507 and raw.get("Retry-After") == "2"
        health = s.ok("GET", "/v1/health", token=None)
        assert health["status"] == "degraded"
        assert health["degraded"].startswith("store unavailable (disk full under")
        assert s.ok("GET", f"/v1/tasks/{accepted[0]}", token=bob)["id"] == accepted[0]
        metrics = s.ok("GET", "/metrics")
        assert 'klique_store_unavailable{kind="disk-full"} 1.0' in metrics
        time.sleep(2.5)  # a retry or two on a still-full disk
        assert s.proc is not None and s.proc.poll() is None, s.log()
        filler.unlink()
        wait_for(
            lambda: s.ok("GET", "/v1/health", token=None)["status"] == "ok",
            15,
            "the daemon to see the space back",
        )
        code, body, _ = _submit(s, bob)
        assert code == 201, body
        accepted.append(body["id"])
        _check_exactly_once(s, accepted)
        assert "Traceback" not in s.log()
    finally:
        s.stop()
    # a start on a disk already full: one line, no traceback
    filler = _fill(small_fs)
    start = len(s.log())
    s.start(wait=False)
    assert s.proc is not None
    code = s.proc.wait(60)
    out = s.log()[start:]
    assert code != 0, out
    assert "Traceback" not in out, out
    lines = [ln for ln in out.splitlines() if "error" in ln]
    assert any("kliqued serve: error: the disk under" in ln and "is full" in ln for ln in lines), (
        out
    )
    filler.unlink()


def _raw(s: Server, method: str, path: str, token: str) -> tuple[int, Any, dict[str, str]]:
    import json
    import urllib.error
    import urllib.request

    req = urllib.request.Request(
        s.url + path, data=json.dumps({"resource": "team-a/one", **CMD}).encode(), method=method
    )
    req.add_header("Content-Type", "application/json")
    req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, None, dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


def test_postgresql_outage_refuses_writes_serves_reads_and_reconnects(tmp_path: Path) -> None:
    from tests.harness.postgres import Postgres, unavailable

    why = unavailable()
    if why:
        pytest.skip(why)
    pg = Postgres().start()
    s = Server(tmp_path, db=pg.createdb("outage"))
    try:
        s.start()
        bob = s.token({"user": "bob"})
        accepted: list[str] = []
        refused: list[str] = []  # idempotency keys of the refused submissions
        for _ in range(5):
            code, body, _ = _submit(s, bob)
            assert code == 201, body
            accepted.append(body["id"])
        pg.pause()
        codes = []
        t_end = time.monotonic() + 10  # a trickle of submissions while it is away
        while time.monotonic() < t_end:
            code, body, key = _submit(s, bob)
            codes.append(code)
            if code == 201:
                accepted.append(body["id"])
            else:
                assert code == 503, body
                assert body["error"]["code"] in ("store-unavailable", "unavailable"), body
                refused.append(key)
            # reads answer from memory meanwhile
            assert s.ok("GET", f"/v1/tasks/{accepted[0]}", token=bob)["id"] == accepted[0]
            time.sleep(0.3)
        assert refused, codes
        assert s.ok("GET", "/v1/health", token=None)["status"] == "degraded"
        assert s.proc is not None and s.proc.poll() is None, s.log()
        pg.resume()

        def accepts() -> bool:
            code, body, _ = _submit(s, bob)
            if code == 201:
                accepted.append(body["id"])
            return code == 201

        wait_for(accepts, 20, "writes to work again")
        assert s.ok("GET", "/v1/health", token=None)["status"] == "ok"
        code, body, _ = _submit(s, bob)
        assert code == 201, body
        accepted.append(body["id"])
        _check_exactly_once(s, accepted)
        assert sorted(_submitted_ids(s)) == sorted(accepted), "a refused one was logged"
        assert s.proc.poll() is None, s.log()
    finally:
        if s.proc is not None:
            s.stop()
        pg.stop()
