"""Diagnostics: every problem the compiler finds, with the place it was found.

One type serves every stage (loading, schema, checks, plan, scenarios) so that all errors of
a run can be collected and printed together as ``file:line:col: error[CODE]: message``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"


SortKey = tuple[str, int, int, str, str, str]
"""File, line, column, severity, code, message: the order a report lists its findings in."""


@dataclass(frozen=True, order=True)
class Position:
    """A place in a source file; line and col are 1-based (0 = unknown)."""

    file: str
    line: int = 0
    col: int = 0

    def __str__(self) -> str:
        if self.line <= 0:
            return self.file
        if self.col <= 0:
            return f"{self.file}:{self.line}"
        return f"{self.file}:{self.line}:{self.col}"


@dataclass(frozen=True)
class Diagnostic:
    severity: Severity
    code: str
    message: str
    pos: Position | None = None
    hint: str | None = None
    related: tuple[Position, ...] = field(default=())

    @property
    def is_error(self) -> bool:
        return self.severity is Severity.ERROR

    def sort_key(self) -> SortKey:
        p = self.pos or Position("")
        return (p.file, p.line, p.col, self.severity.value, self.code, self.message)

    def render(self) -> str:
        where = f"{self.pos}: " if self.pos else ""
        text = f"{where}{self.severity.value}[{self.code}]: {self.message}"
        for rel in self.related:
            text += f"\n  note: also at {rel}"
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text

    def as_error(self) -> "Diagnostic":
        """The same finding as an error (``--strict``)."""
        return Diagnostic(
            Severity.ERROR, self.code, self.message, self.pos, self.hint, self.related
        )

    def to_json(self) -> dict[str, str | int | None]:
        return {
            "severity": self.severity.value,
            "code": self.code,
            "message": self.message,
            "file": self.pos.file if self.pos else None,
            "line": self.pos.line if self.pos else None,
            "col": self.pos.col if self.pos else None,
            "hint": self.hint,
        }


def error(
    code: str,
    message: str,
    pos: Position | None = None,
    hint: str | None = None,
    related: tuple[Position, ...] = (),
) -> Diagnostic:
    return Diagnostic(Severity.ERROR, code, message, pos, hint, related)


def warning(
    code: str,
    message: str,
    pos: Position | None = None,
    hint: str | None = None,
    related: tuple[Position, ...] = (),
) -> Diagnostic:
    return Diagnostic(Severity.WARNING, code, message, pos, hint, related)


def sorted_diagnostics(diags: list[Diagnostic]) -> list[Diagnostic]:
    """Stable report order: by file and position, then severity and code; duplicates dropped."""
    seen: set[tuple[SortKey, str | None]] = set()
    out: list[Diagnostic] = []
    for d in sorted(diags, key=Diagnostic.sort_key):
        key = (d.sort_key(), d.hint)
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


PLURALS = {"policy": "policies"}
"""The irregular plurals of the words that messages count (kinds of estate object)."""


def plural_word(word: str, n: int = 2) -> str:
    """``policy`` → ``policies``: one place for the plurals of every message."""
    if n == 1:
        return word
    return PLURALS.get(word, word + "s")


def plural(n: int, word: str) -> str:
    """``1 error``, ``2 errors``, ``0 errors``: counts in messages are never ``1 errors``."""
    return f"{n} {plural_word(word, n)}"


def render_all(diags: list[Diagnostic]) -> str:
    errors = sum(d.is_error for d in diags)
    warnings = len(diags) - errors
    lines = [d.render() for d in diags]
    lines.append(f"{plural(errors, 'error')}, {plural(warnings, 'warning')}")
    return "\n".join(lines)
