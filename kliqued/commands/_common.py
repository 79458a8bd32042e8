"""What several subcommands share: argparse formatting, atomic writes, diagnostics output."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from compiler.diagnostics import Diagnostic, render_all
from compiler.plan.render_github import diagnostic_annotation

DEFAULT_ESTATE = "estate"


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the examples in each epilog as written."""


def add_command(subparsers, name: str, help: str, description: str, examples: str):
    return subparsers.add_parser(
        name, help=help, description=description,
        epilog="examples:\n" + examples.rstrip() + "\n", formatter_class=HelpFormatter)


def write_atomic(path: str | Path, text: str) -> None:
    """Writes through a temporary file and a rename, so a reader never sees half a file and a
    failed run leaves the previous file untouched."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def github_annotation(d: Diagnostic) -> str:
    """One workflow command per diagnostic; the same text ``kliqued plan --format github``
    writes, so CI shows validate and plan findings alike."""
    return diagnostic_annotation(d)


def print_diagnostics(diags: list[Diagnostic], fmt: str = "text", stream=None) -> None:
    stream = stream or sys.stdout
    if fmt == "json":
        errors = sum(d.is_error for d in diags)
        json.dump({"errors": errors, "warnings": len(diags) - errors,
                   "diagnostics": [d.to_json() for d in diags]}, stream, indent=2)
        stream.write("\n")
    elif fmt == "github":
        for d in diags:
            stream.write(github_annotation(d) + "\n")
    else:
        stream.write(render_all(diags) + "\n")
