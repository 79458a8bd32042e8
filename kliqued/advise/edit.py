"""A change applied where IT wrote it: the value on its line of the estate's YAML, the
estate recompiled (every check of the compiler, so a proposal that breaks a rule is
dropped with the compiler's words), and the unified diff a pull request would carry."""

from __future__ import annotations

import difflib
import re
from pathlib import Path

from compiler.api import SourceFile, compile_files
from compiler.compiled import CompiledEstate

from .model import Change

_KEY = {"limit": "limit", "budget": "hours"}


class EditError(ValueError):
    """The change cannot be written (the line does not hold the value) or compiled."""


def _number(v: float) -> str:
    return f"{int(v)}" if v == int(v) else f"{v:.3f}".rstrip("0")


def edited(files: list[SourceFile], changes: list[Change]) -> list[SourceFile]:
    """``files`` with each change written on its line (``limit: 16`` -> ``limit: 24``)."""
    out = {f.path: f.data.decode("utf-8") for f in files}
    for c in changes:
        text = out.get(c.file)
        if text is None:
            raise EditError(f"{c.file}: not a file of the estate")
        lines = text.splitlines(keepends=True)
        i = c.line - 1
        key = _KEY[c.field]
        pat = re.compile(rf"(\b{key}:\s*)([0-9.]+)")
        if not 0 <= i < len(lines) or not pat.search(lines[i]):
            raise EditError(f"{c.file}:{c.line}: no `{key}:` value to change for {c.policy}")
        lines[i] = pat.sub(lambda m: m.group(1) + _number(c.after), lines[i], count=1)
        out[c.file] = "".join(lines)
    return [SourceFile(f.path, out[f.path].encode("utf-8")) for f in files]


def compiled(files: list[SourceFile]) -> CompiledEstate:
    res = compile_files(files)
    if res.estate is None:
        first = next((d for d in res.diagnostics if d.is_error), None)
        raise EditError(f"the changed estate does not compile: {first}")
    return res.estate


def patch(before: list[SourceFile], after: list[SourceFile], root: Path) -> str:
    """The unified diff of the files that changed, paths relative to the estate's parent
    (``git apply`` in the repository holding ``estate/``)."""
    was = {f.path: f.data.decode("utf-8") for f in before}
    parts: list[str] = []
    for f in after:
        old, new = was[f.path], f.data.decode("utf-8")
        if old == new:
            continue
        try:
            rel = Path(f.path).resolve().relative_to(root.resolve().parent).as_posix()
        except ValueError:
            rel = Path(f.path).name
        parts.extend(
            difflib.unified_diff(
                old.splitlines(keepends=True),
                new.splitlines(keepends=True),
                fromfile=f"a/{rel}",
                tofile=f"b/{rel}",
            )
        )
    return "".join(parts)
