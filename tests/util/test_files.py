"""klique_util.files: the one atomic write every writer uses."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from klique_util.files import atomic_path, scratch_path, write_atomic


def _listing(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


def test_write_atomic_replaces_and_leaves_nothing_else(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "out.json"
    write_atomic(target, "one\n")  # creates the missing directory
    write_atomic(target, b"two\n", fsync=False)
    assert target.read_bytes() == b"two\n"
    assert _listing(target.parent) == ["out.json"]
    assert target.stat().st_mode & 0o777 == 0o600  # mkstemp's mode, whatever the umask


def test_a_failed_write_keeps_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    write_atomic(target, "old")
    with pytest.raises(TypeError):
        write_atomic(target, 42)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        Path(tmp).write_text("half")
        raise RuntimeError("the writer broke off")
    assert target.read_text() == "old"
    assert _listing(tmp_path) == ["out.txt"]


def test_without_mkdir_a_missing_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_atomic(tmp_path / "missing" / "f", "x", mkdir=False)
    assert not (tmp_path / "missing").exists()


def test_atomic_path_keeps_the_suffix_and_hides_the_temporary(tmp_path: Path) -> None:
    target = tmp_path / "rows.parquet"
    with atomic_path(target, suffix=".parquet") as tmp:
        assert tmp.endswith(".parquet") and os.path.basename(tmp).startswith(".rows.parquet.")
        assert os.path.dirname(tmp) == str(tmp_path)  # same file system: the rename is atomic
        Path(tmp).write_text("data")
        assert not target.exists()  # nobody sees it before the end
    assert target.read_text() == "data"


def test_scratch_path_is_removed_whatever_happens(tmp_path: Path) -> None:
    with scratch_path(tmp_path / "x.csv", suffix=".csv") as tmp:
        Path(tmp).write_text("a,b\n")
    assert _listing(tmp_path) == []
    with pytest.raises(ValueError), scratch_path(tmp_path / "x.csv") as tmp:
        raise ValueError
    assert _listing(tmp_path) == []
