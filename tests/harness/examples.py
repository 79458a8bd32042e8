"""Hypothesis's example counts under the two profiles the root conftest registers.

``ci`` (the default, and what ``make test`` uses) keeps every count exactly as written;
``dev`` (``HYPOTHESIS_PROFILE=dev``, what ``make check`` uses) caps them, so the property
tests still run every strategy and assertion in the quick loop, on fewer examples. A test's
explicit ``@settings(max_examples=N)`` overrides the profile, hence :func:`examples`:
``@settings(max_examples=examples(300))``.
"""

from __future__ import annotations

import os

PROFILE_VAR = "HYPOTHESIS_PROFILE"
PROFILES = ("ci", "dev")
DEV_MAX = 15
"""The most examples a property runs under ``dev``."""


def profile() -> str:
    name = os.environ.get(PROFILE_VAR) or "ci"
    if name not in PROFILES:
        raise ValueError(f"{PROFILE_VAR}={name!r}: the profiles are {', '.join(PROFILES)}")
    return name


def examples(n: int) -> int:
    """``n`` under ``ci``; at most :data:`DEV_MAX` under ``dev``."""
    return n if profile() == "ci" else min(n, DEV_MAX)
