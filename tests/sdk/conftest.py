"""A real `kliqued serve` for the SDK and CLI tests (the one harness, tests/harness/daemon.py):
a subprocess on a free loopback port with a temporary database and the repo's estate/; user and
finance tokens created through POST /v1/tokens. One server for the whole session (2 cores)."""

from __future__ import annotations

from collections.abc import Iterator
import pytest

from kliqued.cli import main

from tests.harness.daemon import EXAMPLE_ESTATE, Server, free_port  # noqa: F401 (old path)
from tests.harness.inproc import InProcServer


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> Iterator[Server]:
    srv = InProcServer(tmp_path_factory.mktemp("kliqued"), estate=EXAMPLE_ESTATE).start()
    yield srv
    code = srv.stop()
    assert code == 0, srv.log()


@pytest.fixture
def no_klique_env(monkeypatch, tmp_path):
    """No KLIQUE_* variables and no config file, whatever the developer's shell has."""
    for name in ("KLIQUE_URL", "KLIQUE_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KLIQUE_CONFIG", str(tmp_path / "absent.yaml"))


@pytest.fixture
def run(capsys):
    """`kliqued ARGV...` in-process: (exit code, stdout, stderr)."""

    def call(argv):
        capsys.readouterr()
        rc = main(list(argv))
        out, err = capsys.readouterr()
        return rc, out, err

    return call


@pytest.fixture
def as_user(server, monkeypatch, no_klique_env, run):
    """Runs `kliqued ...` in-process as a principal (KLIQUE_URL and KLIQUE_TOKEN set)."""
    monkeypatch.setenv("KLIQUE_URL", server.url)

    def call(who: str, *argv: str):
        monkeypatch.setenv("KLIQUE_TOKEN", server.token(who))
        return run(argv)

    return call
