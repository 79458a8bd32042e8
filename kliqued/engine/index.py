"""The per-revision lookup tables the engine works from.

A pass must not search lists of the compiled estate: at 10,000 compute resources that alone
would blow the time budget of a pass. Everything static about the estate (each compute
resource's pool order, its place in every pool's execution order, its policy's place on the
profile, its group's numbers) is computed once per compiled revision and cached by revision,
so the daemon and the simulator pay for it only when the estate changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from threading import Lock

from compiler.compiled import CBudget, CompiledEstate
from klique_util.units import SECOND_MS

from .periods import Period


@dataclass(frozen=True, slots=True)
class CRInfo:
    """A compute resource with everything a pass needs about it, resolved."""

    name: str
    policy: str
    profile: str
    group: str
    fixed_size: int | None
    """The profile's size in milli-GPUs; None for a ``from_task`` profile."""
    default_size: int
    max_size: int | None
    weight: int
    """Time weight in milli (budget milli-hours per hour)."""
    pools: tuple[str, ...]
    strict: bool
    policy_pos: int
    """Queuing priority: the policy's place on the profile (0 = first)."""
    exec_pos: dict[str, int] = field(hash=False, compare=False)
    """Execution priority: the profile's place in each of its pools' execution order."""
    first_exec_pos: int = 0
    """``exec_pos`` of the profile's first pool: phase 2 compares on it (engine.md)."""
    nodes: int = 1
    """A gang over this many machines of a pool that declares its nodes (issue 15)."""

    def size_for(self, requested: int | None) -> int:
        if self.fixed_size is not None:
            return self.fixed_size
        return self.default_size if requested is None else requested


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """A group with a policy: a team (its own compute resources) or an envelope (the policy
    of a group with groups below it, whose numbers apply to the whole subtree;
    organisation.md)."""

    name: str
    policy: str
    reservation: int
    limit: int
    budget: CBudget | None
    resources: tuple[str, ...]
    """Its compute resources, in name order (none for an envelope)."""
    levels: tuple[str, ...] = ()
    """The groups whose policies a task of this group is counted at: itself, then each
    envelope's group above it, nearest first (organisation.md "levels"). Flat: ``(name,)``."""
    envelope: bool = False
    subtree_resources: tuple[str, ...] = ()
    """The compute resources of every group of its subtree (a team: its own)."""
    user_limit: int | None = None
    """Most milli-GPUs one user of the group holds at once; None: no per-user limit."""
    project_rank: dict[str, int] | None = field(default=None, hash=False, compare=False)
    """With ``project_priority``: each listed project's place in the queue order (tasks of
    no listed project after them); None: submission order only."""
    outer: tuple[tuple[str, int, int], ...] = ()
    """``levels[1:]`` resolved: (group, reservation, limit) of each envelope above, nearest
    first. The limit and reservation checks run per candidate on the hot path; this spares
    them a lookup per level."""
    sized_by_task: tuple[str, ...] = ()
    """Its best_effort compute resources whose tasks choose their size, in name order: the
    first placeable task of one may change when the group places anything, so phases 1 and
    3 look at them again after each of its placements."""
    budgeted: tuple[tuple[str, CBudget, int], ...] = ()
    """The levels with a budget, nearest first: (group, budget, low watermark in ms). The
    start check runs at each of them; levels without a budget always pass it."""
    lend_weight: int = 1000
    """lending.md's ``lend_weight`` in milli: its share is borrowed / lend_weight."""
    protect_ms: int = 0
    """lending.md: how long its borrowed work is protected after placement (the policy's
    ``protect_for``, else the settings'); 0: not protected."""


@dataclass(frozen=True, slots=True)
class PoolInfo:
    name: str
    capacity: int
    resources: tuple[str, ...]
    """Compute resources whose profile lists this pool."""
    start_timeout: int = 0
    """Milliseconds a placed task may wait for a worker to take it; 0 = no limit."""
    autoscaled: bool = False
    """It takes placements with no live worker: its nodes come with the demand."""
    shapes: tuple[tuple[int, int], ...] = ()
    """Declared machines: (count, milli-GPUs each), in declared order; () when the pool
    declares none (placement then knows only its capacity)."""
    node_caps: tuple[int, ...] = ()
    """``shapes`` one entry per machine: the engine's node indices."""


@dataclass(frozen=True)
class EstateIndex:
    """Read-only, shared between passes; build with :meth:`build` (cached by revision)."""

    estate: CompiledEstate
    revision: str
    resources: dict[str, CRInfo]
    groups: dict[str, GroupInfo]
    """Groups that have a policy (only they can own compute resources)."""
    pools: dict[str, PoolInfo]
    users: dict[str, frozenset[str]]
    projects: dict[str, frozenset[str]]
    group_of_policy: dict[str, str]
    budget_periods: frozenset[Period]
    """The period kinds in use by some budget: a pass must run at each of their starts."""
    depth: int = 1
    """The most levels any group has: the rounds of phases 1 and 2 (organisation.md
    "innermost guarantee first"). A flat estate: 1."""
    group_levels: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Every group of the tree, with or without a policy → the groups with a policy that
    count its tasks (its own, if any, then each envelope above)."""
    shaped: bool = False
    """Some pool declares its machines (issue 15): submissions check the shapes."""
    teams_below: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """A group with no policy (it only groups others) → the teams of its subtree, whose
    counters sum to its totals (an envelope keeps counters of its own)."""
    fair: bool = False
    """``settings.lending.order: fair``: phase 3 by lowest share, then phase 4 (lending.md)."""
    least_lost_work: bool = False
    """``settings.lending.victims: least_lost_work``: victims by least lost work first."""
    protecting: bool = False
    """Some policy protects its borrowed work (``protect_for`` above 0)."""

    @staticmethod
    def build(estate: CompiledEstate) -> "EstateIndex":
        """The index of ``estate``; the same object for the same revision (a small cache)."""
        rev = estate.revision
        if rev:
            with _LOCK:
                hit = _CACHE.get(rev)
                if hit is not None:
                    return hit
        idx = _build(estate)
        if rev:
            with _LOCK:
                _CACHE[rev] = idx
                while len(_CACHE) > _CACHE_SIZE:
                    _CACHE.pop(next(iter(_CACHE)))
        return idx


_CACHE: dict[str, EstateIndex] = {}
_CACHE_SIZE = 8
_LOCK = Lock()


def _build(estate: CompiledEstate) -> EstateIndex:
    profiles = {p.name: p for p in estate.profiles}
    policies = {p.name: p for p in estate.policies}
    exec_pos: dict[str, dict[str, int]] = {}
    for pool in estate.pools:
        for i, prof_name in enumerate(pool.execution_order):
            exec_pos.setdefault(prof_name, {})[pool.name] = i
    resources: dict[str, CRInfo] = {}
    by_group: dict[str, list[str]] = {}
    by_pool: dict[str, list[str]] = {p.name: [] for p in estate.pools}
    for cr in estate.compute_resources:
        prof = profiles[cr.profile]
        pos = exec_pos.get(prof.name, {})
        # A pool missing from an execution order cannot happen in a compiled estate; the
        # fallback keeps a hand-built estate usable (after every listed profile).
        epos = {pl: pos.get(pl, len(pos)) for pl in prof.pools}
        ft = prof.from_task
        info = CRInfo(
            name=cr.name,
            policy=cr.policy,
            profile=cr.profile,
            group=cr.group,
            fixed_size=prof.gpus_milli if ft is None else None,
            default_size=ft.default_milli if ft is not None else (prof.gpus_milli or 0),
            max_size=ft.max_milli if ft is not None else None,
            weight=prof.time_weight_milli,
            pools=tuple(prof.pools),
            strict=prof.queueing == "strict",
            policy_pos=prof.policies.index(cr.policy) if cr.policy in prof.policies else 0,
            exec_pos=epos,
            first_exec_pos=epos[prof.pools[0]] if prof.pools else 0,
            nodes=prof.nodes,
        )
        resources[cr.name] = info
        by_group.setdefault(cr.group, []).append(cr.name)
        for pl in prof.pools:
            by_pool.setdefault(pl, []).append(cr.name)
    lending = estate.settings.lending
    group_of = {p.name: p.group for p in estate.policies}
    cgroups = {g.name: g for g in estate.groups}
    subtree_res: dict[str, list[str]] = {}
    for pol in estate.policies:
        levels = [group_of[x] for x in (pol.levels or [pol.name]) if x in group_of]
        for lv in levels:
            subtree_res.setdefault(lv, []).extend(by_group.get(pol.group, []))
    groups: dict[str, GroupInfo] = {}
    for pol in estate.policies:
        cg = cgroups.get(pol.group)
        rank = (
            {p: i for i, p in enumerate(cg.project_order)}
            if cg is not None and cg.project_priority and cg.project_order
            else None
        )
        chain = tuple(group_of[x] for x in (pol.levels or [pol.name]) if x in group_of)
        groups[pol.group] = GroupInfo(
            name=pol.group,
            policy=pol.name,
            reservation=pol.reservation_milli,
            limit=pol.limit_milli,
            budget=pol.budget,
            resources=tuple(sorted(by_group.get(pol.group, []))),
            levels=chain or (pol.group,),
            envelope=pol.envelope,
            subtree_resources=tuple(sorted(set(subtree_res.get(pol.group, [])))),
            user_limit=pol.user_limit_milli,
            project_rank=rank,
            lend_weight=pol.lend_weight_milli,
            protect_ms=SECOND_MS
            * (pol.protect_for_s if pol.protect_for_s is not None else lending.protect_for_s),
        )
    for name, group_info in groups.items():
        groups[name] = replace(
            group_info,
            outer=tuple((x, groups[x].reservation, groups[x].limit) for x in group_info.levels[1:]),
            budgeted=tuple(
                (x, b, b.low_watermark_s * SECOND_MS)
                for x in group_info.levels
                if (b := groups[x].budget) is not None
            ),
            sized_by_task=tuple(
                n
                for n in group_info.resources
                if not resources[n].strict and resources[n].fixed_size is None
            ),
        )
    group_levels: dict[str, tuple[str, ...]] = {}
    for g in estate.groups:
        up = [g.name] + list(g.ancestors)
        group_levels[g.name] = tuple(
            x for x in up if x in groups and (x == g.name or groups[x].envelope)
        )
    teams_below: dict[str, list[str]] = {}
    for g in estate.groups:
        gi = groups.get(g.name)
        if gi is None or gi.envelope:
            continue
        for a in g.ancestors:
            if a not in groups:
                teams_below.setdefault(a, []).append(g.name)
    pools = {
        p.name: PoolInfo(
            p.name,
            p.capacity_milli,
            tuple(by_pool.get(p.name, [])),
            p.start_timeout_s * 1000,
            p.autoscale is not None,
            tuple((n.count, n.gpus_milli) for n in p.nodes),
            tuple(n.gpus_milli for n in p.nodes for _ in range(n.count)),
        )
        for p in estate.pools
    }
    return EstateIndex(
        estate=estate,
        revision=estate.revision,
        resources=resources,
        groups=groups,
        pools=pools,
        users={g.name: frozenset(g.users) for g in estate.groups},
        projects={g.name: frozenset(g.projects) for g in estate.groups},
        group_of_policy={p.name: p.group for p in estate.policies},
        budget_periods=frozenset(p.budget.period for p in policies.values() if p.budget),
        depth=max((len(gi.levels) for gi in groups.values()), default=1),
        group_levels=group_levels,
        teams_below={a: tuple(sorted(ts)) for a, ts in teams_below.items()},
        shaped=any(p.shapes for p in pools.values()),
        fair=lending.order == "fair",
        least_lost_work=lending.victims == "least_lost_work",
        protecting=any(gi.protect_ms > 0 for gi in groups.values()),
    )
