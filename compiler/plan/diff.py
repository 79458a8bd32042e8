"""What changed between two compiled estates, shown the way IT writes the estate.

The diff runs on the compiled objects, not on the YAML, so a change that only moves an
object to another file, reorders keys or spells a default out is no change at all, and a
change whose effect is indirect (a new pool that a ``pools_by`` profile now resolves to, a
settings ``low_watermark`` that a budget inherits) shows where it takes effect. Values are
then turned back into the estate's own notation (``capacity = 64``, ``15m``) because the
reader is the person who wrote the YAML, not the engine.

Renames (``renamed_from``) are applied to the base before comparing: the renamed object is
one ``~`` change, and every reference to it elsewhere (a profile's ``pools``, a policy's
``group``) is translated, so a rename does not ripple through the plan as noise.

Nothing is left out: both sides are read from their canonical form (the data the revision
digest is taken of), the per-kind renderers word the fields they know, and every other
field is shown by walking that form (``walk``), so a new revision is never "No changes".
"""

from __future__ import annotations

from decimal import Decimal
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from ..compiled import CGroup, CompiledEstate, CPolicy, CPool, CPrice, CProfile, CSettings
from ..diagnostics import Position
from ..source import SourceMap, SourceObject
from .model import AttrChange, ObjectChange
from .walk import Path, Shown, amount, boolean, covered, dur, flow, leaves, q, typed

RENAMABLE = ("pool", "profile", "policy", "group")

Rank = tuple[int, str]


Flat = list[tuple[Rank, tuple[str, ...], Shown]]
"""An object as (sort rank, attribute path as IT writes it, display value)."""


@dataclass
class Renames:
    """Per kind, base name → head name, for the objects whose head declares
    ``renamed_from``."""

    by_kind: dict[str, dict[str, str]] = field(default_factory=dict)

    def new(self, kind: str, name: str) -> str:
        return self.by_kind.get(kind, {}).get(name, name)

    def old(self, kind: str, name: str) -> str:
        """The base's name of a head object (the inverse of ``new``)."""
        for before, after in self.by_kind.get(kind, {}).items():
            if after == name:
                return before
        return name

    def names(self, kind: str, names: Iterable[str]) -> list[str]:
        return [self.new(kind, n) for n in names]


NO_RENAMES = Renames()


def find_renames(
    base: CompiledEstate | None, head: CompiledEstate | None, head_sources: SourceMap
) -> Renames:
    """A rename counts only when it is unambiguous: the old name exists in the base and is
    gone from the head, and the new name is new. A stale ``renamed_from`` (the rename was
    merged long ago) is then simply ignored, and never turns a real remove into a rename."""
    out = Renames()
    if base is None or head is None:
        return out
    for kind in RENAMABLE:
        base_names = {o.name for o in _objects(base, kind)}
        head_names = {o.name for o in _objects(head, kind)}
        taken: set[str] = set()
        for name, src in head_sources.of(kind).items():
            old = getattr(src.model, "renamed_from", None)
            if (
                old
                and name in head_names
                and old in base_names
                and old not in head_names
                and name not in base_names
                and old not in taken
            ):
                taken.add(old)
                out.by_kind.setdefault(kind, {})[old] = name
    return out


# --- display values -------------------------------------------------------------------------


def _dict(rank: int, prefix: tuple[str, ...], values: dict[str, str]) -> Flat:
    return [((rank, k), (*prefix, k), q(v)) for k, v in sorted(values.items())]


def _flat_settings(s: CSettings) -> Flat:
    return [
        ((0, ""), ("pass_interval",), dur(s.pass_interval_s)),
        ((1, ""), ("low_watermark",), dur(s.low_watermark_s)),
        ((2, ""), ("currency",), q(s.currency)),
    ]


def _flat_pool(p: CPool, rn: Renames) -> Flat:
    out: Flat = [
        ((0, ""), ("kind",), q(p.kind)),
        ((1, ""), ("capacity",), amount(p.capacity_milli)),
        ((2, ""), ("gpu_type",), q(p.gpu_type)),
    ]
    if p.gpu_memory_gb is not None:
        out.append(((3, ""), ("gpu_memory_gb",), Shown(str(p.gpu_memory_gb), p.gpu_memory_gb)))
    if p.generation is not None:
        out.append(((4, ""), ("generation",), Shown(str(p.generation), p.generation)))
    out += _dict(5, ("labels",), p.labels)
    if p.execution_order:
        out.append(((6, ""), ("execution_order",), flow(rn.names("profile", p.execution_order))))
    if p.autoscale is not None:
        a = p.autoscale
        out += [
            ((7, "0"), ("autoscale", "max"), amount(a.max_milli)),
            ((7, "1"), ("autoscale", "idle_timeout"), dur(a.idle_timeout_s)),
            ((7, "2"), ("autoscale", "spot_first"), boolean(a.spot_first)),
        ]
    out += _dict(8, ("settings",), p.settings)
    if p.nodes:  # the machines behind the pool, as written: [{count: 4, gpus: 8}, ...]
        out.append(
            (
                (9, ""),
                ("nodes",),
                flow(
                    Shown(
                        f"{{count: {n.count}, gpus: {amount(n.gpus_milli)}}}",
                        {"count": n.count, "gpus": amount(n.gpus_milli).value},
                    )
                    for n in p.nodes
                ),
            )
        )
    return out


def _flat_profile(p: CProfile, rn: Renames) -> Flat:
    out: Flat = []
    if p.gpus_milli is not None:
        out.append(((0, ""), ("gpus",), amount(p.gpus_milli)))
    if p.from_task is not None:
        f = p.from_task
        out += [
            ((0, "0"), ("gpus", "from_task"), Shown(f.param, f.param)),
            ((0, "1"), ("gpus", "default"), amount(f.default_milli)),
            ((0, "2"), ("gpus", "max"), amount(f.max_milli)),
        ]
    out += [
        ((1, ""), ("time_weight",), amount(p.time_weight_milli)),
        ((2, ""), ("pools",), flow(rn.names("pool", p.pools))),
        ((3, ""), ("policies",), flow(rn.names("policy", p.policies))),
        ((4, ""), ("queueing",), q(p.queueing)),
    ]
    if p.idle is not None:  # session idle limits: a plan shows them changed
        for i, kind in enumerate(("wall", "cpu", "gpu", "network")):
            seconds = getattr(p.idle, f"{kind}_s")
            if seconds is not None:
                out.append(((5, str(i)), ("idle", kind), dur(seconds)))
    return out


def _flat_policy(p: CPolicy, rn: Renames) -> Flat:
    out: Flat = [
        ((0, ""), ("group",), q(rn.new("group", p.group))),
        ((1, ""), ("reservation",), amount(p.reservation_milli)),
        ((2, ""), ("limit",), amount(p.limit_milli)),
    ]
    if p.user_limit_milli is not None:
        out.append(((2, "user_limit"), ("user_limit",), amount(p.user_limit_milli)))
    if p.budget is not None:
        b = p.budget
        out += [
            ((3, "0"), ("budget", "hours"), amount(b.hours_milli)),
            ((3, "1"), ("budget", "period"), q(b.period)),
            ((3, "2"), ("budget", "low_watermark"), dur(b.low_watermark_s)),
        ]
        if b.alert_at_milli:
            out.append(
                ((3, "3"), ("budget", "alert_at"), flow(amount(a) for a in b.alert_at_milli))
            )
    if p.pools_allowed is not None:
        pa = p.pools_allowed
        out += [
            ((4, "labels." + k), ("pools_allowed", "labels", k), q(v))
            for k, v in sorted(pa.labels.items())
        ]
        if pa.pools is not None:
            out.append(
                ((4, "pools"), ("pools_allowed", "pools"), flow(sorted(rn.names("pool", pa.pools))))
            )
    # ``profiles`` is the inverse of each profile's ``policies``: shown there, not twice.
    return out


def _flat_group(g: CGroup, rn: Renames) -> Flat:
    out: Flat = []
    if g.parent is not None:
        out.append(((0, ""), ("parent",), q(rn.new("group", g.parent))))
    # ``ancestors`` and ``policy`` are derived from parents and policies: shown there.
    # With project_priority the listed order is the queue order, so it is what is shown.
    out += [
        ((1, ""), ("users",), flow(g.users)),
        ((2, ""), ("admins",), flow(g.admins)),
        ((3, ""), ("projects",), flow(g.project_order if g.project_priority else g.projects)),
    ]
    if g.project_priority:
        out.append(((4, ""), ("project_priority",), boolean(True)))
    return [a for a in out if a[2] != "[]"]


def _flat_price(p: CPrice) -> Flat:
    return [
        ((0, ""), ("gpu_type",), q(p.gpu_type)),
        ((1, ""), ("per_gpu_hour",), Shown(p.per_gpu_hour, money_value(p.per_gpu_hour))),
        ((2, ""), ("effective_from",), q(p.effective_from)),
    ]


def money_value(text: str) -> int | float:
    """A price as a JSON number (``2.50`` → 2.5): exact for the cents that prices have."""
    d = Decimal(text)
    return int(d) if d == d.to_integral_value() else float(d)


def flatten(kind: str, obj: BaseModel, rn: Renames = NO_RENAMES) -> Flat:
    """``obj``'s attributes as the plan shows them; its class says which kind it is."""
    if isinstance(obj, CSettings):
        return _flat_settings(obj)
    if isinstance(obj, CPool):
        return _flat_pool(obj, rn)
    if isinstance(obj, CProfile):
        return _flat_profile(obj, rn)
    if isinstance(obj, CPolicy):
        return _flat_policy(obj, rn)
    if isinstance(obj, CGroup):
        return _flat_group(obj, rn)
    if isinstance(obj, CPrice):
        return _flat_price(obj)
    raise ValueError(f"unknown kind {kind!r}")


# --- objects and their places ---------------------------------------------------------------

CompiledObject = CPool | CProfile | CPolicy | CGroup | CPrice | CSettings
"""One object of a compiled estate's sections, as :func:`_objects` lists them."""


def object_key(obj: CompiledObject) -> str:
    """A price is known by its GPU type and start date, the settings are one, every other
    object is known by its name."""
    if isinstance(obj, CPrice):
        return f"{obj.gpu_type}@{obj.effective_from}"
    if isinstance(obj, CSettings):
        return "settings"
    return obj.name


def _objects(est: CompiledEstate, kind: str) -> list[Any]:
    by_kind: dict[str, list[Any]] = {
        "pool": est.pools,
        "profile": est.profiles,
        "policy": est.policies,
        "group": est.groups,
        "price": est.pricing,
        "settings": [est.settings],
    }
    return by_kind[kind]


def source_of(sources: SourceMap, kind: str, name: str) -> SourceObject[BaseModel] | None:
    if kind == "settings":
        return sources.settings
    return sources.get(kind, name)


def line_only(pos: Position | None) -> Position | None:
    """Plans cite ``file:line``: a column adds noise for a reviewer and nothing for CI."""
    return None if pos is None else Position(pos.file, pos.line)


def object_pos(sources: SourceMap, kind: str, name: str) -> Position | None:
    src = source_of(sources, kind, name)
    return line_only(src.pos()) if src is not None else None


def attr_pos(
    src: SourceObject[BaseModel] | None, kind: str, path: tuple[str, ...], fallback: Position | None
) -> Position | None:
    """The source field's place when the source writes it; otherwise the nearest enclosing
    place that it does write (``labels`` for a removed label, the object for a default)."""
    if src is None:
        return fallback
    model = src.model
    if (
        kind == "profile"
        and path == ("pools",)
        and getattr(model, "pools", None) is None
        and getattr(model, "pools_by", None) is not None
    ):
        path = ("pools_by",)
    elif (
        kind == "pool"
        and path == ("capacity",)
        and getattr(model, "capacity", None) is None
        and getattr(model, "autoscale", None) is not None
    ):
        path = ("autoscale", "max")
    return line_only(src.pos(*path))


def _attr_changes(
    kind: str,
    before: Flat,
    after: Flat,
    src: SourceObject[BaseModel] | None,
    fallback: Position | None,
) -> list[AttrChange]:
    old = {path: (rank, v) for rank, path, v in before}
    new = {path: (rank, v) for rank, path, v in after}
    paths = sorted(set(old) | set(new), key=lambda p: ((new.get(p) or old[p])[0], p))
    out = []
    for path in paths:
        b = old[path][1] if path in old else None
        a = new[path][1] if path in new else None
        if a == b:
            continue
        op: Literal["+", "-", "~"] = "+" if b is None else "-" if a is None else "~"
        out.append(
            AttrChange(path, op, b, a, attr_pos(src, kind, path, fallback), typed(b), typed(a))
        )
    return out


def _all_attrs(
    kind: str,
    flat: Flat,
    op: Literal["+", "-"],
    src: SourceObject[BaseModel] | None,
    fallback: Position | None,
) -> list[AttrChange]:
    return [
        AttrChange(
            path,
            op,
            v if op == "-" else None,
            v if op == "+" else None,
            attr_pos(src, kind, path, fallback),
            typed(v) if op == "-" else None,
            typed(v) if op == "+" else None,
        )
        for _, path, v in sorted(flat, key=lambda x: (x[0], x[1]))
    ]


def _dump(obj: BaseModel) -> dict[str, Any]:
    return obj.model_dump(mode="json")


# --- every field of the canonical form ------------------------------------------------------

SECTIONS: dict[str, str] = {
    "settings": "settings",
    "pools": "pool",
    "profiles": "profile",
    "policies": "policy",
    "groups": "group",
    "pricing": "price",
}
"""The canonical form's sections whose objects the plan shows one by one, and their kind."""

DERIVED_SECTIONS = ("compute_resources",)
"""One per (policy, profile) pair of a profile's ``policies``, in the policy's group: shown
at their cause (the profile's ``policies``, the policy's ``group``) and as impacts."""

NOT_CONTENT = ("revision",)
"""The digest itself, not what it is taken of."""

WORDED: dict[str, tuple[Path, ...]] = {
    "settings": (("pass_interval_s",), ("low_watermark_s",), ("currency",)),
    "pool": (
        ("name",),
        ("kind",),
        ("capacity_milli",),
        ("gpu_type",),
        ("gpu_memory_gb",),
        ("generation",),
        ("labels",),
        ("execution_order",),
        ("autoscale", "max_milli"),
        ("autoscale", "idle_timeout_s"),
        ("autoscale", "spot_first"),
        ("settings",),
        ("nodes",),
    ),
    "profile": (
        ("name",),
        ("gpus_milli",),
        ("from_task",),
        ("time_weight_milli",),
        ("pools",),
        ("policies",),
        ("queueing",),
        ("idle",),
    ),
    "policy": (
        ("name",),
        ("group",),
        ("reservation_milli",),
        ("limit_milli",),
        ("user_limit_milli",),
        ("budget",),
        ("pools_allowed",),
    ),
    "group": (
        ("name",),
        ("parent",),
        ("users",),
        ("admins",),
        ("projects",),
        ("project_priority",),
        ("project_order",),
    ),
    "price": (("gpu_type",), ("per_gpu_hour",), ("effective_from",)),
}
"""Per kind, the compiled fields that its renderer above shows in full, in the estate's words
and with renames followed. Every other field of the canonical form is shown by the walk
(``walk.leaves``): a field added to the compiled estate later is in the plan without a line
written for it here."""

DERIVED: dict[str, tuple[Path, ...]] = {
    "policy": (
        ("profiles",),
        ("envelope",),
        ("levels",),
        ("below",),
        ("shared_reservation_milli",),
    ),
    "group": (("ancestors",), ("policy",)),
}
"""Fields computed from fields shown elsewhere, so their change is shown at its cause, not a
second time: a policy's ``profiles`` are the profiles whose ``policies`` list it (their
order, which nothing else shows, is ``_residual``'s), its envelope, levels, ``below`` and
shared part follow from the groups' parents and the policies' groups and reservations; a
group's ``ancestors`` follow from the parents and its ``policy`` from the policies' groups."""


def _walked(kind: str, body: dict[str, Any]) -> Flat:
    """The leaves of an object's canonical form that no renderer above words."""
    skip = WORDED.get(kind, ()) + DERIVED.get(kind, ())
    return [
        ((100, ".".join(path)), shown, value)
        for path, (shown, value) in leaves(body).items()
        if not covered(path, skip)
    ]


def _residual(kind: str, before: Any, after: Any, rn: Renames) -> tuple[Flat, Flat]:
    """What a derived field holds beyond its cause: the order of a policy's ``profiles``
    (the profiles' declaration order) among the profiles it has on both sides."""
    if kind != "policy":
        return [], []
    old, new = rn.names("profile", before.profiles), list(after.profiles)
    if [p for p in old if p in new] == [p for p in new if p in old]:
        return [], []
    return ([((5, ""), ("profiles",), flow(old))], [((5, ""), ("profiles",), flow(new))])


Item = tuple[Any, dict[str, Any]]
"""A compiled object and its canonical form (the part of the digest's body it is)."""


def _items(
    est: CompiledEstate | None, body: dict[str, Any] | None, section: str, kind: str
) -> list[Item]:
    if est is None or body is None:
        return []
    forms = [body[section]] if kind == "settings" else body[section]
    return list(zip(_objects(est, kind), forms))


def _full(kind: str, item: Item, rn: Renames = NO_RENAMES) -> Flat:
    return flatten(kind, item[0], rn) + _walked(kind, item[1])


def diff(
    base: CompiledEstate | None,
    head: CompiledEstate | None,
    base_sources: SourceMap,
    head_sources: SourceMap,
    renames: Renames | None = None,
) -> list[ObjectChange]:
    """Every object that differs, in estate order. ``None`` for an estate that does not
    exist at that revision: then everything is added (or removed), settings included.

    Both sides are read from their canonical form, the data their revision digest is
    taken of: the plan is empty exactly when the revision is unchanged
    (tests/plan/test_diff_complete.py)."""
    rn = renames if renames is not None else find_renames(base, head, head_sources)
    bodies = (base.canonical_body() if base else None, head.canonical_body() if head else None)
    changes: list[ObjectChange] = []
    for section, kind in SECTIONS.items():
        old = {rn.new(kind, object_key(i[0])): i for i in _items(base, bodies[0], section, kind)}
        new = {object_key(i[0]): i for i in _items(head, bodies[1], section, kind)}
        for name in sorted(set(old) | set(new)):
            changes.extend(
                _one(kind, name, old.get(name), new.get(name), rn, base_sources, head_sources)
            )
    if bodies[0] is not None and bodies[1] is not None:
        changes.extend(_rest(bodies[0], bodies[1], whole=not changes))
    return sorted(changes, key=ObjectChange.sort_key)


def _rest(before: dict[str, Any], after: dict[str, Any], whole: bool) -> list[ObjectChange]:
    """The canonical form outside the sections shown object by object: a top-level field
    of its own (``format``, or one added later), and, when nothing else differs, everything
    that does (a derived section whose cause no renderer showed): never an unexplained new
    revision with "No changes"."""
    skip = set(NOT_CONTENT) | set(SECTIONS)
    if not whole:
        skip |= set(DERIVED_SECTIONS)
    old = leaves({k: v for k, v in before.items() if k not in skip})
    new = leaves({k: v for k, v in after.items() if k not in skip})
    flat_b: Flat = [((0, ".".join(p)), shown, v) for p, (shown, v) in old.items()]
    flat_a: Flat = [((0, ".".join(p)), shown, v) for p, (shown, v) in new.items()]
    attrs = _attr_changes("estate", flat_b, flat_a, None, None)
    return [ObjectChange("estate", "estate", "update", None, tuple(attrs))] if attrs else []


def _one(
    kind: str,
    name: str,
    before: Item | None,
    after: Item | None,
    rn: Renames,
    base_sources: SourceMap,
    head_sources: SourceMap,
) -> Iterator[ObjectChange]:
    if after is None:
        assert before is not None
        old_name = object_key(before[0])
        src = source_of(base_sources, kind, old_name)
        pos = object_pos(base_sources, kind, old_name)
        yield ObjectChange(
            kind,
            old_name,
            "delete",
            pos,
            tuple(_all_attrs(kind, _full(kind, before), "-", src, pos)),
            before=_dump(before[0]),
        )
        return
    src = source_of(head_sources, kind, name)
    pos = object_pos(head_sources, kind, name)
    if before is None:
        yield ObjectChange(
            kind,
            name,
            "create",
            pos,
            tuple(_all_attrs(kind, _full(kind, after), "+", src, pos)),
            after=_dump(after[0]),
        )
        return
    old_name = object_key(before[0])
    extra_b, extra_a = _residual(kind, before[0], after[0], rn)
    attrs = _attr_changes(
        kind, _full(kind, before, rn) + extra_b, _full(kind, after) + extra_a, src, pos
    )
    if old_name != name:
        yield ObjectChange(
            kind,
            name,
            "rename",
            pos,
            tuple(attrs),
            old_name=old_name,
            before=_dump(before[0]),
            after=_dump(after[0]),
        )
    elif attrs:
        yield ObjectChange(
            kind, name, "update", pos, tuple(attrs), before=_dump(before[0]), after=_dump(after[0])
        )
