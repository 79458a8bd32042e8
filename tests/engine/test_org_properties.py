"""organisation.md's invariants on random hierarchical estates and timelines (hypothesis).

Each example runs every pass the engine asks for and replays each pass's decisions in order
from the state before it, so each invariant is checked at the moment of each decision, not
only after the pass:
- no placement takes any level of its task (its policy and every envelope above) above its
  limit, its user above the group's user limit, or its pool above its capacity;
- a placement in phases 1 and 2 is within reservation at some level;
- no reclaim takes a victim's level below its reservation, unless that level is also a level
  of the reclaiming group;
- no budget at any level is overrun past its run-out (the engine runs a pass at the exact
  run-out moment, rounded up to the millisecond, so what passes it is less than one
  millisecond's charge at the level's own rate; the overrun stays spent after phase 0
  preempts, so it is measured against the highest rate the level ran at, not what is placed
  when it is checked);
- lending.md: no protected task (placed less than its policy's protect_for ago, else the
  settings') is ever a reclaim or rebalance victim; after a rebalance the taker's share at
  the diverging level is no higher than each giver's.
Usage of a level is summed over its subtree here, never read from the engine's counters.
"""

from __future__ import annotations

from fractions import Fraction

from hypothesis import HealthCheck, given, settings

from klique_util.units import HOUR_MS, SECOND_MS

from kliqued.engine import EstateIndex, Placement, Preemption, State, run_pass

from tests.harness.typed import present

from .helpers import MIN, START
from .reference import spent_by
from .org_worlds import apply_actions, org_worlds, time_limit
from tests.harness.examples import examples


class Tree:
    """The compiled estate's levels and subtrees."""

    def __init__(self, index: EstateIndex) -> None:
        est = index.estate
        self.policies = {p.name: p for p in est.policies}
        self.policy_of = {g.name: g.policy for g in est.groups}
        self.subtree = {
            p.name: {g.name for g in est.groups if g.name == p.group or p.group in g.ancestors}
            for p in est.policies
        }
        holders = {
            g.name
            for g in est.groups
            if g.policy in self.policies and not self.policies[g.policy].envelope
        }
        self.teams = {name: groups & holders for name, groups in self.subtree.items()}
        """Per policy: the teams of its subtree (groups whose policy is not an envelope: they
        hold the tasks; their meters are summed here, never an envelope group's own)."""
        self.capacity = {p.name: p.capacity_milli for p in est.pools}
        lending = est.settings.lending
        self.protect_ms = {
            p.name: SECOND_MS
            * (p.protect_for_s if p.protect_for_s is not None else lending.protect_for_s)
            for p in est.policies
        }

    def diverging(self, a: str, b: str) -> tuple[str, str]:
        """lending.md: the first levels, from the top down, where two groups' levels differ."""
        return next(
            (x, y) for x, y in zip(reversed(self.levels(a)), reversed(self.levels(b))) if x != y
        )

    def levels(self, group: str) -> list[str]:
        pol = self.policy_of.get(group)
        return list(self.policies[pol].levels or [pol]) if pol else []


def replay(
    tree: Tree,
    state: State,
    placed: dict[str, tuple[str, str, str, int]],
    res,
    now: int = 0,
    placed_at: dict[str, int] | None = None,
) -> None:
    """Applies the pass's decisions one by one to ``placed`` (task -> group, user, pool,
    size) and checks each at its moment; ``placed_at`` (task -> the start of its current
    placement) for protection."""
    since = dict(placed_at or {})
    givers: list[str] = []
    """The groups of the rebalance victims since the last placement."""

    def used(x: str) -> int:
        return sum(s for g, _, _, s in placed.values() if g in tree.subtree[x])

    def share(x: str) -> Fraction:
        pol = tree.policies[x]
        return Fraction(max(0, used(x) - pol.reservation_milli), pol.lend_weight_milli)

    for d in res.decisions:
        if isinstance(d, Preemption) and d.task in placed:
            if d.kind in ("reclaimed", "rebalanced") and d.task in since:
                pol = tree.policy_of[d.group]
                assert pol is None or now - since[d.task] >= tree.protect_ms[pol], (
                    f"{d.kind} took {d.task}, protected since {since[d.task]} at {now}"
                )
            if d.kind == "rebalanced":
                givers.append(d.group)
            g = placed.pop(d.task)[0]
            if d.kind == "reclaimed":
                shared = set(tree.levels(d.by or ""))
                for z in tree.levels(g):
                    if z not in shared:
                        assert used(z) >= tree.policies[z].reservation_milli, (
                            f"reclaim by {d.by} took {d.task} and level {z} below its "
                            f"reservation ({used(z)} < {tree.policies[z].reservation_milli})"
                        )
        elif isinstance(d, Placement):
            levels = tree.levels(d.group)
            since[d.task] = now
            if d.phase in ("reserve", "reclaim"):
                assert any(
                    used(x) + d.size_milli <= tree.policies[x].reservation_milli for x in levels
                ), f"{d.task} placed in {d.phase} beyond reservation"
            task_user = state.tasks[d.task].user
            placed[d.task] = (d.group, task_user, d.pool, d.size_milli)
            for x in levels:
                assert used(x) <= tree.policies[x].limit_milli, (
                    f"placing {d.task} took level {x} above its limit "
                    f"({used(x)} > {tree.policies[x].limit_milli})"
                )
            ul = tree.policies[levels[0]].user_limit_milli
            if ul is not None:
                mine = sum(s for g, u, _, s in placed.values() if g == d.group and u == task_user)
                assert mine <= ul, f"placing {d.task} took {task_user} above the user limit"
            on_pool = sum(s for _, _, p, s in placed.values() if p == d.pool)
            assert on_pool <= tree.capacity[d.pool], f"pool {d.pool} over capacity"
            if d.phase == "rebalance":
                for h in givers:
                    x, y = tree.diverging(d.group, h)
                    assert share(x) <= share(y), (
                        f"rebalance for {d.group} left {x}'s share {share(x)} above {y}'s "
                        f"{share(y)}"
                    )
            givers = []


def check_budgets(
    tree: Tree, state: State, now: int, exempt: set[str], peak: dict[str, int]
) -> None:
    """No budget is overrun by one millisecond's charge at its level's peak rate.

    ``peak`` keeps, per level, the highest rate (sum of the time weights of the placed tasks
    of its subtree) seen so far: a level is charged at its rate until the pass at its
    run-out, which engine.md puts at the exact moment, so the overrun is below one
    millisecond of that rate; it stays after the pass preempts everything.
    """
    for name, pol in tree.policies.items():
        if pol.budget is None or name in exempt:
            continue
        rate = sum(t.weight for t in state.placed_tasks() if t.group in tree.teams[name])
        peak[name] = max(peak.get(name, 0), rate)
        over = overrun(tree, state, name, now)
        assert over <= 0 or over < peak[name], (
            f"budget of {name} overrun by {over} (peak rate {peak[name]})"
        )


def overrun(tree: Tree, state: State, name: str, now: int) -> int:
    pol = tree.policies[name]
    assert pol.budget is not None
    spent = spent_by(state, tree.teams[name], pol.budget.period, now)
    return spent - pol.budget.hours_milli * HOUR_MS


def check_reasons(tree: Tree, state: State, res) -> None:
    """Every queued task says why it waits (none left "pending"), and a task its user's
    limit holds says so unless it waits behind others (organisation.md "Reasons")."""
    reasons = res.waiting_reasons()
    queued = {t.id for t in state.tasks.values() if t.state == "queued"}
    assert set(reasons) == queued, "a queued task without a reason"
    for tid, r in reasons.items():
        assert r.kind != "pending", (tid, r)
        t = state.tasks[tid]
        ul = tree.policies[tree.levels(t.group)[0]].user_limit_milli
        if ul is not None and r.kind in ("limit", "budget", "capacity"):
            mine = sum(x.size for x in state.placed_of(t.group) if x.user == t.user)
            assert mine + t.size <= ul, f"{tid} is held by its user's limit, not {r}"


def simulate(estate, steps, changes=None, checkpoints=()) -> None:
    index = EstateIndex.build(estate)
    tree = Tree(index)
    state = State(index, START)
    now = START
    n = 0
    exempt: set[str] = set()
    """Levels a moved team took past their budget at once (its hours move with it): the
    run-out was the move, not a pass the engine missed."""
    peak: dict[str, int] = {}

    def one_pass(at: int):
        placed = {t.id: (t.group, t.user, present(t.pool), t.size) for t in state.placed_tasks()}
        since = {t.id: t.placed_at for t in state.placed_tasks() if t.placed_at is not None}
        res = run_pass(index, state, at)
        replay(tree, state, placed, res, at, since)
        check_budgets(tree, state, at, exempt, peak)
        check_reasons(tree, state, res)
        return res

    res = one_pass(now)
    for i, (dt, actions) in enumerate(steps):
        target = now + dt * MIN
        while res.next_pass_at is not None and res.next_pass_at < target:
            now = res.next_pass_at
            check_budgets(tree, state, now, exempt, peak)
            res = one_pass(now)
        now = target
        check_budgets(tree, state, now, exempt, peak)
        if changes and i in changes:
            index = EstateIndex.build(changes[i])
            tree = Tree(index)
            exempt |= {
                x
                for x, pol in tree.policies.items()
                if pol.budget is not None and overrun(tree, state, x, now) > 0
            }
        n = apply_actions(index, state, actions, now, n, checkpoints)
        res = one_pass(now)


@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)
@given(org_worlds())
def test_organisation_invariants_hold(world):
    with time_limit(30):
        simulate(*world)


@settings(
    max_examples=examples(30),
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)
@given(org_worlds(borrowing=True))
def test_lending_invariants_hold_where_teams_borrow(world):
    with time_limit(30):
        simulate(*world)
