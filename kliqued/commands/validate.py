"""``kliqued validate``: every error and warning of an estate, with its place."""

from __future__ import annotations

import argparse

from compiler.api import compile_dir
from compiler.diagnostics import plural

from ._common import DEFAULT_ESTATE, add_command, print_diagnostics


def register(subparsers) -> None:
    p = add_command(
        subparsers,
        "validate",
        help="check an estate and report every problem",
        description="Checks an estate directory against estate.md and prints every error and "
        "warning as file:line:col: severity[code]: message. Exit 0 when valid "
        "(warnings allowed), 1 when not.",
        examples="  kliqued validate                 # the estate/ directory\n"
        "  kliqued validate --strict estate # warnings fail too (for CI)\n"
        "  kliqued validate --format github # annotations in a GitHub pull request",
    )
    p.add_argument(
        "estate",
        nargs="?",
        default=DEFAULT_ESTATE,
        metavar="DIR",
        help="estate directory or file (default: estate)",
    )
    p.add_argument("--strict", action="store_true", help="treat warnings as errors")
    p.add_argument("--format", choices=["text", "json", "github"], default="text")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    result = compile_dir(args.estate)
    if args.strict:
        result = result.strict()
    print_diagnostics(result.diagnostics, args.format)
    if args.format == "text" and result.ok:
        est = result.estate
        assert est is not None
        print(
            f"{args.estate}: valid ({plural(len(result.files), 'file')}, "
            f"{plural(len(est.pools), 'pool')}, {plural(len(est.profiles), 'profile')}, "
            f"{plural(len(est.policies), 'policy')}, "
            f"{plural(len(est.compute_resources), 'compute resource')}; "
            f"revision {est.revision[:19]})"
        )
    return 0 if result.ok else 1
