"""Every module of the product exists, so nothing may guard against one being missing: a
guard turns a broken build or a typo into a feature that silently is not there (the daemon
ran "events only" without its ledger; a test skipped instead of failing). Optional *third-party*
packages (kubernetes, ansible-runner, ruamel's C parser) keep their guards, and tests still skip
for missing system software (Slurm, Podman)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO

OWN = ("kliqued", "workers", "compiler", "tests")
"""The project's own top-level packages."""

SOURCES = ("kliqued", "workers", "compiler", "tests")
IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError"}


def _name(node: ast.expr) -> str | None:
    """The module a string or f-string argument names (its literal prefix for an f-string)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return first.value
    return None


def _own(module: str | None, level: int = 0) -> bool:
    return level > 0 or (module is not None and module.split(".")[0] in OWN)


def _imported(body: list[ast.stmt]) -> list[tuple[str | None, int]]:
    """(module, relative level) of every import statement or dynamic import in ``body``."""
    out: list[tuple[str | None, int]] = []
    for stmt in body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Import):
                out += [(a.name, 0) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                out.append((node.module, node.level))
            elif (
                isinstance(node, ast.Call)
                and node.args
                and _callee(node) in ("import_module", "__import__")
            ):
                out.append((_name(node.args[0]), 0))
    return out


def _callee(call: ast.Call) -> str | None:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(t, ast.Name) and t.id in IMPORT_ERRORS for t in types)


def guards(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of each guard against a missing project module in one parsed file."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(_catches_import_error(h) for h in node.handlers):
            for module, level in _imported(node.body):
                if _own(module, level):
                    found.append((node.lineno, f"try: import {module} / except ImportError"))
        elif (
            isinstance(node, ast.Call)
            and node.args
            and _callee(node) in ("importorskip", "find_spec")
        ):
            module = _name(node.args[0])
            if _own(module):
                found.append((node.lineno, f"{_callee(node)}({module!r})"))
    return found


def test_the_checker_sees_each_kind_of_guard() -> None:
    src = """
try:
    from kliqued.ledger import writer
except ModuleNotFoundError:
    writer = None
try:
    module = importlib.import_module(f"kliqued.commands.{name}")
except (ModuleNotFoundError, ValueError):
    pass
pytest.importorskip("kliqued.ledger.sql")
if importlib.util.find_spec("kliqued.commands.serve") is None:
    pass
try:
    import kubernetes
except ImportError:
    pass
pytest.importorskip("ansible_runner")
"""
    assert [line for line, _ in guards(ast.parse(src))] == [2, 6, 10, 11]


@pytest.mark.parametrize("top", SOURCES)
def test_no_code_guards_against_a_missing_project_module(top: str) -> None:
    found = []
    for path in sorted((REPO / top).rglob("*.py")):
        if ".venv" in path.parts:
            continue
        for line, what in guards(ast.parse(path.read_text(encoding="utf-8"))):
            found.append(f"{path.relative_to(REPO)}:{line}: {what}")
    assert not found, "a project module is always there; import it directly:\n" + "\n".join(found)


def test_a_command_module_that_does_not_import_fails_the_cli(monkeypatch) -> None:
    from kliqued import cli

    monkeypatch.setattr(cli, "COMMANDS", {**cli.COMMANDS, "no_such_command": "gone"})
    with pytest.raises(ModuleNotFoundError, match="no_such_command"):
        cli.build_parser()
    with pytest.raises(ModuleNotFoundError, match="no_such_command"):
        cli.main(["no_such_command"])  # the command run: its module, imported alone


def test_this_file_checks_real_paths() -> None:
    assert all((REPO / top).is_dir() for top in SOURCES)
    assert Path(__file__).is_relative_to(REPO / "tests")
