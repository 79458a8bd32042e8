"""The organisation tree in the API's JSON (organisation.md, issue 12): a policy's place in
the tree, who is waiting in a subtree, and a pool's GPUs by level.

A department head reads their department from the same ``/v1/policies`` and ``/v1/pools``
as everyone else; these are the fields that make the tree visible there. They only read the
engine's counters (an envelope's ``used`` and meter already cover its subtree) and the queues,
so they cost what the subtree holds, never a scan of every task.
"""

from __future__ import annotations

from dataclasses import dataclass
from threading import Lock
from typing import Any, Callable

from compiler.compiled import CompiledEstate, CPolicy
from kliqued.engine import Task

from .core import Daemon
from .records import TaskRecord
from .units import gpus


@dataclass(frozen=True, slots=True)
class Tree:
    """What the views need about one revision's tree, looked up once per revision."""

    policies: dict[str, CPolicy]
    ancestors: dict[str, tuple[str, ...]]
    """Every group → its ancestors, parent first (groups with and without a policy)."""
    depth: dict[str, int]
    """Every group → how many groups are above it (a top group: 0)."""


_TREES: dict[str, Tree] = {}
_LOCK = Lock()


def tree(estate: CompiledEstate) -> Tree:
    """The :class:`Tree` of ``estate``, cached by revision (the last few)."""
    with _LOCK:
        hit = _TREES.get(estate.revision)
    if hit is not None:
        return hit
    t = Tree(policies={p.name: p for p in estate.policies},
             ancestors={g.name: tuple(g.ancestors) for g in estate.groups},
             depth={g.name: len(g.ancestors) for g in estate.groups})
    with _LOCK:
        _TREES[estate.revision] = t
        while len(_TREES) > 4:
            _TREES.pop(next(iter(_TREES)))
    return t


def place(d: Daemon, name: str) -> dict[str, Any]:
    """A policy's place in the tree: whether it is an envelope, the envelope just above it
    (``parent``), the policies a task of its group is counted at (``levels``, itself first),
    how many envelopes are above it (``depth``), its group's path, and for an envelope its
    shared reservation and the policies just below it."""
    cp = tree(d.idx().estate).policies[name]
    levels = list(cp.levels) or [name]
    return {"envelope": cp.envelope, "parent": levels[1] if len(levels) > 1 else None,
            "levels": levels, "depth": len(levels) - 1,
            "path": d.group_path.get(cp.group, cp.group),
            "shared_reservation": gpus(cp.shared_reservation_milli) if cp.envelope else None,
            "below": list(cp.below), "user_limit": gpus(cp.user_limit_milli)}


ReasonOf = Callable[[TaskRecord], "dict[str, str] | None"]
"""A queued task's waiting reason as the API's JSON (``views.reasons``)."""


def waiting(d: Daemon, group: str, reason: ReasonOf) -> dict[str, Any]:
    """Who is waiting in ``group``'s subtree (a team: itself): the queued tasks and their
    GPUs, in total and per team that has any, each team with the reason (``reason``: the
    caller's JSON of it) its first waiting task gives: the queue head that waited longest.
    So a department head sees at once whether a team's own policy, the department's limit
    or budget, or the pools hold work back."""
    idx, st = d.idx(), d.st()
    per: dict[str, list[int]] = {}
    first: dict[str, Task] = {}
    for name in idx.groups[group].subtree_resources:
        q = st.queues.get(name)
        if q is None or not q.live:
            continue
        team = idx.resources[name].group
        row = per.setdefault(team, [0, 0])
        row[0] += q.live
        row[1] += sum(size * n for size, n in q.sizes.items())
        head = next(iter(q), None)
        if head is not None and (team not in first or head.seq < first[team].seq):
            first[team] = head
    groups = []
    for team in sorted(per):
        head = first.get(team)
        rec = d.records.get(head.id) if head is not None else None
        groups.append({"group": team, "policy": idx.groups[team].policy,
                       "tasks": per[team][0], "gpus": gpus(per[team][1]),
                       "reason": reason(rec) if rec is not None else None})
    return {"tasks": sum(r[0] for r in per.values()),
            "gpus": gpus(sum(r[1] for r in per.values())), "groups": groups}


def by_level(d: Daemon, pool: str, sees: Callable[[str], bool]) -> list[dict[str, Any]]:
    """The GPUs used on ``pool`` by each group of the tree, rolled up (a department counts
    its teams, a business unit its departments), top first, each group followed by the
    groups below it; only groups ``sees`` admits and that use the pool."""
    t = tree(d.idx().estate)
    rolled: dict[str, int] = {}
    for g, milli in d.st().pool_group_used.get(pool, {}).items():
        if milli <= 0:
            continue
        for x in (g, *t.ancestors.get(g, ())):
            rolled[x] = rolled.get(x, 0) + milli
    paths = {g: d.group_path.get(g, g) for g in rolled if sees(g)}
    order = sorted(paths, key=lambda g: paths[g].split("/"))
    return [{"group": g, "path": paths[g], "depth": t.depth.get(g, 0),
             "used": gpus(rolled[g])} for g in order]
