"""What ``kliqued schedule`` and ``kliqued pipeline`` share: ``--param KEY=VALUE`` and a
refusal that lists several problems one per line (``file:line:col: ...``)."""

from __future__ import annotations

import argparse
import sys

from kliqued.sdk import KliqueError


def params(pairs: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"--param {pair!r}: expected KEY=VALUE")
        out[key] = value
    return out


def show_refusal(exc: KliqueError) -> int:
    """A refusal with ``details.errors``: each on its own line; exit 1."""
    errors = exc.details.get("errors") if isinstance(exc.details, dict) else None
    if isinstance(errors, list) and errors:
        for e in errors:
            print(f"kliqued: {e}", file=sys.stderr)
        return 1
    print(f"kliqued: {exc.message}", file=sys.stderr)
    return 1
