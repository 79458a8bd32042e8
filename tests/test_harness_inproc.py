"""The in-process harness (tests/harness/inproc.py) is the daemon ``kliqued serve`` runs, its
clock is the test's, and its stop leaves nothing behind: what the tests moved onto it rely on."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from tests.harness.inproc import InProcServer


def _open_under(root: Path) -> list[str]:
    """This process's open files under ``root`` (/proc/self/fd)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(root)):
            found.append(target)
    return found


def test_a_step_is_time_passing_for_the_daemon(tmp_path: Path) -> None:
    """A token made to last an hour is refused once the test steps an hour and a second:
    no sleep, and no clock step (the daemon's time moved on both clocks together)."""
    s = InProcServer(tmp_path).start()
    try:
        made = s.ok("POST", "/v1/tokens", {"user": "alice", "expires_in": "1h"}, expect=201)
        assert s.call("GET", "/v1/whoami", token=made["token"])[0] == 200
        s.step(3599)
        assert s.call("GET", "/v1/whoami", token=made["token"])[0] == 200
        s.step(2)
        status, body = s.call("GET", "/v1/whoami", token=made["token"])
        assert status == 401 and "expired" in str(body), body
        metrics = s.call("GET", "/metrics")[1]
        assert 'klique_clock_steps_total{direction="forward"} 0' in metrics, metrics[:2000]
    finally:
        assert s.stop() == 0, s.log()


def test_it_is_kliqued_serve_with_its_dashboard_and_log(tmp_path: Path) -> None:
    s = InProcServer(tmp_path).start()
    try:
        status, page = s.call("GET", "/", token=None)
        assert status == 200 and "<html" in page.lower(), page[:300]  # the dashboard
        doc = s.ok("GET", "/v1/openapi.json", token=None)
        assert doc["servers"] == [{"url": s.url}]
        assert s.proc is not None and s.proc.poll() is None
    finally:
        assert s.stop() == 0
    assert f"serving on {s.url}" in s.log()
    assert s.proc.poll() == 0


def test_a_stop_leaves_no_thread_or_file_and_a_restart_replays(tmp_path: Path) -> None:
    before = {t.ident for t in threading.enumerate()}
    s = InProcServer(tmp_path).start()
    made = s.token({"user": "bob"})
    assert _open_under(tmp_path)  # the database is open while it runs
    assert s.stop() == 0
    assert {t.ident for t in threading.enumerate()} <= before
    assert _open_under(tmp_path) == []
    s.start()  # the same file, replayed: the token made before the stop works
    try:
        assert s.ok("GET", "/v1/whoami", token=made)["name"] == "bob"
    finally:
        assert s.stop() == 0
    assert {t.ident for t in threading.enumerate()} <= before
    assert _open_under(tmp_path) == []
