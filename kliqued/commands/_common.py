"""What several subcommands share: subparsers with examples, diagnostics output. (The help
formatter and ``write_atomic`` are in ``klique_util``: ``klique-worker`` uses them too.)"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from klique_util.cli import HelpFormatter

if TYPE_CHECKING:  # the compiler is imported by the commands that print diagnostics only,
    from compiler.diagnostics import Diagnostic  # so that client commands start fast

DEFAULT_ESTATE = "estate"


def positive_int(text: str) -> int:
    """An argparse type: a whole number of 1 or more, refused with the value it was given."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return int(text)


def add_command(subparsers, name: str, help: str, description: str, examples: str):
    return subparsers.add_parser(
        name,
        help=help,
        description=description,
        epilog="examples:\n" + examples.rstrip() + "\n",
        formatter_class=HelpFormatter,
    )


def github_annotation(d: Diagnostic) -> str:
    """One workflow command per diagnostic; the same text ``kliqued plan --format github``
    writes, so CI shows validate and plan findings alike."""
    from compiler.plan.render_github import diagnostic_annotation

    return diagnostic_annotation(d)


def print_diagnostics(diags: list[Diagnostic], fmt: str = "text", stream=None) -> None:
    from compiler.diagnostics import render_all

    stream = stream or sys.stdout
    if fmt == "json":
        errors = sum(d.is_error for d in diags)
        json.dump(
            {
                "errors": errors,
                "warnings": len(diags) - errors,
                "diagnostics": [d.to_json() for d in diags],
            },
            stream,
            indent=2,
        )
        stream.write("\n")
    elif fmt == "github":
        for d in diags:
            stream.write(github_annotation(d) + "\n")
    else:
        stream.write(render_all(diags) + "\n")
