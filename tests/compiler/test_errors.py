"""The compiler's exceptions: one base (CompileError) for inputs it cannot read at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from compiler.api import read_dir
from compiler.errors import CompileError, EstateReadError, GitSourceError, LiveStateError
from compiler.plan.gitsource import open_repo
from compiler.plan.live import parse_live_state


def test_a_missing_estate_path_is_a_compile_error_with_its_message(tmp_path: Path) -> None:
    with pytest.raises(EstateReadError, match="no such file or directory") as info:
        read_dir(tmp_path / "missing")
    assert isinstance(info.value, CompileError)


def test_a_directory_outside_git_is_a_compile_error(tmp_path: Path) -> None:
    with pytest.raises(GitSourceError, match="is not in a git repository") as info:
        open_repo(tmp_path)
    assert isinstance(info.value, CompileError)


def test_a_live_state_of_the_wrong_shape_is_a_compile_error_and_a_value_error() -> None:
    with pytest.raises(LiveStateError, match="expected a JSON object") as info:
        parse_live_state([], "test")
    assert isinstance(info.value, CompileError) and isinstance(info.value, ValueError)


def test_the_old_import_places_still_name_the_same_classes() -> None:
    from compiler.api import EstateReadError as from_api
    from compiler.plan.gitsource import GitSourceError as from_git
    from compiler.plan.live import LiveStateError as from_live

    assert (from_api, from_git, from_live) == (EstateReadError, GitSourceError, LiveStateError)
