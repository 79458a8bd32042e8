"""The layers at run time: what a process loads when it imports one side. The static check
is ``lint-imports`` (the contracts in pyproject.toml, run by ``make test``); this checks the
reason for them: a worker host does not load the compiler, the daemon or the engine."""

from __future__ import annotations

import json
import subprocess
import sys

_LOADED = """
import json, sys
for m in sys.argv[1:]:
    __import__(m)
print(json.dumps(sorted({n.split('.')[0] + ('.' + n.split('.')[1] if n.startswith('kliqued.')
                         and '.' in n else '') for n in sys.modules})))
"""


def _loaded(*modules: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", _LOADED, *modules], capture_output=True, text=True, check=True
    )
    return set(json.loads(out.stdout))


def test_a_worker_host_loads_neither_compiler_nor_daemon_nor_engine() -> None:
    loaded = _loaded(
        "workers.cli",
        "workers.daemon",
        "workers.state",
        "workers.autoscaler.providers",
        "workers.autoscaler.loop",
        "workers.executors.process",
        "workers.executors.container",
    )
    assert "workers" in loaded and "klique_util" in loaded
    assert not loaded & {
        "compiler",
        "kliqued.commands",
        "kliqued.daemon",
        "kliqued.engine",
        "kliqued.sim",
        "kliqued.ledger",
        "pydantic",
        "duckdb",
        "ruamel",
    }


def test_klique_util_loads_nothing_of_klique() -> None:
    loaded = _loaded(
        "klique_util.units",
        "klique_util.files",
        "klique_util.filemodes",
        "klique_util.fmt",
        "klique_util.cli",
    )
    assert not loaded & {"compiler", "kliqued", "workers"}
