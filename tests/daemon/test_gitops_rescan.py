"""The estate directory's watch also looks every ``rescan_ms`` with no event (CI, stop 33: a
``pricing.yaml`` written just after ``kliqued serve`` was ready was never applied, because the
write landed before the inotify watch took hold and no later event came). In process: the
real watchfiles watch on a real directory, no daemon."""

from __future__ import annotations

import asyncio
from pathlib import Path

from kliqued.daemon.state.gitops import DirSource
from tests.daemon.fleet import ESTATE, write_estate


def test_a_change_made_before_the_watch_holds_is_seen_by_the_rescan(tmp_path: Path) -> None:
    root = write_estate(tmp_path / "estate")
    src = DirSource(str(root), debounce_ms=50, rescan_ms=300)
    first = src.read()
    assert first.result.estate is not None
    # the edit lands before anything watches: no file event will ever report it
    (root / "pricing.yaml").write_text(
        ESTATE["pricing.yaml"].replace("per_gpu_hour: 1.0", "per_gpu_hour: 1.2")
    )

    async def first_look() -> str:
        stop = asyncio.Event()
        async for _ in src.changes(stop):
            stop.set()
            return src.read().key
        raise AssertionError("the watch ended without a look")

    key = asyncio.run(asyncio.wait_for(first_look(), 10))
    assert key != first.key  # the rescan saw the edit made before the watch


def test_an_unchanged_directory_is_not_compiled_again(tmp_path: Path) -> None:
    root = write_estate(tmp_path / "estate")
    src = DirSource(str(root))
    a = src.read()
    assert src.read() is a  # same digest: the cached snapshot, no second compile
    (root / "pricing.yaml").write_text(
        ESTATE["pricing.yaml"].replace("per_gpu_hour: 1.0", "per_gpu_hour: 1.5")
    )
    b = src.read()
    assert b is not a and b.key != a.key
