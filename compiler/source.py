"""Where each object of the estate came from: the bridge from a model back to file:line:col."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from .diagnostics import Position
from .loader import position_of


@dataclass
class SourceObject:
    kind: str
    """pool, profile, policy, group, price or settings."""
    name: str
    model: BaseModel
    file: str
    node: Any
    """The ruamel node of the object (positions via ``.lc``)."""

    def pos(self, *path: Any, key: bool = False) -> Position:
        return position_of(self.file, self.node, tuple(path), key=key)

    @property
    def label(self) -> str:
        return f"{self.kind} '{self.name}'"


@dataclass
class SourceMap:
    """Every validated object by kind and name, in declaration order (sorted file path order,
    then order within the file): declaration order carries meaning (execution order and
    ``pools_by`` ties), so it is kept here and made explicit in the compiled estate."""

    objects: dict[str, dict[str, SourceObject]] = field(default_factory=dict)
    broken: dict[str, set[str]] = field(default_factory=dict)
    """Names of objects that failed validation: they exist, so references to them are not
    reported a second time as unknown."""
    settings: SourceObject | None = None
    incomplete: bool = False
    """Part of the estate could not be read (a file that did not parse, an unknown section):
    checks across objects are skipped, since what is missing could be what they look for."""

    def add(self, obj: SourceObject) -> None:
        self.objects.setdefault(obj.kind, {})[obj.name] = obj

    def of(self, kind: str) -> dict[str, SourceObject]:
        return self.objects.get(kind, {})

    def get(self, kind: str, name: str) -> SourceObject | None:
        return self.objects.get(kind, {}).get(name)

    def exists(self, kind: str, name: str) -> bool:
        return name in self.objects.get(kind, {}) or name in self.broken.get(kind, set())

    def position(self, kind: str, name: str, *path: Any) -> Position | None:
        obj = self.get(kind, name)
        return obj.pos(*path) if obj else None
