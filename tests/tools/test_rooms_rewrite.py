"""tools/rooms_rewrite.py: old flat daemon modules to their rooms (issue 27, item 1), as the
lead runs it on branches made before the move. Each rewrite, and that a second run changes
nothing."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "rooms_rewrite.py"


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("rooms_rewrite", TOOL)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["rooms_rewrite"] = mod
    spec.loader.exec_module(mod)
    return mod


R = _tool()

CASES = [
    # (file it is in, old text, new text)
    (
        None,
        "from kliqued.daemon.store import Store\n",
        "from kliqued.daemon.storage.store import Store\n",
    ),
    (
        None,
        "from kliqued.daemon import store, history, events\n",
        "from kliqued.daemon import events\nfrom kliqued.daemon.state import history\n"
        "from kliqued.daemon.storage import store\n",
    ),
    (
        None,
        "from kliqued.daemon.core import Daemon, Prepared\n",
        "from kliqued.daemon.state.daemon import Daemon\n"
        "from kliqued.daemon.state.prepared import Prepared\n",
    ),
    (
        None,
        "from kliqued.daemon.fleet import prepare_lease\n",
        "from kliqued.daemon.fleet.workers import prepare_lease\n",
    ),
    (
        None,
        "from kliqued.daemon import fleet, gang\n",
        "from kliqued.daemon.fleet import workers as fleet, gang\n",
    ),
    (
        None,
        'monkeypatch.setattr("kliqued.daemon.store.time", fake)\n',
        'monkeypatch.setattr("kliqued.daemon.storage.store.time", fake)\n',
    ),
    (
        None,
        "python -m kliqued.daemon.handlers.tasks; kliqued/daemon/handlers/tasks.py\n",
        "python -m kliqued.daemon.api.handlers.tasks; kliqued/daemon/api/handlers/tasks.py\n",
    ),
    (
        None,
        "see kliqued/daemon/fleet.py and kliqued/daemon/lease.py\n",
        "see kliqued/daemon/fleet/workers.py and kliqued/daemon/ha/lease.py\n",
    ),
    (
        None,
        "from kliqued.daemon.handlers import agents, tasks\n",
        "from kliqued.daemon.api.agents import routes as agents\n"
        "from kliqued.daemon.api.handlers import tasks\n",
    ),
    (
        None,
        "from kliqued.daemon.cloud import CloudBook, prepare_started\n",
        "from kliqued.daemon.fleet.cloud import prepare_started\n"
        "from kliqued.daemon.state.cloud import CloudBook\n",
    ),
    (
        Path("kliqued/daemon/loop.py"),
        "from .core import Daemon\nfrom .errors import ApiError\n",
        "from kliqued.daemon.state.daemon import Daemon\nfrom kliqued.daemon.errors import ApiError\n",
    ),
    (
        Path("kliqued/daemon/handlers/tasks.py"),
        "from .. import history\nfrom . import params\n",
        "from kliqued.daemon.state import history\nfrom kliqued.daemon.api.handlers import params\n",
    ),
    (
        None,
        'forbidden_modules = ["kliqued.daemon.fleet", "kliqued.daemon.api"]\n',
        'forbidden_modules = ["kliqued.daemon.fleet", "kliqued.daemon.api"]\n',
    ),
]


@pytest.mark.parametrize("rel,old,new", CASES)
def test_each_reference_moves_to_its_room_once(rel: Path | None, old: str, new: str) -> None:
    once = R.rewrite(old, rel)
    assert once == new
    assert R.rewrite(once, rel) == once  # idempotent: the lead may run it again


def test_every_old_module_has_one_room() -> None:
    seen = [m for ms in R.ROOMS.values() for m in ms]
    assert len(seen) == len(set(seen))
    assert set(R.TABLE) == set(seen) | {"fleet"}
