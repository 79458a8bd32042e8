"""Every module logs to its own logger (``logging.getLogger(__name__)``), so that one
module's level can be set, and the parents (``kliqued``, ``workers``) still configure all."""

from __future__ import annotations

import logging
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAMED = re.compile(r"""logging\.getLogger\(\s*["']([^"']*)["']\s*\)""")
# the daemon's log set-up configures the parent of every module logger, by name
PARENTS_CONFIGURED = {("kliqued/daemon/logsetup.py", "kliqued")}


def test_no_module_logs_to_a_shared_named_logger() -> None:
    found = []
    for package in ("compiler", "kliqued", "workers"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for name in NAMED.findall(path.read_text(encoding="utf-8")):
                if (rel, name) not in PARENTS_CONFIGURED:
                    found.append(f"{rel}: getLogger({name!r})")
    assert not found, "use logging.getLogger(__name__):\n" + "\n".join(found)


class _Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.names.append(record.name)


def test_the_parent_level_reaches_every_module_and_one_module_can_be_quieter() -> None:
    from kliqued.daemon.state import core, gitops
    from workers import daemon as worker_daemon

    keep = _Keep()
    parents = [logging.getLogger("kliqued"), logging.getLogger("workers")]
    before = [p.level for p in parents]
    for p in parents:
        p.addHandler(keep)
        p.setLevel(logging.INFO)
    gitops.log.setLevel(logging.WARNING)
    try:
        core.log.info("core line")
        gitops.log.info("gitops line")  # quieter on its own
        worker_daemon.log.info("worker line")
        assert keep.names == ["kliqued.daemon.state.core", "workers.daemon"]
    finally:
        gitops.log.setLevel(logging.NOTSET)
        for p, level in zip(parents, before):
            p.removeHandler(keep)
            p.setLevel(level)


def test_client_driven_lines_are_still_the_ones_the_flood_filter_holds_back() -> None:
    from kliqued.daemon import listener, logsetup

    assert listener.log.name in logsetup.FLOOD_PRONE
