"""Whose approval each change of a plan needs (organisation.md, "Who sees and manages what").

A change to a policy or a group needs the admins of that group and of every group above it:
an admin administers every group below theirs, and a department head (an envelope's admin)
must see what a change does to the department's teams. Shared objects (pools, prices,
settings) belong to IT: ``settings.approvers`` when the estate names them, else the admins of
the top groups that have groups below them (the company). A profile is shared too, but it
decides what the policies it lists can run and in which order, so their groups' admins
approve it as well. The same rules decide the owners of each file in ``codeowners``.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..compiled import CompiledEstate
from ..models import Settings
from ..source import SourceMap
from .model import Approval, Approver, ObjectChange

SHARED_KINDS = ("settings", "pool", "profile", "price", "estate")
"""Kinds IT approves; a profile also needs the groups of the policies it lists."""


def settings_of(sources: SourceMap) -> Settings:
    """The estate's settings as written (handles and approvers are review data: they are not
    in the compiled estate, so the daemon does not reload when a handle changes)."""
    obj = sources.settings
    return (
        obj.model
        if obj is not None and isinstance(obj.model, Settings)
        else Settings.model_validate({})
    )


def group_chain(est: CompiledEstate | None, group: str) -> list[Approver]:
    """The admins of ``group`` and of every group above it, nearest first."""
    if est is None or (g := est.group(group)) is None:
        return []
    out = [Approver(u, g.name, "group") for u in g.admins]
    for name in g.ancestors:
        up = est.group(name)
        if up is not None:
            out += [Approver(u, up.name, "above") for u in up.admins]
    return out


def it_approvers(est: CompiledEstate | None, settings: Settings) -> list[Approver]:
    """IT: ``settings.approvers``, else the admins of each top group with groups below it."""
    if settings.approvers is not None:
        return [Approver(u, None, "it") for u in settings.approvers]
    if est is None:
        return []
    parents = {g.parent for g in est.groups if g.parent is not None}
    return [
        Approver(u, g.name, "it")
        for g in est.groups
        if g.parent is None and g.name in parents
        for u in g.admins
    ]


def _dedupe(found: Iterable[Approver], handles: dict[str, str]) -> tuple[Approver, ...]:
    seen: dict[str, Approver] = {}
    for a in found:
        if a.user not in seen:
            seen[a.user] = Approver(a.user, a.group, a.role, handles.get(a.user))
    return tuple(seen.values())


def _groups_of_policies(est: CompiledEstate | None, names: Iterable[str]) -> list[str]:
    if est is None:
        return []
    return [p.group for n in names if (p := est.policy(n)) is not None]


def touched_groups(
    c: ObjectChange, base: CompiledEstate | None, head: CompiledEstate | None
) -> tuple[list[str], list[str]]:
    """The groups a change touches, in the head and in the base (a rename: the old name)."""
    old = c.old_name or c.name
    if c.kind == "group":
        return [c.name], [old]
    if c.kind == "policy":
        return (_groups_of_policies(head, [c.name]), _groups_of_policies(base, [old]))
    if c.kind == "profile":
        hp = head.profile(c.name) if head else None
        bp = base.profile(old) if base else None
        return (
            _groups_of_policies(head, hp.policies if hp else []),
            _groups_of_policies(base, bp.policies if bp else []),
        )
    return [], []


def approvals(
    changes: Iterable[ObjectChange],
    base: CompiledEstate | None,
    head: CompiledEstate | None,
    base_src: SourceMap,
    head_src: SourceMap,
) -> tuple[Approval, ...]:
    """One ``Approval`` per change, in the changes' order. Groups are looked up on both
    sides, so moving a team to another department needs both departments' heads."""
    settings = settings_of(head_src if head is not None else base_src)
    handles = dict(settings.forge_handles)
    it = it_approvers(head if head is not None else base, settings)
    out = []
    for c in changes:
        in_head, in_base = touched_groups(c, base, head)
        found: list[Approver] = []
        for g in in_head:
            found += group_chain(head, g)
        for g in in_base:
            found += group_chain(base, g)
        if c.kind in SHARED_KINDS or not found:
            # IT first for its shared objects; a group with no admins anywhere above it
            # falls to IT rather than to nobody.
            found = it + found
        out.append(Approval(c.address, _dedupe(found, handles)))
    return tuple(out)
