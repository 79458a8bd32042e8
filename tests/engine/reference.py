"""A reference engine, written from ../shared/spec/engine.md, organisation.md and lending.md for
the tests only.

It is meant to be obviously correct, not fast: no incremental counters, no parked queues, no
wake-ups, no envelope counters. Every decision recomputes what it needs from a plain snapshot
of the tasks, so a missed wake-up or a stale counter in the real engine (kliqued/engine) shows
up as a difference between the two. It reads the estate from the COMPILED estate
(``index.estate``: pools, profiles, policies with their ``levels``, groups with their
``ancestors``), never from the engine's lookup tables, so a wrong index shows up too; and it
sums every level's usage, rate and budget over the level's subtree itself.

It covers phases 0 to 3, the order among competitors (with project priority), the rounds of
phases 1 and 2 from the innermost level outward, limits and budget start checks at every
level, the per-user limit, reclaim with eligibility across levels and sparing, and the repeat
at one moment; and lending.md: protection of young work (per task, from its current
placement, the policy's ``protect_for`` over the settings', ignored by phase 0), victims by
least lost work (checkpoints every ``C`` from ``placed_at`` and reported ones), the lost work
of every preemption, shares, phase 3 in fair order (walking down the organisation by lowest
share) and phase 4's rebalance. It does not meter budgets: the snapshot reads what each group spent from the
engine's per-group meters (compared by other tests) and sums them per level. It gives no
reasons or alerts but one: the protection end of a reclaim held back by protection
(``protected_until``); preemption texts are kept in ``RState.texts``.

Read it beside engine.md and organisation.md: each function names the paragraph it implements.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from compiler.compiled import CLending, CompiledEstate, CPolicy
from klique_util.units import HOUR_MS, SECOND_MS

from kliqued.engine import EstateIndex, State
from kliqued.engine.periods import Period
from tests.harness.typed import present


@dataclass
class RTask:
    id: str
    resource: str
    group: str
    size: int
    weight: int
    seq: int
    """Submission order; a preempted task keeps its original."""
    ran_before: bool
    pool: str | None = None
    """The pool it is placed on, or None while queued."""
    placed_order: int = 0
    """Larger is newer ("at one moment, the later placed is the newer")."""
    orphan: bool = False
    user: str = "u"
    project: str | None = None
    placed_at: int | None = None
    """The start of its current placement (lending.md), None while queued."""
    checkpoint_every: int = 0
    """A scenario's ``checkpoint: C`` in ms (0: none): it checkpoints at placed_at + C, + 2C..."""
    checkpoint_at: int | None = None
    """Its last reported checkpoint in its current placement."""


@dataclass(frozen=True)
class RResource:
    name: str
    policy: str
    profile: str
    group: str
    pools: tuple[str, ...]
    strict: bool
    policy_pos: int


@dataclass(frozen=True)
class Org:
    """The compiled estate as the reference reads it."""

    resources: dict[str, RResource]
    policies: dict[str, CPolicy]
    levels: dict[str, tuple[str, ...]]
    """Per policy: itself, then each envelope above it (organisation.md "levels")."""
    subtree: dict[str, frozenset[str]]
    """Per policy: the groups of its group's subtree."""
    teams: dict[str, frozenset[str]]
    """Per policy: the teams of its subtree, the groups whose policy is not an envelope: only
    they hold tasks, and only their meters are summed (the engine keeps meters of its own for
    envelope groups, and a group left with nothing below it keeps its old one until the
    next pass binds the new estate: ``spent_by`` skips it)."""
    chain: dict[str, tuple[str, ...]]
    """Per group: its policy's levels (empty for a group with no policy)."""
    project_order: dict[str, tuple[str, ...]]
    """Per group with project priority: its projects, first = queued first."""
    capacity: dict[str, int]
    exec_pos: dict[tuple[str, str], int]
    """(pool, profile): the profile's place in the pool's execution order."""
    depth: int
    """The most levels any policy has: the rounds of phases 1 and 2."""
    lending: CLending = CLending()
    """settings.lending (lending.md)."""
    protect_ms: dict[str, int] = field(default_factory=dict)
    """Per policy: its own ``protect_for``, else the settings', in ms."""

    @staticmethod
    def of(estate: CompiledEstate) -> "Org":
        hit = _ORGS.get(estate.revision)
        if hit is not None:
            return hit
        policies = {p.name: p for p in estate.policies}
        profiles = {p.name: p for p in estate.profiles}
        resources = {}
        for cr in estate.compute_resources:
            prof = profiles[cr.profile]
            resources[cr.name] = RResource(
                cr.name,
                cr.policy,
                cr.profile,
                cr.group,
                tuple(prof.pools),
                prof.queueing == "strict",
                prof.policies.index(cr.policy) if cr.policy in prof.policies else 0,
            )
        levels = {p.name: tuple(p.levels) or (p.name,) for p in estate.policies}
        subtree = {
            p.name: frozenset(
                g.name for g in estate.groups if g.name == p.group or p.group in g.ancestors
            )
            for p in estate.policies
        }
        holders = {
            g.name
            for g in estate.groups
            if g.policy in policies and not policies[g.policy].envelope
        }
        teams = {name: frozenset(groups & holders) for name, groups in subtree.items()}
        chain = {g.name: levels[g.policy] if g.policy in levels else () for g in estate.groups}
        project_order = {
            g.name: tuple(g.project_order) for g in estate.groups if g.project_priority
        }
        exec_pos = {}
        for pool in estate.pools:
            for prof_name in profiles:
                order = pool.execution_order
                exec_pos[(pool.name, prof_name)] = (
                    order.index(prof_name) if prof_name in order else len(order)
                )
        lending = estate.settings.lending
        protect_ms = {
            p.name: SECOND_MS
            * (p.protect_for_s if p.protect_for_s is not None else lending.protect_for_s)
            for p in estate.policies
        }
        org = Org(
            resources,
            policies,
            levels,
            subtree,
            teams,
            chain,
            project_order,
            {p.name: p.capacity_milli for p in estate.pools},
            exec_pos,
            max((len(x) for x in levels.values()), default=1),
            lending,
            protect_ms,
        )
        _ORGS[estate.revision] = org
        return org


_ORGS: dict[str, Org] = {}


@dataclass
class RState:
    org: Org
    tasks: dict[str, RTask]
    remaining: dict[str, int]
    """Per policy with a budget (teams and envelopes): budget units left in the period at
    this moment, summed over the policy's subtree."""
    unavailable: frozenset[str] = frozenset()
    now: int = 0
    order_counter: int = 0
    decisions: list[tuple] = field(default_factory=list)
    texts: list[tuple[str, str]] = field(default_factory=list)
    """(task, text) of every preemption, as a person reads it."""


def snapshot(index: EstateIndex, state: State, now: int) -> RState:
    """The real engine's state as plain records (queued and placed tasks only)."""
    org = Org.of(index.estate)
    tasks: dict[str, RTask] = {}
    for t in state.tasks.values():
        if t.state == "ended":
            continue
        placed = t.state == "placed"
        tasks[t.id] = RTask(
            t.id,
            t.resource,
            t.group,
            t.size,
            t.weight,
            t.seq,
            t.ran_before,
            t.pool if placed else None,
            t.place_seq if placed else 0,
            t.orphan,
            t.user,
            t.project,
            t.placed_at if placed else None,
            t.checkpoint_every,
            t.checkpoint_at if placed else None,
        )
    remaining = {}
    for name, pol in org.policies.items():
        if pol.budget is not None:
            spent = spent_by(state, org.teams[name], pol.budget.period, now)
            remaining[name] = pol.budget.hours_milli * HOUR_MS - spent
    top = max((t.placed_order for t in tasks.values()), default=0)
    return RState(org, tasks, remaining, frozenset(state.unavailable), now, top)


# ------------------------------------------------------------------ reading the snapshot
def spent_by(state: State, teams: frozenset[str] | set[str], period: Period, now: int) -> int:
    """Budget units the ``teams`` spent in the period, from the engine's per-group meters.

    organisation.md, Estate changes: a moved group takes the weighted hours it spent to its
    new envelope. An envelope never holds a task, so a group that was one under the estate
    the meters were kept for (a department whose last team moved away, before the next pass
    binds the new estate) spent nothing of its own: its meter is its old subtree's sum, which
    the teams count already.
    """
    kept_for = state.index
    total = 0
    for g in teams:
        gi = kept_for.groups.get(g) if kept_for is not None else None
        if gi is not None and gi.envelope:
            continue
        total += state.weighted_units(g, period, now)
    return total


def placed_in(rs: RState, pol: str) -> list[RTask]:
    """organisation.md: the placed tasks of the level's subtree."""
    groups = rs.org.subtree[pol]
    return [t for t in rs.tasks.values() if t.pool is not None and t.group in groups]


def used(rs: RState, pol: str) -> int:
    return sum(t.size for t in placed_in(rs, pol))


def free(rs: RState, pool: str) -> int:
    return rs.org.capacity[pool] - sum(t.size for t in rs.tasks.values() if t.pool == pool)


def levels(rs: RState, t: RTask) -> tuple[str, ...]:
    return rs.org.levels[rs.org.resources[t.resource].policy]


def queue(rs: RState, resource: str) -> list[RTask]:
    """Terms: preempted tasks first in their original order; then (project priority) by the
    position of the task's project, tasks of no listed project last; then submission."""
    q = [t for t in rs.tasks.values() if t.resource == resource and t.pool is None]
    order = rs.org.project_order.get(rs.org.resources[resource].group, ())

    def key(t: RTask) -> tuple:
        proj = 0
        if order and not t.ran_before:
            proj = order.index(t.project) if t.project in order else len(order)
        return (not t.ran_before, proj, t.seq, t.id)

    return sorted(q, key=key)


def within_at(rs: RState, t: RTask, x: str) -> bool:
    return used(rs, x) + t.size <= rs.org.policies[x].reservation_milli


def within_reservation(rs: RState, t: RTask, k: int) -> bool:
    """Within reservation at some level among the task's first ``k + 1`` levels."""
    return any(within_at(rs, t, x) for x in levels(rs, t)[: k + 1])


def within_limits(rs: RState, t: RTask) -> bool:
    return all(used(rs, x) + t.size <= rs.org.policies[x].limit_milli for x in levels(rs, t))


def user_held(rs: RState, t: RTask) -> bool:
    """User limit: ``used(g, user) + s > user_limit(g)``."""
    limit = rs.org.policies[levels(rs, t)[0]].user_limit_milli
    if limit is None:
        return False
    mine = sum(
        x.size
        for x in rs.tasks.values()
        if x.pool is not None and x.group == t.group and x.user == t.user
    )
    return mine + t.size > limit


def start_check(rs: RState, t: RTask) -> bool:
    """Time budgets, "Start check", at every budgeted level."""
    if t.weight == 0:
        return True
    for x in levels(rs, t):
        b = rs.org.policies[x].budget
        if b is None:
            continue
        left = rs.remaining[x]
        if left <= 0:
            return False
        placed = placed_in(rs, x)
        if not any(p.weight > 0 for p in placed):
            continue  # the one-task exception, per level
        rate = sum(p.weight for p in placed)
        # remaining / (rate + w) >= low_watermark, hours on both sides: in units of weight
        # milli x ms, remaining >= (rate + w) * low_watermark_ms.
        if left < (rate + t.weight) * b.low_watermark_s * SECOND_MS:
            return False
    return True


def first_fit(rs: RState, t: RTask) -> str | None:
    for p in rs.org.resources[t.resource].pools:
        if p not in rs.unavailable and free(rs, p) >= t.size:
            return p
    return None


# ------------------------------------------------------------------ lending.md
def protected(rs: RState, t: RTask) -> bool:
    """Protection: ``now - placed_at < protect_for(its group's policy)``, the policy's value
    else the settings'; at exactly ``placed_at + protect_for`` no longer protected."""
    cr = rs.org.resources.get(t.resource)
    pm = rs.org.protect_ms.get(cr.policy, 0) if cr is not None else 0
    return t.placed_at is not None and pm > 0 and rs.now - t.placed_at < pm


def lost_work(rs: RState, t: RTask) -> int:
    """Least lost work first: the placed time since its last checkpoint in its current
    placement (every ``C`` from ``placed_at``, or one reported), else since ``placed_at``; a
    checkpoint at this very moment counts (lost 0)."""
    assert t.placed_at is not None
    since = t.placed_at
    if t.checkpoint_every > 0:
        since += (rs.now - t.placed_at) // t.checkpoint_every * t.checkpoint_every
    if t.checkpoint_at is not None:
        since = max(since, t.checkpoint_at)
    return rs.now - since


def victim_key(rs: RState, v: RTask) -> tuple:
    """``newest``: newest placement first (engine.md); ``least_lost_work``: least lost work
    first, ties to the newest placement, then task id."""
    if rs.org.lending.victims == "least_lost_work":
        return (lost_work(rs, v), -v.placed_order, v.id)
    return (-v.placed_order,)


def share(rs: RState, x: str) -> Fraction:
    """Fair shares: ``max(0, used(x) - reservation(x)) / lend_weight(x)``."""
    pol = rs.org.policies[x]
    return Fraction(max(0, used(rs, x) - pol.reservation_milli), pol.lend_weight_milli)


def top_down(rs: RState, t: RTask) -> tuple[str, ...]:
    return tuple(reversed(levels(rs, t)))


def diverging(rs: RState, t: RTask, v: RTask) -> tuple[str, str]:
    """The first position where the two tasks' levels, written from the top down, differ:
    one level on each side."""
    a, b = top_down(rs, t), top_down(rs, v)
    for x, y in zip(a, b):
        if x != y:
            return x, y
    raise AssertionError(f"{t.id} and {v.id} have no diverging levels: {a} {b}")


def fair_pick(rs: RState, cands: list[tuple[tuple, RTask, str]]) -> tuple[tuple, RTask, str]:
    """Phase 3 with ``fair``: among the top levels that hold candidates, the lowest share;
    inside it, again the lowest share among its levels that hold candidates; down to a group,
    whose candidates go in engine.md's order. Equal shares: the level whose first candidate
    (by engine.md's order, ``cands``' keys) goes first."""
    depth = 0
    while len({levels(rs, c[1])[0] for c in cands}) > 1:
        by: dict[str, list[tuple[tuple, RTask, str]]] = {}
        for c in cands:
            by.setdefault(top_down(rs, c[1])[depth], []).append(c)
        best = min(by, key=lambda x: (share(rs, x), min(c[0] for c in by[x])))
        cands = by[best]
        depth += 1
    return min(cands, key=lambda c: c[0])


# ------------------------------------------------------------------ changing the snapshot
def place(rs: RState, t: RTask, pool: str, phase: str) -> None:
    rs.order_counter += 1
    t.pool, t.placed_order = pool, rs.order_counter
    t.placed_at, t.checkpoint_at = rs.now, None
    rs.decisions.append(("place", t.id, pool, phase))


def preempt(rs: RState, t: RTask, kind: str, by: str | None, text: str) -> None:
    """Every preemption records its size and lost work (lending.md: lost GPU-hours are size
    x lost work at that moment)."""
    lost = lost_work(rs, t)
    t.pool, t.placed_order, t.ran_before = None, 0, True
    t.placed_at, t.checkpoint_at = None, None
    rs.decisions.append(("preempt", t.id, kind, by, t.size, lost))
    rs.texts.append((t.id, text))


# ------------------------------------------------------------------ the phases
def order_key(rs: RState, t: RTask, pool: str) -> tuple:
    """Order among competitors: execution position in the pool, policy position on the
    profile, submission order, task id."""
    cr = rs.org.resources[t.resource]
    return (rs.org.exec_pos[(pool, cr.profile)], cr.policy_pos, t.seq, t.id)


def placeable(rs: RState, t: RTask, phase: str, k: int) -> str | None:
    """The pool ``t`` would go to in phase 1 ("reserve", round ``k``) or 3 ("lend")."""
    if phase == "reserve" and not within_reservation(rs, t, k):
        return None
    if not within_limits(rs, t) or not start_check(rs, t):
        return None
    return first_fit(rs, t)


def fill(rs: RState, phase: str, k: int = 0) -> None:
    """Phases 1 and 3: repeatedly place the candidate that goes first, then recompute. A task
    its user's limit holds is passed over as if it were not in the queue. Phase 3 with
    ``order: fair`` picks by lowest share instead (lending.md), shares recomputed after every
    placement."""
    fair = phase == "lend" and rs.org.lending.order == "fair"
    while True:
        cands: list[tuple[tuple, RTask, str]] = []
        for name, cr in rs.org.resources.items():
            for t in queue(rs, name):
                if user_held(rs, t):
                    continue
                pool = placeable(rs, t, phase, k)
                if pool is not None:
                    cands.append((order_key(rs, t, pool), t, pool))
                    break
                if cr.strict:
                    break  # strict: only the head
        if not cands:
            return
        best = fair_pick(rs, cands) if fair else min(cands, key=lambda c: c[0])
        place(rs, best[1], best[2], phase)


def choose_victims(rs: RState, pool: str, t: RTask) -> list[RTask] | None:
    """Reclaim in one pool (organisation.md): eligible, useful victims in the ``victims``
    order (lending.md; newest placement first by default) until room in ``pool`` and every
    level's limit hold; then spare from the last chosen to the first. None when the
    constraints cannot be met. A protected task is not eligible (lending.md)."""
    org = rs.org
    mine = levels(rs, t)
    inner = next(x for x in mine if within_at(rs, t, x))
    inside = org.subtree[inner]
    base_free = free(rs, pool)
    base_used = {x: used(rs, x) for x in org.policies}

    def freed_in(chosen: list[RTask], x: str) -> int:
        return sum(c.size for c in chosen if c.group in org.subtree[x])

    def room_short(chosen: list[RTask]) -> bool:
        return base_free + sum(c.size for c in chosen if c.pool == pool) < t.size

    def limit_short(chosen: list[RTask], y: str) -> bool:
        return base_used[y] - freed_in(chosen, y) + t.size > org.policies[y].limit_milli

    def holds(chosen: list[RTask]) -> bool:
        return not room_short(chosen) and not any(limit_short(chosen, y) for y in mine)

    chosen: list[RTask] = []
    if holds(chosen):
        return chosen
    placed = sorted(
        (
            x
            for x in rs.tasks.values()
            if x.pool is not None and x.group != t.group and not x.orphan and x.size > 0
        ),
        key=lambda x: victim_key(rs, x),
    )
    for v in placed:
        if v.group in inside or protected(rs, v):
            continue
        if any(
            base_used[z] - freed_in(chosen, z) - v.size < org.policies[z].reservation_milli
            for z in levels(rs, v)
            if z not in mine
        ):
            continue
        useful = (v.pool == pool and room_short(chosen)) or any(
            v.group in org.subtree[y] and limit_short(chosen, y) for y in mine
        )
        if not useful:
            continue
        chosen.append(v)
        if holds(chosen):
            break
    if not holds(chosen):
        return None
    for v in list(reversed(chosen)):
        rest = [c for c in chosen if c is not v]
        if holds(rest):
            chosen = rest
    return chosen


def reclaim(rs: RState, k: int = 0) -> None:
    """Phase 2, round ``k``."""
    gave_up: set[str] = set()
    while True:
        best: tuple | None = None
        for name, cr in rs.org.resources.items():
            if name in gave_up:
                continue
            for t in queue(rs, name):
                if user_held(rs, t):
                    continue
                if within_reservation(rs, t, k):
                    key = order_key(rs, t, cr.pools[0]) if cr.pools else None
                    if key is not None and (best is None or key < best[0]):
                        best = (key, t)
                    break
                if cr.strict:
                    break
        if best is None:
            return
        t = best[1]
        cr = rs.org.resources[t.resource]
        if not start_check(rs, t):
            gave_up.add(cr.name)  # fails its budget start check: triggers no reclaim
            continue
        pool = first_fit(rs, t) if within_limits(rs, t) else None
        if pool is not None:
            place(rs, t, pool, "reclaim")
            continue
        for p in cr.pools:
            if p in rs.unavailable:
                continue
            victims = choose_victims(rs, p, t)
            if victims is not None:
                for v in victims:
                    preempt(rs, v, "reclaimed", t.group, f"reclaimed by {t.group}")
                place(rs, t, p, "reclaim")
                break
        else:
            gave_up.add(cr.name)


def rebalance_candidate(rs: RState, resource: str) -> RTask | None:
    """Phase 4's candidate of a compute resource after phase 3: strict, its head; best_effort,
    its first task that phase 3 could place but for room, and only that one. It must pass
    every level's limit, its user's limit and the budget start check (only room is short)."""
    cr = rs.org.resources[resource]
    for t in queue(rs, resource):
        if user_held(rs, t):
            continue
        if within_limits(rs, t) and start_check(rs, t):
            return t
        if cr.strict:
            return None
    return None


def rebalance_victims(rs: RState, pool: str, t: RTask) -> list[RTask] | None:
    """Phase 4's victims for ``t`` in ``pool``, as a reclaim looks for them: tried in order of
    the share of their diverging level (before this attempt) highest first, then in the
    ``victims`` order; eligible only if (with ``chosen`` counting ``v``) every level of its
    group that is not a level of ``t`` keeps ``used - chosen >= reservation``, it is not
    protected, and at the diverging levels X (of ``t``) and Y (of ``v``)
    ``max(0, used(X) + s - res(X)) / w(X) <= (used(Y) - chosen(Y) - res(Y)) / w(Y)``, used(X)
    before the attempt. Stop when ``t`` fits; spare from the last chosen back; None when the
    pool cannot be freed enough."""
    org = rs.org
    mine = set(levels(rs, t))
    base_free = free(rs, pool)
    base_used = {x: used(rs, x) for x in org.policies}
    before = {x: share(rs, x) for x in org.policies}

    def freed_in(chosen: list[RTask], x: str) -> int:
        return sum(c.size for c in chosen if c.group in org.subtree[x])

    def fits(chosen: list[RTask]) -> bool:
        return base_free + sum(c.size for c in chosen) >= t.size

    def eligible(v: RTask, chosen: list[RTask]) -> bool:
        after = chosen + [v]
        for z in levels(rs, v):
            if z not in mine and (
                base_used[z] - freed_in(after, z) < org.policies[z].reservation_milli
            ):
                return False
        if protected(rs, v):
            return False
        x, y = diverging(rs, t, v)
        px, py = org.policies[x], org.policies[y]
        taker = Fraction(max(0, base_used[x] + t.size - px.reservation_milli), px.lend_weight_milli)
        giver = Fraction(
            base_used[y] - freed_in(after, y) - py.reservation_milli, py.lend_weight_milli
        )
        return taker <= giver

    on_pool = [
        v
        for v in rs.tasks.values()
        if v.pool == pool and v.group != t.group and not v.orphan and v.size > 0
    ]
    on_pool.sort(key=lambda v: (-before[diverging(rs, t, v)[1]], victim_key(rs, v)))
    chosen: list[RTask] = []
    for v in on_pool:
        if fits(chosen):
            break
        if eligible(v, chosen):
            chosen.append(v)
    if not fits(chosen):
        return None
    for v in list(reversed(chosen)):
        rest = [c for c in chosen if c is not v]
        if fits(rest):
            chosen = rest
    return chosen


def rebalance(rs: RState) -> None:
    """Phase 4 (``order: fair`` only): the candidates are fixed when it starts; each is taken
    once, in phase 3's order with key (1) on the profile's first pool, recomputed after each
    placement; skipped if at its turn it is no longer its compute resource's candidate. One
    that fits is placed without preempting; otherwise victims in the first pool of its
    profile's order that can be freed enough, reason ``rebalanced for <group>``."""
    remaining: list[RTask] = []
    for name in rs.org.resources:
        c = rebalance_candidate(rs, name)
        if c is not None:
            remaining.append(c)
    while remaining:
        entries = [
            (order_key(rs, t, rs.org.resources[t.resource].pools[0]), t, "")
            for t in remaining
            if rs.org.resources[t.resource].pools
        ]
        if not entries:
            return
        t = fair_pick(rs, entries)[1]
        remaining.remove(t)
        if rebalance_candidate(rs, t.resource) is not t:
            continue
        pool = first_fit(rs, t)
        if pool is not None:
            place(rs, t, pool, "rebalance")
            continue
        for p in rs.org.resources[t.resource].pools:
            if p in rs.unavailable:
                continue
            victims = rebalance_victims(rs, p, t)
            if victims is not None:
                for v in victims:
                    preempt(rs, v, "rebalanced", t.group, f"rebalanced for {t.group}")
                place(rs, t, p, "rebalance")
                break


def protected_until(rs: RState, t: RTask) -> int | None:
    """lending.md's reason: for a waiting task whose reclaim is held back by protection, the
    first moment a protection ends at which the reclaim (judged at that moment, with the usage
    of now) could free a pool for it; None when none would, or when it would trigger no
    reclaim (not its compute resource's task within reservation in phase 2, or held by a
    level's limit or its budget start check) or can be reclaimed now."""
    if t.pool is not None or t.resource not in rs.org.resources:
        return None
    cr = rs.org.resources[t.resource]
    trigger = None  # the task phase 2 would take from its compute resource
    for x in queue(rs, t.resource):
        if user_held(rs, x):
            continue
        if within_reservation(rs, x, rs.org.depth):
            trigger = x
            break
        if cr.strict:
            break
    if trigger is not t or not within_limits(rs, t) or not start_check(rs, t):
        return None
    pools = [p for p in cr.pools if p not in rs.unavailable]
    if any(choose_victims(rs, p, t) is not None for p in pools):
        return None
    ends = sorted(
        {
            present(v.placed_at) + rs.org.protect_ms[rs.org.resources[v.resource].policy]
            for v in rs.tasks.values()
            if v.pool is not None and protected(rs, v)
        }
    )
    now = rs.now
    try:
        for end in ends:
            rs.now = end  # the reclaim judged at that moment, with the usage of now
            if any(choose_victims(rs, p, t) is not None for p in pools):
                return end
    finally:
        rs.now = now
    return None


def budgets(rs: RState) -> None:
    """Phase 0: every used-up budget (at any level) preempts the weighted placed tasks of its
    whole subtree, newest placement first; the text names the nearest used-up level. It
    ignores protection and the ``victims`` setting (lending.md)."""
    out = [x for x, left in rs.remaining.items() if left <= 0]
    if not out:
        return
    victims = sorted(
        (
            t
            for t in rs.tasks.values()
            if t.pool is not None
            and t.weight > 0
            and not t.orphan
            and any(t.group in rs.org.subtree[x] for x in out)
        ),
        key=lambda t: -t.placed_order,
    )
    for v in victims:
        chain = rs.org.chain.get(v.group) or levels(rs, v)
        nearest = next(x for x in chain if x in out)
        if nearest == chain[0]:
            text = "budget used up"
        else:
            text = f"budget of {rs.org.policies[nearest].group} used up"
        preempt(rs, v, "budget", None, text)


REPEATS = 200
"""Far more than any small estate needs: each repeat places within-reservation work or fills
idle capacity (engine.md), so a pass that keeps changing things is a loop."""


def run_pass(index: EstateIndex, rs: RState) -> list[tuple]:
    """One moment: the pass, repeated until a pass places and preempts nothing. Phases 1 and
    2 run once per level, innermost first (organisation.md "Innermost guarantee first"); a
    flat estate has one round: exactly engine.md. Phase 4 follows phase 3 with ``fair``."""
    for _ in range(REPEATS):
        before = len(rs.decisions)
        budgets(rs)
        for k in range(rs.org.depth):
            fill(rs, "reserve", k)
            reclaim(rs, k)
        fill(rs, "lend")
        if rs.org.lending.order == "fair":
            rebalance(rs)
        if len(rs.decisions) == before:
            return rs.decisions
    raise AssertionError(
        f"the rules did not settle in {REPEATS} repeats at one moment: {rs.decisions[-12:]}"
    )
