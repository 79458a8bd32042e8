"""Where each object of the estate came from: the bridge from a model back to file:line:col."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar, overload

from pydantic import BaseModel

from .diagnostics import Position
from .loader import position_of
from .models import Group, Policy, Pool, Price, Profile, Settings

M = TypeVar("M", bound=BaseModel, covariant=True)


@dataclass
class SourceObject(Generic[M]):
    """One validated object; generic in its model so that ``sources.of("pool")`` gives
    ``SourceObject[Pool]`` and checks read typed fields without casts."""

    kind: str
    """pool, profile, policy, group, price or settings."""
    name: str
    model: M
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

    objects: dict[str, dict[str, SourceObject[BaseModel]]] = field(default_factory=dict)
    broken: dict[str, set[str]] = field(default_factory=dict)
    """Names of objects that failed validation: they exist, so references to them are not
    reported a second time as unknown."""
    settings: SourceObject[Settings] | None = None
    incomplete: bool = False
    """Part of the estate could not be read (a file that did not parse, an unknown section):
    checks across objects are skipped, since what is missing could be what they look for."""

    def add(self, obj: SourceObject[BaseModel]) -> None:
        """Adds ``obj`` under its kind; validate.py builds its model with the class of the
        kind (``SECTIONS``), which is what the typed overloads of ``of`` rely on."""
        self.objects.setdefault(obj.kind, {})[obj.name] = obj

    @overload
    def of(self, kind: Literal["pool"]) -> dict[str, SourceObject[Pool]]: ...
    @overload
    def of(self, kind: Literal["profile"]) -> dict[str, SourceObject[Profile]]: ...
    @overload
    def of(self, kind: Literal["policy"]) -> dict[str, SourceObject[Policy]]: ...
    @overload
    def of(self, kind: Literal["group"]) -> dict[str, SourceObject[Group]]: ...
    @overload
    def of(self, kind: Literal["price"]) -> dict[str, SourceObject[Price]]: ...
    @overload
    def of(self, kind: str) -> dict[str, SourceObject[BaseModel]]: ...

    def of(self, kind: str) -> dict[str, SourceObject[Any]]:
        return self.objects.get(kind, {})

    def get(self, kind: str, name: str) -> SourceObject[BaseModel] | None:
        return self.objects.get(kind, {}).get(name)

    def exists(self, kind: str, name: str) -> bool:
        return name in self.objects.get(kind, {}) or name in self.broken.get(kind, set())

    def position(self, kind: str, name: str, *path: Any) -> Position | None:
        obj = self.get(kind, name)
        return obj.pos(*path) if obj else None
