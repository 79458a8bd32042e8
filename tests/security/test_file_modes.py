"""Finding 14 of issue 9: what holds commands, tokens or logs is private to the user running
Klique (files 0600, directories 0700), whatever the umask it was started with; tasks still get
that umask; plain HTTP on a non-loopback address is warned about once.

A real ``kliqued serve`` and a real ``klique-worker`` running a task, both started with umask
022 (the usual default, under which they used to write 0644 files).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from klique_util import filemodes
from tests.daemon.fleet import PY, FleetServer, RealWorker, kill_pids_in
from tests.harness.wait import wait_for


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _assert_private(paths: list[Path]) -> None:
    wrong = {str(p): oct(_mode(p)) for p in paths if _mode(p) != (0o700 if p.is_dir() else 0o600)}
    assert not wrong, f"not private (want files 0600, dirs 0700): {wrong}"


def test_daemon_and_worker_files_are_private(tmp_path: Path, umask_022) -> None:
    s = FleetServer(tmp_path / "d").start()
    worker = None
    try:
        wt = s.token({"worker": True, "pool": "bare"})
        erin = s.token({"user": "erin"})
        worker = RealWorker(s, wt, tmp_path / "w").start()
        tid = s.submit(
            erin, "team-b/one", [PY, "-c", "import os; print('umask', oct(os.umask(0)))"]
        )
        wait_for(lambda: s.task(tid)["state"] == "ended", 30, "the task to end")
        wait_for(
            lambda: "umask" in (s.call("GET", f"/v1/tasks/{tid}/log")[1] or ""),
            10,
            "the task's log to come back",
        )
        log_text = s.call("GET", f"/v1/tasks/{tid}/log")[1]
        assert "umask 0o22" in log_text, f"the task did not get the worker's umask: {log_text}"
        # the daemon: database, WAL, task logs
        db = Path(s.db)
        daemon_files = [db, *Path(f"{db}.logs").rglob("*"), Path(f"{db}.logs")]
        if Path(f"{db}.wal").exists():
            daemon_files.append(Path(f"{db}.wal"))
        assert any(p.name.endswith(".log") for p in daemon_files), daemon_files
        _assert_private(daemon_files)
        # the worker: its state dir's records, logs, id and lock
        state = tmp_path / "w"
        worker_files = list(state.rglob("*"))
        assert any(p.suffix == ".log" for p in worker_files), worker_files
        _assert_private(worker_files + [state])
    finally:
        if worker is not None:
            worker.stop()
            kill_pids_in(list((tmp_path / "w").rglob("*.json")))
        assert s.stop() == 0, s.log()
    assert "plain HTTP" not in s.log()  # loopback: nothing to warn about


def test_a_database_made_0644_by_an_older_version_is_tightened(tmp_path: Path, umask_022) -> None:
    s = FleetServer(tmp_path).start()
    s.token({"user": "erin"})
    assert s.stop() == 0
    os.chmod(s.db, 0o644)
    s.start()
    try:
        assert _mode(Path(s.db)) == 0o600
    finally:
        assert s.stop() == 0, s.log()


def test_plain_http_on_a_non_loopback_address_is_warned_about_once(tmp_path: Path) -> None:
    s = FleetServer(tmp_path)
    s.extra += ["--listen", f"0.0.0.0:{s.port}"]
    s.start()
    assert s.stop() == 0, s.log()
    text = s.log()
    assert text.count("plain HTTP") == 1, text
    assert "--tls-cert" in text


def test_private_dir_leaves_a_given_shared_directory_alone(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # like /tmp
    filemodes.private_dir(shared / "mine")
    assert _mode(shared) == 0o1777
    assert _mode(shared / "mine") == 0o700
