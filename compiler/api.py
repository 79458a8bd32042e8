"""The compiler's front door: files or documents in, a CompileResult out.

Reading files is the only I/O here (``read_dir``); everything else is a pure function of the
bytes, so the CLI, ``kliqued plan`` (which reads git objects) and the simulator (inline
estates in scenarios) all compile the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .build import build
from .checks import run_checks
from .compiled import CompiledEstate
from .diagnostics import Diagnostic, Position, error, sorted_diagnostics
from .errors import EstateReadError as EstateReadError  # noqa: PLC0414 (re-exported)
from .loader import load_yaml
from .source import SourceMap
from .validate import validate_document

YAML_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True)
class SourceFile:
    path: str
    """As shown in messages, e.g. ``estate/pools/onprem.yaml``."""
    data: bytes


@dataclass(frozen=True)
class Document:
    file: str
    root: Any
    """A ruamel.yaml round-trip mapping (positions via ``.lc``)."""


@dataclass
class CompileResult:
    estate: CompiledEstate | None
    diagnostics: list[Diagnostic] = field(default_factory=list)
    sources: SourceMap = field(default_factory=SourceMap)
    files: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.is_error]

    @property
    def warnings(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if not d.is_error]

    @property
    def ok(self) -> bool:
        return self.estate is not None

    def strict(self) -> "CompileResult":
        """Warnings as errors: the same findings, and no estate when there were any."""
        diags = [d.as_error() for d in self.diagnostics]
        return CompileResult(self.estate if not diags else None, diags, self.sources, self.files)


def read_dir(path: str | Path) -> list[SourceFile]:
    """Every ``*.yaml``/``*.yml`` below ``path`` (or ``path`` itself if it is a file), in
    sorted path order, as estate.md says. Hidden files and folders are skipped."""
    root = Path(path)
    if root.is_file():
        return [SourceFile(str(root), _read(root))]
    if not root.exists():
        raise EstateReadError(f"{root}: no such file or directory")
    if not root.is_dir():
        raise EstateReadError(f"{root}: not a directory")
    files = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if any(part.startswith(".") for part in rel.parts):
            continue
        if p.is_file() and p.suffix in YAML_SUFFIXES:
            files.append(SourceFile(str(p), _read(p)))
    return files


def _read(p: Path) -> bytes:
    try:
        return p.read_bytes()
    except OSError as exc:
        raise EstateReadError(f"{p}: {exc.strerror or exc}") from None


def compile_dir(path: str | Path) -> CompileResult:
    try:
        files = read_dir(path)
    except EstateReadError as exc:
        return CompileResult(
            None,
            [
                error(
                    "estate-path",
                    str(exc),
                    Position(str(path)),
                    "give the estate directory, e.g. estate/",
                )
            ],
        )
    return compile_files(files)


def compile_files(files: list[SourceFile]) -> CompileResult:
    files = sorted(files, key=lambda f: f.path)
    diags: list[Diagnostic] = []
    docs: list[Document] = []
    for f in files:
        loaded = load_yaml(f.path, f.data)
        diags.extend(loaded.diagnostics)
        if loaded.ok:
            docs.append(Document(f.path, loaded.root))
    result = compile_documents(docs, complete=not any(d.is_error for d in diags))
    result.diagnostics = sorted_diagnostics(diags + result.diagnostics)
    result.files = [f.path for f in files]
    if any(d.is_error for d in diags):
        result.estate = None
    if not files:
        result.diagnostics.append(
            error(
                "estate-path",
                "no estate files (*.yaml, *.yml) found",
                None,
                "point at the estate directory, e.g. estate/",
            )
        )
        result.estate = None
    return result


def compile_documents(docs: list[Document], complete: bool = True) -> CompileResult:
    """``complete=False``: some file of the estate could not be read, so only each object's
    own validity is checked; references and totals wait until every file parses."""
    sources = SourceMap()
    diags: list[Diagnostic] = []
    for doc in docs:
        diags.extend(validate_document(doc.file, doc.root, sources))
    if complete and not sources.incomplete:
        diags.extend(run_checks(sources))
    diags = sorted_diagnostics(diags)
    # Build assumes what the checks establish (every reference resolves), so it runs only on
    # a checked, error-free model set: with a file that did not load, the references into it
    # were never checked, and building would trip on them.
    # (``complete=False`` comes with the caller's load errors; ``sources.incomplete`` with
    # the validation error that set it.)
    checked = complete and not sources.incomplete
    estate = build(sources) if checked and not any(d.is_error for d in diags) else None
    return CompileResult(estate, diags, sources, [d.file for d in docs])
