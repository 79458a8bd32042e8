"""The lines a change touched, and the errors it causes elsewhere.

An edit in ``pools/10-onprem.yaml`` can make an error show at
``policies/it-platform.yaml:12``: a line the pull request does not touch, so a reviewer
reading the diff never sees it. The base compiled, so every error of the head is caused by
the change; the plan repeats the errors that show away from the change on the first line
of each changed hunk ("this change causes: ...").
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from ..api import SourceFile
from ..diagnostics import Diagnostic, Position

MAX_HUNKS = 20
"""Hunks that get the note: a change of hundreds of lines gets it at its first ones only."""


@dataclass(frozen=True)
class Hunk:
    file: str
    first: int
    """The hunk's first line in the head (1-based)."""
    last: int

    def covers(self, pos: Position | None) -> bool:
        return pos is not None and pos.file == self.file and self.first <= pos.line <= self.last


def _lines(data: bytes) -> list[str]:
    return data.decode("utf-8", errors="replace").splitlines()


def touched(base: list[SourceFile] | None, head: list[SourceFile] | None) -> list[Hunk]:
    """The changed line ranges of the head, file by file in path order. A deleted file has
    no head line to point at and is left out."""
    old = {f.path: f.data for f in base or []}
    out: list[Hunk] = []
    for f in sorted(head or [], key=lambda f: f.path):
        before = old.get(f.path)
        if before == f.data:
            continue
        new_lines = _lines(f.data)
        if before is None:
            out.append(Hunk(f.path, 1, max(1, len(new_lines))))
            continue
        sm = difflib.SequenceMatcher(a=_lines(before), b=new_lines, autojunk=False)
        for tag, _, _, j1, j2 in sm.get_opcodes():
            if tag == "equal":
                continue
            # A pure deletion touches no head line: point at the line after it.
            first = j1 + 1
            out.append(Hunk(f.path, min(first, max(1, len(new_lines))), max(first, j2)))
    return out


def caused_elsewhere(diags: tuple[Diagnostic, ...], hunks: list[Hunk]) -> list[Diagnostic]:
    """The errors that show on no line the change touched."""
    return [d for d in diags if d.is_error and not any(h.covers(d.pos) for h in hunks)]
