"""Narrowing for the tests, which mypy checks at its default level (issue 27, item 4).

A test often reads through a value that may be None by its type and that the test expects to
be there (``res.estate.pool("gpu").capacity_milli``): ``present`` says so where it reads, and
fails the test with an AssertionError (rather than an AttributeError) when it is None.
"""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def present(value: T | None) -> T:
    """``value``, which the test expects not to be None (an AssertionError if it is)."""
    assert value is not None, "expected a value, found None"
    return value
