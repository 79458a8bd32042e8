"""``kliqued``'s entry point: one command's module imported, connection flags accepted before
the command as after it (issue 27, item 6; issue 32, CLI)."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from kliqued import cli


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def test_each_help_line_is_the_one_its_module_registers() -> None:
    """The table that lets ``kliqued --help`` list every command without importing them is
    not a second place to keep up: it must say what each module says."""
    registered = {a.dest: a.help for a in _subparsers(cli.build_parser())._choices_actions}
    assert registered == cli.COMMANDS


def test_a_client_command_imports_neither_compiler_engine_nor_daemon() -> None:
    """What made ``kliqued whoami --help`` take 1.3-1.6 s: every command module imported,
    and with them the compiler, the engine, the simulator and the daemon; and the SDK's
    HTTP stack, imported only when a command runs."""
    code = (
        "import sys\nfrom kliqued.cli import main\n"
        "try:\n    main(['whoami', '--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] == 'compiler'\n"
        "               or m.startswith(('kliqued.engine', 'kliqued.daemon', 'kliqued.sim',"
        " 'kliqued.ledger', 'kliqued.web', 'kliqued.sdk.client', 'http.client',"
        " 'pydantic', 'duckdb')))\n"
        "print('HEAVY', heavy, file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "usage: kliqued whoami" in done.stdout
    assert "HEAVY []" in done.stderr, done.stderr


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["--context", "heidi", "whoami"], ("whoami", ["whoami", "--context", "heidi"])),
        (
            ["--url=http://a:1", "--token", "t", "status", "-n", "3"],
            ("status", ["status", "--url=http://a:1", "--token", "t", "-n", "3"]),
        ),
        (
            ["--timeout", "5", "submit", "--", "python", "x.py"],
            ("submit", ["submit", "--timeout", "5", "--", "python", "x.py"]),
        ),
        (["whoami", "--context", "heidi"], ("whoami", ["whoami", "--context", "heidi"])),
        (["--help"], (None, ["--help"])),
        (["--context", "heidi"], (None, ["--context", "heidi"])),
        (["nonsense"], (None, ["nonsense"])),
    ],
)
def test_connection_flags_before_the_command_move_after_it(argv, expected) -> None:
    assert cli._command_of(argv) == expected


def test_a_flag_before_the_command_is_used(capsys) -> None:
    """``kliqued --url ... whoami`` reaches the URL given (nothing listens there: the error
    names it), where argparse used to refuse the flag before the command."""
    assert (
        cli.main(["--url", "http://127.0.0.1:9", "--token", "kq_x", "--timeout", "2", "whoami"])
        == 1
    )
    err = capsys.readouterr().err
    assert "127.0.0.1:9" in err and "unrecognized arguments" not in err


def test_an_unknown_command_is_refused_with_the_list(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["whoam"])
    assert exc.value.code == 2
    assert "invalid choice: 'whoam'" in capsys.readouterr().err
