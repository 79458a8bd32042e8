"""A worker says which session apps it can start (issue 32): the apps whose program its tasks
find on their PATH when it starts (the process executor: its virtual env's ``bin`` first), or
those ``--session-apps`` names; a real ``klique-worker`` registers them with a real daemon."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from klique_util import session_apps
from tests.daemon.fleet import ESTATE, RealWorker, write_estate
from tests.harness.inproc import InProcServer
from tests.harness.wait import wait_for
from workers.cli import _apps


def program(where: Path, name: str, executable: bool = True) -> None:
    where.mkdir(parents=True, exist_ok=True)
    f = where / name
    f.write_text("#!/bin/sh\nexit 0\n")
    f.chmod(0o755 if executable else 0o644)


def test_an_app_is_found_by_its_program_on_the_path(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    program(a, "ttyd")
    program(b, "jupyter-lab", executable=False)  # not executable: not there
    program(b, "jupyter")  # jupyter alone may lack JupyterLab
    assert session_apps.detect(f"{a}:{b}") == ["shell"]
    program(b, "jupyter-lab")
    program(b, "code-server")
    assert session_apps.detect(f"{a}:{b}") == ["jupyter", "shell", "vscode"]
    assert session_apps.detect(str(tmp_path / "none")) == []
    assert stat.S_IMODE((b / "code-server").stat().st_mode) == 0o755


def test_session_apps_flag_names_known_apps_or_none() -> None:
    assert _apps(None) is None
    assert _apps("none") == []
    assert _apps("shell, jupyter,shell") == ["jupyter", "shell"]
    err = _apps("jupyter,rstudio")
    assert isinstance(err, str) and "unknown app rstudio" in err and "vscode" in err


@pytest.mark.parametrize(
    ("extra", "want"),
    [([], ["shell"]), (["--session-apps", "jupyter"], ["jupyter"])],
)  # the system's PATH follows the env's: it may add vscode, never remove shell
def test_a_real_worker_registers_the_apps_it_can_start(
    tmp_path: Path, extra: list[str], want: list[str]
) -> None:
    venv = tmp_path / "venv"
    program(venv / "bin", "ttyd")  # its tasks' PATH: this env's bin first
    s = InProcServer(tmp_path, estate=write_estate(tmp_path / "estate", ESTATE), workers=True)
    s.start()
    w = RealWorker(
        s,
        s.token({"worker": True, "pool": "bare"}),
        tmp_path / "w1",
        extra=["--venv", str(venv), *extra],
    )
    try:
        w.start()
        workers = wait_for(
            lambda: s.ok("GET", "/v1/workers")["workers"], 30, "the worker registered"
        )
        apps = workers[0]["apps"]
        if extra:
            assert apps == want, (apps, w.stderr())
        else:  # the fake env's ttyd; not the suite's own JupyterLab (--venv comes first)
            assert "shell" in apps and "jupyter" not in apps, (apps, w.stderr())
    finally:
        w.stop()
        assert s.stop() == 0, s.log()
