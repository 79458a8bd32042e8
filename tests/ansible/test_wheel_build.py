"""Two rollouts from one checkout at once each get their wheel (a fresh-clone `make test`
under xdist met `File exists: build/bdist...` from two builds in the tree's build/)."""

from __future__ import annotations

import threading
import zipfile
from pathlib import Path

import pytest

from workers.errors import RolloutError
from workers.rollout import build_wheel, source_tree

pytestmark = pytest.mark.skipif(source_tree() is None, reason="klique not installed from a tree")


def test_two_wheel_builds_at_once_both_succeed(tmp_path: Path) -> None:
    results: dict[int, Path | Exception] = {}

    def build(n: int) -> None:
        try:
            results[n] = build_wheel(tmp_path / f"dist{n}")
        except RolloutError as exc:
            results[n] = exc

    threads = [threading.Thread(target=build, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert sorted(results) == [0, 1]
    wheels = [results[0], results[1]]
    assert all(isinstance(w, Path) for w in wheels), wheels
    for w in wheels:
        assert isinstance(w, Path)
        with zipfile.ZipFile(w) as z:
            assert "workers/rollout.py" in z.namelist()
