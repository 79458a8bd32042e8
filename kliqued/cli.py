"""The ``kliqued`` command: one entry point, one module per subcommand."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from klique_util.cli import HelpFormatter

COMMANDS = ["validate", "compile", "plan", "codeowners", "schema", "simulate", "trace", "serve", "dev",
            "token", "whoami", "resources", "submit", "status", "logs", "events", "queue", "cancel",
            "budget", "pools", "ledger", "demand", "ci", "schedule", "pipeline",
            "session", "mcp", "checkpoint",
            "workers", "autoscale"]
"""Subcommand modules under kliqued.commands, in the order ``--help`` lists them."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kliqued",
        description="Klique: GPU allocation and cost-governance control plane.",
        epilog="examples:\n  kliqued validate estate\n  kliqued plan --format markdown\n"
               "  kliqued <command> --help",
        formatter_class=HelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    for name in COMMANDS:
        importlib.import_module(f"kliqued.commands.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        code = int(handler(args))
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
        return code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return _reader_gone()


SIGPIPE_EXIT = 141
"""128 + SIGPIPE: what a shell reports for a command whose reader went away (`yes | head`)."""


def _reader_gone() -> int:
    """Stdout's reader closed the pipe (``kliqued status | head -1``): stop quietly, as a
    command killed by SIGPIPE does. Stdout is pointed at /dev/null so that the interpreter's
    final flush of what is still buffered does not fail again with a message on stderr (the
    recipe of Python's signal documentation; SIGPIPE itself stays ignored so that the daemon
    never dies of a client that hung up)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
    return SIGPIPE_EXIT


if __name__ == "__main__":
    sys.exit(main())
