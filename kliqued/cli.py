"""The ``kliqued`` command: one entry point, one module per subcommand."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from klique_util.cli import HelpFormatter

COMMANDS: dict[str, str] = {
    "validate": "check an estate and report every problem",
    "compile": "compile an estate to canonical JSON",
    "plan": "show what an estate change does, before it is merged",
    "codeowners": "write a CODEOWNERS file from the groups' admins",
    "schema": "print the JSON Schema of estate files",
    "simulate": "run scenarios on the engine and check their expectations",
    "trace": "convert public GPU cluster traces for trace replay",
    "serve": "run the control plane daemon (API, engine, ledger)",
    "dev": "run the control plane and a local worker (make run)",
    "token": "create, list, rotate and revoke API tokens (admins)",
    "login": "sign in through your organisation's identity provider",
    "whoami": "who your token is: principal, groups, admin of, role",
    "resources": "what you may submit to: size, weight, pools, room",
    "submit": "send a task to a compute resource",
    "status": "a task in detail, or your tasks as a table",
    "logs": "a task's log (its stdout and stderr, from its worker)",
    "events": "the event log: what happened to a task, and who did it",
    "queue": "the queue of a compute resource, in order",
    "cancel": "cancel queued or placed tasks",
    "budget": "use, time budget left, burn rate, run-out and waiting work per policy, as a tree",
    "pools": "capacity, use, borrowed GPUs and live workers per pool",
    "ledger": "query (read-only SQL) and export the usage ledger",
    "demand": "export the demand of a window (what-if input)",
    "advise": "estate changes that would have shortened real waits, checked by what-if",
    "ci": "set up CI for an estate repository (plan comment, what-if)",
    "schedule": "run a command or a pipeline on a cron schedule",
    "pipeline": "run a pipeline of steps (a DAG of tasks)",
    "session": "interactive servers (jupyter, vscode, shell) as tasks",
    "mcp": "serve Klique's MCP tools over stdio to a local agent, as you",
    "checkpoint": "inside a task: mark its work up to now as saved",
    "workers": "roll klique-worker out to hosts with Ansible",
    "autoscale": "scale a cloud pool with its placed work (a loop)",
}
"""Subcommand modules under kliqued.commands, in the order ``--help`` lists them, with the
line ``--help`` shows for each. Only the module of the command being run is imported (a
client command starts in a fraction of the time that importing the compiler, the engine and
the daemon for every command took); tests/cli/test_lazy.py checks that each line is the one
its module registers."""

GLOBAL_FLAGS = {"--context": True, "--url": True, "--token": True, "--timeout": True}
"""The connection flags every client command takes (``_client.add_client_flags``), and
whether each takes a value: accepted before the command too, as kubectl does
(``kliqued --context heidi whoami``)."""


def _command_of(argv: list[str]) -> tuple[str | None, list[str]]:
    """The command ``argv`` runs and ``argv`` with the connection flags given before it
    moved after it (where the command's parser takes them). ``None``: no command named (a
    bare ``kliqued``, ``kliqued --help``) or an unknown one (argparse then says so)."""
    moved: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, _ = arg.partition("=")
        if name in GLOBAL_FLAGS:
            takes = GLOBAL_FLAGS[name] and not eq
            moved += argv[i : i + 1 + takes]
            i += 1 + takes
            continue
        if arg.startswith("-") or arg not in COMMANDS:
            return None, argv
        return arg, [arg, *moved, *argv[i + 1 :]]
    return None, argv


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or with ``only`` the one command's in full and the
    others as their ``--help`` line (what ``main`` uses: one module imported)."""
    parser = argparse.ArgumentParser(
        prog="kliqued",
        description="Klique: GPU allocation and cost-governance control plane.",
        epilog="examples:\n  kliqued validate estate\n  kliqued plan --format markdown\n"
        "  kliqued --context prod whoami\n  kliqued <command> --help",
        formatter_class=HelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    for name, line in COMMANDS.items():
        if only is None or name == only:
            importlib.import_module(f"kliqued.commands.{name}").register(sub)
        else:
            sub.add_parser(name, help=line)
    return parser


def main(argv: list[str] | None = None) -> int:
    command, argv = _command_of(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser(only=command or "")
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
