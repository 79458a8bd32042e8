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
from klique_util.units import from_milli
from kliqued.engine import Task
from kliqued.engine.fair import share

from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.records import TaskRecord
from kliqued.daemon.units import gpus


@dataclass(frozen=True, slots=True)
class Tree:
    """What the views need about one revision's tree, looked up once per revision."""

    policies: dict[str, CPolicy]
    ancestors: dict[str, tuple[str, ...]]
    """Every group → its ancestors, parent first (groups with and without a policy)."""
    depth: dict[str, int]
    """Every group → how many groups are above it (a top group: 0)."""
    teams: dict[str, tuple[str, ...]]
    """Every policy → the groups of the teams (policies that are no envelope) it counts:
    itself for a team, its subtree's for an envelope; by name."""


_TREES: dict[str, Tree] = {}
_LOCK = Lock()


def tree(estate: CompiledEstate) -> Tree:
    """The :class:`Tree` of ``estate``, cached by revision (the last few)."""
    with _LOCK:
        hit = _TREES.get(estate.revision)
    if hit is not None:
        return hit
    teams: dict[str, list[str]] = {p.name: [] for p in estate.policies}
    for p in estate.policies:
        if not p.envelope:
            for level in p.levels or [p.name]:
                teams.setdefault(level, []).append(p.group)
    t = Tree(
        policies={p.name: p for p in estate.policies},
        ancestors={g.name: tuple(g.ancestors) for g in estate.groups},
        depth={g.name: len(g.ancestors) for g in estate.groups},
        teams={p: tuple(sorted(gs)) for p, gs in teams.items()},
    )
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
    return {
        "envelope": cp.envelope,
        "parent": levels[1] if len(levels) > 1 else None,
        "levels": levels,
        "depth": len(levels) - 1,
        "path": d.group_path.get(cp.group, cp.group),
        "shared_reservation": gpus(cp.shared_reservation_milli) if cp.envelope else None,
        "below": list(cp.below),
        "user_limit": gpus(cp.user_limit_milli),
    }


ReasonOf = Callable[[TaskRecord], "dict[str, str] | None"]
"""A queued task's waiting reason as the API's JSON (``views.reasons``)."""


class Waiting:
    """Who is waiting, for one answer: each team's queued work is counted once, however
    many envelopes above it the answer shows (a list of every policy shows a team at each
    of its levels), and each team's first task's reason is computed once."""

    def __init__(self, d: Daemon, reason: ReasonOf) -> None:
        self.d = d
        self.reason = reason
        self.teams: dict[str, tuple[int, int, Task | None]] = {}

    def team(self, team: str) -> tuple[int, int, Task | None]:
        """A team's queued tasks, their milli-GPUs, and its first waiting task: the queue
        head that waited longest (the smallest submission among its queues' heads)."""
        hit = self.teams.get(team)
        if hit is not None:
            return hit
        st = self.d.st()
        n = milli = 0
        first: Task | None = None
        for name in self.d.idx().groups[team].resources:
            q = st.queues.get(name)
            if q is None or not q.live:
                continue
            n += q.live
            milli += sum(size * k for size, k in q.sizes.items())
            head = next(iter(q), None)
            if head is not None and (first is None or head.seq < first.seq):
                first = head
        hit = self.teams[team] = (n, milli, first)
        return hit

    def of(self, policy: str) -> dict[str, Any]:
        """Who is waiting in ``policy``'s subtree (a team: itself): the queued tasks and
        their GPUs, in total and per team that has any, each team with the reason its first
        task gives. So a department head sees at once whether a team's own policy, the
        department's limit or budget, or the pools hold work back."""
        idx = self.d.idx()
        groups = []
        tasks = milli = 0
        for team in tree(idx.estate).teams[policy]:
            n, m, first = self.team(team)
            if not n:
                continue
            tasks += n
            milli += m
            rec = self.d.records.get(first.id) if first is not None else None
            groups.append(
                {
                    "group": team,
                    "policy": idx.groups[team].policy,
                    "tasks": n,
                    "gpus": gpus(m),
                    "reason": self.reason(rec) if rec is not None else None,
                }
            )
        return {"tasks": tasks, "gpus": gpus(milli), "groups": groups}


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
    return [
        {
            "group": g,
            "path": paths[g],
            "depth": t.depth.get(g, 0),
            "used": gpus(rolled[g]),
            **fair_share(d, g),
        }
        for g in order
    ]


def fair_share(d: Daemon, group: str) -> dict[str, float]:
    """lending.md "What the product shows": under ``settings.lending.order: fair``, a
    level's ``share`` (its borrowed GPUs / ``lend_weight``: the figure phases 3 and 4
    compare) and its ``lend_weight``, for a group with a policy; nothing otherwise, so the
    views of an estate that does not share fairly stay as they were."""
    idx = d.idx()
    gi = idx.groups.get(group)
    if not idx.fair or gi is None:
        return {}
    return {
        "share": round(float(share(idx, d.st(), group)), 6),
        "lend_weight": from_milli(gi.lend_weight),
    }
