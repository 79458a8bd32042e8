"""A reference engine, written from ../shared/spec/engine.md and organisation.md for the tests
only.

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
at one moment. It does not meter budgets: the snapshot reads what each group spent from the
engine's per-group meters (compared by other tests) and sums them per level. It gives no
reasons or alerts; preemption texts are kept in ``RState.texts``.

Read it beside engine.md and organisation.md: each function names the paragraph it implements.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from compiler.compiled import CompiledEstate, CPolicy
from klique_util.units import HOUR_MS, SECOND_MS

from kliqued.engine import EstateIndex, State
from kliqued.engine.periods import Period


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
                cr.name, cr.policy, cr.profile, cr.group, tuple(prof.pools),
                prof.queueing == "strict",
                prof.policies.index(cr.policy) if cr.policy in prof.policies else 0)
        levels = {p.name: tuple(p.levels) or (p.name,) for p in estate.policies}
        subtree = {p.name: frozenset(g.name for g in estate.groups
                                     if g.name == p.group or p.group in g.ancestors)
                   for p in estate.policies}
        holders = {g.name for g in estate.groups
                   if g.policy in policies and not policies[g.policy].envelope}
        teams = {name: frozenset(groups & holders) for name, groups in subtree.items()}
        chain = {g.name: levels[g.policy] if g.policy in levels else () for g in estate.groups}
        project_order = {g.name: tuple(g.project_order) for g in estate.groups
                         if g.project_priority}
        exec_pos = {}
        for pool in estate.pools:
            for prof_name in profiles:
                order = pool.execution_order
                exec_pos[(pool.name, prof_name)] = (order.index(prof_name)
                                                    if prof_name in order else len(order))
        org = Org(resources, policies, levels, subtree, teams, chain, project_order,
                  {p.name: p.capacity_milli for p in estate.pools}, exec_pos,
                  max((len(x) for x in levels.values()), default=1))
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
        tasks[t.id] = RTask(t.id, t.resource, t.group, t.size, t.weight, t.seq,
                            t.ran_before, t.pool if t.state == "placed" else None,
                            t.place_seq if t.state == "placed" else 0, t.orphan,
                            t.user, t.project)
    remaining = {}
    for name, pol in org.policies.items():
        if pol.budget is not None:
            spent = spent_by(state, org.teams[name], pol.budget.period, now)
            remaining[name] = pol.budget.hours_milli * HOUR_MS - spent
    top = max((t.placed_order for t in tasks.values()), default=0)
    return RState(org, tasks, remaining, frozenset(state.unavailable), top)


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
    return any(within_at(rs, t, x) for x in levels(rs, t)[:k + 1])


def within_limits(rs: RState, t: RTask) -> bool:
    return all(used(rs, x) + t.size <= rs.org.policies[x].limit_milli for x in levels(rs, t))


def user_held(rs: RState, t: RTask) -> bool:
    """User limit: ``used(g, user) + s > user_limit(g)``."""
    limit = rs.org.policies[levels(rs, t)[0]].user_limit_milli
    if limit is None:
        return False
    mine = sum(x.size for x in rs.tasks.values()
               if x.pool is not None and x.group == t.group and x.user == t.user)
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


# ------------------------------------------------------------------ changing the snapshot
def place(rs: RState, t: RTask, pool: str, phase: str) -> None:
    rs.order_counter += 1
    t.pool, t.placed_order = pool, rs.order_counter
    rs.decisions.append(("place", t.id, pool, phase))


def preempt(rs: RState, t: RTask, kind: str, by: str | None, text: str) -> None:
    t.pool, t.placed_order, t.ran_before = None, 0, True
    rs.decisions.append(("preempt", t.id, kind, by))
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
    its user's limit holds is passed over as if it were not in the queue."""
    while True:
        best: tuple | None = None
        for name, cr in rs.org.resources.items():
            for t in queue(rs, name):
                if user_held(rs, t):
                    continue
                pool = placeable(rs, t, phase, k)
                if pool is not None:
                    key = order_key(rs, t, pool)
                    if best is None or key < best[0]:
                        best = (key, t, pool)
                    break
                if cr.strict:
                    break  # strict: only the head
        if best is None:
            return
        place(rs, best[1], best[2], phase)


def choose_victims(rs: RState, pool: str, t: RTask) -> list[RTask] | None:
    """Reclaim in one pool (organisation.md): eligible, useful victims newest placement first
    until room in ``pool`` and every level's limit hold; then spare from the last chosen to
    the first. None when the constraints cannot be met."""
    org = rs.org
    mine = levels(rs, t)
    inner = next(x for x in mine if within_at(rs, t, x))
    protected = org.subtree[inner]
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
    placed = sorted((x for x in rs.tasks.values()
                     if x.pool is not None and x.group != t.group and not x.orphan
                     and x.size > 0), key=lambda x: -x.placed_order)
    for v in placed:
        if v.group in protected:
            continue
        if any(base_used[z] - freed_in(chosen, z) - v.size < org.policies[z].reservation_milli
               for z in levels(rs, v) if z not in mine):
            continue
        useful = (v.pool == pool and room_short(chosen)) or any(
            v.group in org.subtree[y] and limit_short(chosen, y) for y in mine)
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


def budgets(rs: RState) -> None:
    """Phase 0: every used-up budget (at any level) preempts the weighted placed tasks of its
    whole subtree, newest placement first; the text names the nearest used-up level."""
    out = [x for x, left in rs.remaining.items() if left <= 0]
    if not out:
        return
    victims = sorted((t for t in rs.tasks.values()
                      if t.pool is not None and t.weight > 0 and not t.orphan
                      and any(t.group in rs.org.subtree[x] for x in out)),
                     key=lambda t: -t.placed_order)
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
    flat estate has one round: exactly engine.md."""
    for _ in range(REPEATS):
        before = len(rs.decisions)
        budgets(rs)
        for k in range(rs.org.depth):
            fill(rs, "reserve", k)
            reclaim(rs, k)
        fill(rs, "lend")
        if len(rs.decisions) == before:
            return rs.decisions
    raise AssertionError(f"the rules did not settle in {REPEATS} repeats at one moment: "
                         f"{rs.decisions[-12:]}")
