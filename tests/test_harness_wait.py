"""The tests' one polling helper (tests/harness/wait.py): what every test's waiting relies on."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from tests.harness.wait import wait_for, wait_for_async, wait_for_text


def test_returns_the_first_truthy_value() -> None:
    calls = itertools.count()
    assert wait_for(lambda: (n := next(calls)) >= 3 and n, 5, every=0.001) == 3


def test_a_timeout_fails_naming_what_was_awaited_after_a_last_check() -> None:
    calls = itertools.count()
    with pytest.raises(AssertionError, match=r"timed out after 0.05 s waiting for the thing"):
        wait_for(lambda: next(calls) < 0, 0.05, "the thing", every=0.01)
    assert next(calls) >= 3


def test_an_error_in_the_predicate_is_not_swallowed() -> None:
    with pytest.raises(ZeroDivisionError):
        wait_for(lambda: 1 / 0, 1)


def test_the_async_variant_lets_the_loop_run_between_checks() -> None:
    async def main() -> str:
        box: list[str] = []
        asyncio.get_running_loop().call_later(0.02, box.append, "done")
        return await wait_for_async(lambda: box[0] if box else None, 5, "the callback", every=0.005)

    assert asyncio.run(main()) == "done"


def test_text_in_a_file_and_what_the_file_had_on_failure(tmp_path) -> None:
    path = tmp_path / "log"
    path.write_text("starting\nready\n")
    assert "ready" in wait_for_text(path, "ready", 1)
    with pytest.raises(AssertionError, match=r"(?s)'never' in .*it has:\nstarting"):
        wait_for_text(path, "never", 0.05)
