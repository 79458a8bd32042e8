"""``kliqued codeowners``: the estate's CODEOWNERS file from its groups' admins."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from compiler.api import compile_dir
from compiler.codeowners import render_codeowners
from klique_util.files import write_atomic

from ._common import DEFAULT_ESTATE, add_command, print_diagnostics


def register(subparsers) -> None:
    p = add_command(
        subparsers,
        "codeowners",
        help="write a CODEOWNERS file from the groups' admins",
        description="Writes a CODEOWNERS file for the estate, so the forge asks the right "
        "people to review each change: a policy or group file is owned by its "
        "groups' admins and the admins of every group above them (a department "
        "head reviews every change to the department's teams); pools, profiles, "
        "prices and settings by IT (settings.approvers, else the admins of the top "
        "group). Owners are the users' settings.forge_handles; paths are from the "
        "repository root. Exit 0: written or current; 1: the estate is invalid, or "
        "with --check the file is missing or stale.",
        examples="  kliqued codeowners                          # print it for estate/\n"
        "  kliqued codeowners estate -o .github/CODEOWNERS\n"
        "  kliqued codeowners estate -o .github/CODEOWNERS --check   # in CI\n\n"
        "settings:\n"
        '  forge_handles: {dana: "@dana", trent: "@northwind/it"}',
    )
    p.add_argument(
        "estate",
        nargs="?",
        default=DEFAULT_ESTATE,
        metavar="DIR",
        help="estate directory (default: estate)",
    )
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write it here (atomically), e.g. .github/CODEOWNERS; default: stdout",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="write nothing: exit 1 when FILE (-o) differs from what would be "
        "written, so CI catches an estate change without its CODEOWNERS",
    )
    p.set_defaults(handler=run)


def repo_root(start: Path) -> Path | None:
    """The nearest directory at or above ``start`` holding ``.git`` (a directory, or the
    file of a worktree or submodule)."""
    for d in (start, *start.parents):
        if (d / ".git").exists():
            return d
    return None


def _command(args: argparse.Namespace) -> str:
    words = ["kliqued codeowners", args.estate]
    if args.output:
        words += ["-o", args.output]
    return " ".join(words)


def run(args: argparse.Namespace) -> int:
    if args.check and not args.output:
        print(
            "kliqued codeowners: --check needs -o FILE, the committed CODEOWNERS to compare",
            file=sys.stderr,
        )
        return 1
    result = compile_dir(args.estate)
    if not result.ok:
        print_diagnostics(result.diagnostics, stream=sys.stderr)
        print(
            f"kliqued codeowners: {args.estate} is invalid: fix the errors above first",
            file=sys.stderr,
        )
        return 1
    estate = Path(args.estate).resolve()
    root = repo_root(estate) or Path.cwd().resolve()
    try:
        estate_dir = estate.relative_to(root).as_posix()
    except ValueError:
        print(
            f"kliqued codeowners: {args.estate} is outside {root}: run it from the "
            "repository that holds the estate",
            file=sys.stderr,
        )
        return 1
    # A single-file estate has no directory line: the file's own line is all there is.
    if estate_dir == "." or estate.is_file():
        estate_dir = ""
    text = render_codeowners(
        result, lambda f: Path(f).resolve().relative_to(root).as_posix(), estate_dir, _command(args)
    )
    # Who is left out, and why: the one warning that changes this file.
    left_out = [d for d in result.diagnostics if d.code == "admin-without-handle"]
    if left_out:
        print_diagnostics(left_out, stream=sys.stderr)
    if args.check:
        try:
            current = Path(args.output).read_text(encoding="utf-8")
        except OSError as exc:
            print(
                f"kliqued codeowners: {args.output}: {exc.strerror or exc}; run "
                f"`{_command(args)}` and commit it",
                file=sys.stderr,
            )
            return 1
        if current != text:
            print(
                f"kliqued codeowners: {args.output} is stale: run `{_command(args)}` and commit it",
                file=sys.stderr,
            )
            return 1
        print(f"kliqued codeowners: {args.output} is current", file=sys.stderr)
        return 0
    if args.output:
        write_atomic(args.output, text)
        print(f"kliqued codeowners: wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
