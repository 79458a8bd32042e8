"""The tests' one way to wait for something that happens in another process or thread: poll a
predicate until it holds, and fail with what was awaited (never a bare sleep that hopes).

``wait_for`` returns the predicate's first truthy value, so a test can wait for and use a
result in one step (``task = wait_for(lambda: placed(t), what="placement")``).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Callable, TypeVar

T = TypeVar("T")

EVERY_S = 0.05
"""Between two checks: short next to a test's timeouts, long enough not to load 2 cores."""


Awaited = str | Callable[[], object]
"""What a wait is for: a text, or a function whose value at the deadline the error shows (a
task's view, so a failure says where the task was)."""


def _timed_out(timeout: float, what: Awaited) -> AssertionError:
    shown = what() if callable(what) else what
    return AssertionError(f"timed out after {timeout:g} s waiting for {shown}")


def wait_for(
    pred: Callable[[], T | None],
    timeout: float = 10.0,
    what: Awaited = "condition",
    every: float = EVERY_S,
) -> T:
    """Calls ``pred`` until it returns something truthy and returns that; AssertionError
    naming ``what`` once ``timeout`` seconds have passed. ``pred`` runs at least once, and
    once more at the deadline, so a slow check is never cut short."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise _timed_out(timeout, what)
        time.sleep(every)


async def wait_for_async(
    pred: Callable[[], T | None],
    timeout: float = 10.0,
    what: Awaited = "condition",
    every: float = EVERY_S,
) -> T:
    """``wait_for`` inside a coroutine: sleeps with ``asyncio.sleep`` so that the event loop
    (an executor's subprocess watchers) runs between checks."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise _timed_out(timeout, what)
        await asyncio.sleep(every)


def wait_for_text(path: Path, text: str, timeout: float = 20.0) -> str:
    """Waits until the file at ``path`` contains ``text``; returns the file's text. The
    error shows what the file had."""

    def has() -> str | None:
        body = path.read_text(errors="replace") if path.exists() else ""
        return body if text in body else None

    try:
        return wait_for(has, timeout, f"{text!r} in {path}")
    except AssertionError as exc:
        body = path.read_text(errors="replace") if path.exists() else "(no file)"
        raise AssertionError(f"{exc}; it has:\n{body[-2000:]}") from None
