"""One pass of the compute policy engine (engine.md "Each pass"), repeated at one moment until
nothing changes.

``run_pass(index, state, now)`` mutates only ``state`` and returns what it decided. It reads no
clock, does no I/O and uses no randomness: the same estate, state and time give the same
decisions. To cost what changed rather than the size of the estate, it only looks at compute
resources that may have become placeable (the state's ``active`` set, kept by every change),
at each of them only its queue head (or, for best_effort, its first placeable task), and
compares competitors through a heap on engine.md's order.
"""

from __future__ import annotations

import gc
import heapq
from typing import Callable, Iterable

from klique_util.fmt import hours, percent
from klique_util.units import MILLI, from_milli, unit_hours

from .budget import budget_units, next_budget_event, remaining
from .decisions import (
    UNSTARTED,
    Alert,
    Cancellation,
    Phase,
    Placement,
    Preemption,
    no_autoscaler_requeue_text,
    recalled_text,
    unstarted_text,
)
from .errors import TimeWentBackwards
from .index import CRInfo, EstateIndex, GroupInfo
from .periods import next_period_start, period_start
from .fairpark import Entry
from .fairtree import FairTree, FlatTree, scaled_share, shape_of
from .rebalance import rebalance_victims
from .reclaim import choose_victims
from .result import PassResult
from .rules import (
    Key,
    budget_ok,
    failing_budget_level,
    failing_limit_level,
    first_fit,
    fits,
    headroom,
    innermost_within,
    limit_room,
    order_key,
    reservation_room,
    user_ok,
)
from .queues import CRQueue
from .state import State, Task
from .watch import level_key, pool_hold

GANG = 1 << 62
"""The "size" a gang candidate is filed under on its pool: above any room."""

MAX_REPEATS = 10_000
"""A guard, never reached by engine.md's rules: each repeat either places within-reservation
work or fills idle capacity, both finite."""

Decision = Placement | Preemption | Cancellation | Alert


def run_pass(index: EstateIndex, state: State, now: int) -> PassResult:
    """Runs the passes due at ``now`` and applies them to ``state``; returns the decisions.

    When nothing changed since the last pass and no budget or period moment is due, this
    returns at once with no decisions (the "nothing new" pass).

    The cyclic garbage collector is held off while the pass runs: with 100,000 tasks in
    memory a full collection takes longer than a pass, and a pass makes no reference cycles
    worth collecting, so the collection runs after the pass instead of in the middle of
    it (reference counting still frees everything as usual). What is left of each budget at
    ``now`` is looked up once per pass (``State.pass_budget_left``)."""
    state.pass_budget_left = {}
    if not gc.isenabled():
        try:
            return _run_pass(index, state, now)
        finally:
            state.pass_budget_left = None
    gc.disable()
    try:
        return _run_pass(index, state, now)
    finally:
        state.pass_budget_left = None
        gc.enable()


def _run_pass(index: EstateIndex, state: State, now: int) -> PassResult:
    if now < state.clock:
        raise TimeWentBackwards(f"time went backwards: {now} < {state.clock}")
    if state.index is not index:
        state.bind(index, now)
    state.clock = now
    decisions: list[Decision] = list(state.take_cancellations())
    if not state.enabled:
        state.version += 1
        return PassResult(index, state, now, decisions, None, 0)
    due = _due_budget_groups(index, state, now)
    starts = state.start_due(now)
    # lending.md: a pass at every moment a placed task's protection ends.
    if state.protection_due(now):
        state.dirty = True
        state.reclaim.update(n for n, q in state.queues.items() if q.live and n in index.resources)
    if not state.dirty and not due and not decisions and not starts:
        return PassResult(index, state, now, decisions, _next_pass_at(index, state, now), 0)
    state.version += 1
    repeats = 0
    while True:
        repeats += 1
        changed = False
        if repeats == 1:
            if starts:
                changed |= _requeue_unstarted(state, now, decisions)
            changed |= _phase_budgets(index, state, now, due, decisions)
        # organisation.md "innermost guarantee first": phases 1 and 2 for work within
        # reservation at its own level, then through the envelope above, and so on outward.
        # A round skips in phase 1 the queues the round before looked at that no envelope
        # of the new round can serve, while no reclaim freed anything (``_served``).
        looked: set[str] | None = None
        for upto in range(index.depth):
            skip = _served(index, state, looked, upto) if looked is not None else None
            looked = set()
            changed |= _fill(index, state, now, "reserve", decisions, upto, skip, looked)
            n0 = len(decisions)
            changed |= _reclaim(index, state, now, decisions, upto)
            if any(isinstance(d, Preemption) for d in decisions[n0:]):
                looked = None
        if index.fair:
            # lending.md: phase 3 by lowest share, then phase 4 (rebalance).
            changed |= _lend_fair(index, state, now, decisions)
            changed |= _rebalance(index, state, now, decisions)
        else:
            changed |= _fill(index, state, now, "lend", decisions)
        if not changed or repeats >= MAX_REPEATS:
            break
    _alerts(index, state, now, due, decisions)
    state.rate_changed |= due  # a new period or estate moves their next budget moment
    state.dirty = False
    state.last_pass_at = now
    state.version += 1
    return PassResult(index, state, now, decisions, _next_pass_at(index, state, now), repeats)


# ------------------------------------------------------------------------ budgets and time


def _due_budget_groups(index: EstateIndex, state: State, now: int) -> set[str]:
    """Groups whose budget needs a look at ``now``: a run-out or alert moment came, a period
    started since the last pass, or the estate or engine switch changed."""
    due: set[str] = set()
    if state.budget_check_all:
        due.update(g for g, gi in index.groups.items() if gi.budget is not None)
        state.budget_check_all = False
    h = state.triggers
    tv = state.trigger_version
    while h and h[0][0] <= now:
        _, g, v = heapq.heappop(h)
        if tv.get(g) == v:
            due.add(g)
    last = state.last_pass_at
    if last is not None:
        for kind in index.budget_periods:
            if period_start(kind, now) > last:
                for g, gi in index.groups.items():
                    if gi.budget is not None and gi.budget.period == kind:
                        due.add(g)
                        for name in gi.subtree_resources:
                            q = state.queues.get(name)
                            if q is not None and q.live:
                                state.active.add(name)
    return due


def _requeue_unstarted(state: State, now: int, out: list[Decision]) -> bool:
    """Before phase 0: a placed task that no worker took within its pool's start timeout,
    on a pool with no live worker, goes back to the front of its compute resource (as
    preempted work does), so it can run elsewhere and stops holding capacity and budget on a
    pool that cannot run it. A task of a removed compute resource keeps its place
    (engine.md): it has no queue to go back to."""
    h = state.start_deadlines
    changed = False
    while h and h[0][0] <= now:
        entry = heapq.heappop(h)
        t = state.start_entry_task(entry)
        if t is None or t.orphan:
            continue
        pool = t.pool or ""
        back = state.recalled.pop(t.id, None)
        text = (
            recalled_text(back)
            if back is not None
            else no_autoscaler_requeue_text(pool)
            if pool in state.no_autoscaler and pool in state.unavailable
            else unstarted_text(pool, t.start_timeout)
        )
        lost = state.preempt(t, now, UNSTARTED, text)
        out.append(Preemption(t.id, t.resource, t.group, pool, UNSTARTED, text, None, t.size, lost))
        changed = True
    return changed


def _phase_budgets(
    index: EstateIndex, state: State, now: int, due: set[str], out: list[Decision]
) -> bool:
    """Phase 0: a used-up budget preempts the weighted work of its level's whole subtree,
    newest placement first (organisation.md "Budgets at every level"); each victim's reason
    names the nearest of its levels whose budget is used up."""
    groups = index.groups
    used_up: list[str] = []
    for g in sorted(due):
        gi = groups.get(g)
        if gi is None or gi.budget is None:
            continue
        m = state.meters.get(g)
        if m is None or m.weighted_tasks == 0:
            continue
        if remaining(m, gi.budget, now, state.enabled) > 0:
            continue
        used_up.append(g)
    changed = False
    for g in used_up:
        gi = groups[g]
        if gi.envelope:
            teams = [t for t, ti in groups.items() if not ti.envelope and g in ti.levels]
            victims = sorted(
                (
                    t
                    for team in teams
                    for t in state.placed_by_group.get(team, {}).values()
                    if t.weight > 0 and not t.orphan
                ),
                key=lambda t: -t.place_seq,
            )
        else:
            victims = [
                t
                for t in reversed(state.placed_by_group.get(g, {}).values())
                if t.weight > 0 and not t.orphan
            ]
        for t in victims:
            pool = t.pool
            text = _budget_text(index, state, t.group, now)
            lost = state.preempt(t, now, "budget", text)
            out.append(
                Preemption(
                    t.id, t.resource, t.group, pool or "", "budget", text, None, t.size, lost
                )
            )
            changed = True
    return changed


def _budget_text(index: EstateIndex, state: State, group: str, now: int) -> str:
    """``budget used up``, or for an envelope's ``budget of <group> used up``: the nearest
    level of ``group`` whose budget is used up."""
    gi = index.groups.get(group)
    for x in gi.levels if gi is not None else (group,):
        xi = index.groups.get(x)
        if xi is None or xi.budget is None:
            continue
        if remaining(state.meter(x), xi.budget, now, state.enabled) <= 0:
            return "budget used up" if x == group else f"budget of {x} used up"
    return "budget used up"


def _alerts(index: EstateIndex, state: State, now: int, due: set[str], out: list[Decision]) -> None:
    for g in sorted(due):
        gi = index.groups.get(g)
        if gi is None or gi.budget is None or not gi.budget.alert_at_milli:
            continue
        b = gi.budget
        ps = period_start(b.period, now)
        raised = state.alerts_raised.get(g)
        if raised is None or raised[0] != ps:
            raised = state.alerts_raised[g] = (ps, set())
        used = state.meter(g).used(b.period, now, state.enabled)
        total = budget_units(b)
        for a in b.alert_at_milli:
            if a in raised[1]:
                continue
            if used * MILLI >= total * a:
                raised[1].add(a)
                # Worded from the figures, not the threshold: a budget lowered below what is
                # used crosses every threshold at once, at well over each of them.
                out.append(
                    Alert(
                        gi.policy,
                        g,
                        a,
                        ps,
                        used,
                        total,
                        f"{gi.policy}: {percent(used, total)} of the {b.period}'s "
                        f"budget used ({hours(unit_hours(used))} of "
                        f"{hours(from_milli(b.hours_milli))} h; alert at {a / 10:g}%)",
                    )
                )


def _next_pass_at(index: EstateIndex, state: State, now: int) -> int | None:
    """The latest moment the next pass must run for the engine to act on time by itself."""
    tv = state.trigger_version
    for g in state.rate_changed:
        gi = index.groups.get(g)
        v = tv.get(g, 0) + 1
        tv[g] = v
        if gi is None or gi.budget is None:
            continue
        ps = period_start(gi.budget.period, now)
        raised = state.alerts_raised.get(g)
        done = raised[1] if raised is not None and raised[0] == ps else set()
        t = next_budget_event(state.meter(g), gi.budget, now, state.enabled, done)
        if t is not None:
            heapq.heappush(state.triggers, (t, g, v))
    state.rate_changed.clear()
    h = state.triggers
    while h and tv.get(h[0][1]) != h[0][2]:
        heapq.heappop(h)
    if len(h) > 64 and len(h) > 4 * len(tv):
        h[:] = [e for e in h if tv.get(e[1]) == e[2]]
        heapq.heapify(h)
    best = h[0][0] if h else None
    s = state.next_start_deadline()
    if s is not None and (best is None or s < best):
        best = s
    if index.protecting:
        e = state.next_protection_end()
        if e is not None and (best is None or e < best):
            best = e
    for kind in index.budget_periods:
        t = next_period_start(kind, now)
        if best is None or t < best:
            best = t
    return best


# ------------------------------------------------------------------------ phases 1 and 3


def _head(state: State, gi: GroupInfo, q: CRQueue) -> Task | None:
    """The queue's head as the rules see it: a task its user's limit holds back keeps its
    place but is passed over, even in a strict queue (organisation.md "User limit")."""
    if gi.user_limit is None:
        return q.head()
    return q.first(lambda t: user_ok(state, gi, t))


def _candidate(
    index: EstateIndex,
    state: State,
    cr: CRInfo,
    lend: bool,
    now: int,
    upto: int | None = None,
    rooms: dict[str, int] | None = None,
) -> tuple[Task, str] | None:
    """The task this compute resource may place now in this phase, and its pool. ``rooms``:
    each group's headroom while nothing is placed (a phase's first look at every queue
    asks once per group, not once per compute resource)."""
    q = state.queues.get(cr.name)
    if q is None or not q.live:
        return None
    gi = index.groups[cr.group]
    room = rooms.get(cr.group) if rooms is not None else None
    if room is None:
        room = headroom(index, state, cr, lend, upto)
        if rooms is not None:
            rooms[cr.group] = room
    if cr.strict:
        t = q.head() if gi.user_limit is None else _head(state, gi, q)
        if t is None or t.size > room:
            return None
        if not budget_ok(index, state, cr, now):
            return None
        pool = first_fit(state, cr, t.size)
        return (t, pool) if pool is not None else None
    # best_effort: the same checks on the first task that passes them, cut short by the
    # smallest queued size against the room left in the group and in any pool.
    smallest = q.min_size()
    if smallest is None or smallest > room:
        return None
    free = state.free
    if state.node_free:
        maxfree = max(
            (free.get(p, -1) if cr.nodes > 1 else state.room(p) for p in cr.pools), default=-1
        )
    else:
        maxfree = max((free.get(p, -1) for p in cr.pools), default=-1)
    lim = min(room, maxfree)
    if smallest > lim or not budget_ok(index, state, cr, now):
        return None
    limited = gi.user_limit is not None
    fits: dict[int, str | None] = {}  # size → its first pool (the state holds still here)

    def ok(t: Task) -> bool:
        size = t.size
        if size > lim or (limited and not user_ok(state, gi, t)):
            return False
        if size not in fits:
            fits[size] = first_fit(state, cr, size)
        return fits[size] is not None

    t = q.first(ok)
    if t is None:
        return None
    pool = fits[t.size]
    assert pool is not None
    return t, pool


def _fill(
    index: EstateIndex,
    state: State,
    now: int,
    phase: Phase,
    out: list[Decision],
    upto: int | None = None,
    skip: Callable[[str], bool] | None = None,
    looked: set[str] | None = None,
) -> bool:
    """Phases 1 (``reserve``: within reservation) and 3 (``lend``: up to the limit).
    ``skip``: active queues known to have no candidate (not looked at); ``looked``: gets
    the queues this phase looked at first (all active ones, skipped or not).

    Candidates are compared on (the profile's place in the target pool's execution order, the
    policy's place on the profile, submission, task id); after each placement only what it
    can have changed is looked at again: the same compute resource, candidates aimed at the
    same pool that no longer fit there (their key changes with the pool), and best_effort
    resources of the same group whose first placeable task may now be another one. In phase
    3, queues parked on a pool that gained room are woken one at a time in that order."""
    lend = phase == "lend"
    w = state.watchers
    if not lend:
        for p in state.freed_pools:
            w.wake_reserve(p, state.room(p), state.active)
    if looked is not None:
        looked.update(state.active)
    if not state.active and not (lend and (state.freed_pools or state.freed_levels)):
        if lend:
            state.freed_pools.clear()
        return False
    resources = index.resources
    # (order key, version, compute resource, pool): a candidate's version is its counter
    # (> 0, unique, so the pool never decides the order); a parked queue's is -version.
    heap: list[tuple[Key, int, str, str]] = []
    cand: dict[str, tuple[int, Task, str]] = {}
    by_pool: dict[str, list[tuple[int, int, str]]] = {}
    counter = 0

    def evaluate(name: str, rooms: dict[str, int] | None = None) -> None:
        nonlocal counter
        cr = resources.get(name)
        w.forget(name)
        c = _candidate(index, state, cr, lend, now, upto, rooms) if cr is not None else None
        counter += 1
        if c is None or cr is None:
            cand.pop(name, None)
            if lend and cr is not None:
                _park(index, state, cr, now)
            return
        t, pool = c
        cand[name] = (counter, t, pool)
        heapq.heappush(heap, (order_key(cr, cr.exec_pos[pool], t), counter, name, pool))
        # A gang's fit is not one number: it is looked at again after every placement there.
        need = GANG if cr.nodes > 1 and pool in state.node_free else t.size
        heapq.heappush(by_pool.setdefault(pool, []), (-need, counter, name))

    levels = (
        {level_key(x): index.groups[x] for x in state.freed_levels if x in index.groups}
        if lend
        else {}
    )

    def pull(pool: str) -> None:
        """Puts the next parked queue of ``pool`` (or of an envelope's limit) that fits into
        the competition."""
        xi = levels.get(pool)
        room = xi.limit - state.used.get(xi.name, 0) if xi is not None else state.room(pool)
        while True:
            nxt = w.next_lend(pool, room)
            if nxt is None:
                return
            key, v, name, need = nxt
            cr = resources.get(name)
            if (
                cr is not None
                and xi is not None
                and cr.nodes == 1
                and not any(state.room(p) >= need for p in cr.pools)
            ):
                # The envelope has room but none of the queue's pools has: it waits for a
                # pool now. Parked there without a look, so an envelope freeing GPUs does
                # not wake every queue of its subtree that waits for pools anyway.
                w.park_lend(name, cr.pools, [(cr.exec_pos[p],) + key[1:] for p in cr.pools], need)
                continue
            gq = index.groups[cr.group] if cr is not None else None
            if cr is not None and gq is not None and xi is None and len(gq.levels) > 1:
                # The other way round: the pool has room but an envelope above the queue
                # is at its limit. It waits on the envelope now, without a look.
                x = failing_limit_level(index, state, gq, need)
                if x is not None and x != cr.group:
                    w.park_lend(
                        name,
                        (level_key(x),),
                        [(min(cr.exec_pos.values(), default=0),) + key[1:]],
                        need,
                    )
                    continue
            heapq.heappush(heap, (key, -v, name, pool))
            return

    rooms: dict[str, int] = {}  # nothing is placed (nor used) while these are looked at
    for name in sorted(state.active):
        if skip is None or not skip(name):
            evaluate(name, rooms)
    if lend:
        for p in sorted(state.freed_pools):
            pull(p)
        for p in sorted(levels):
            pull(p)
    changed = False
    groups = index.groups
    while heap:
        entry = heapq.heappop(heap)
        ver, name = entry[1], entry[2]
        if ver < 0:  # a parked queue's turn on a pool that gained room
            pool = entry[3]
            if w.current(name, -ver):
                evaluate(name)
            # Whether or not the queue was looked at since (it may have been woken on
            # another pool too), the pool's next parked queue gets its turn.
            pull(pool)
            continue
        c = cand.get(name)
        if c is None or c[0] != ver:
            continue
        _, t, pool = c
        cr = resources[name]
        gi = groups[cr.group]
        if state.free.get(pool, -1) < t.size or (
            state.node_free and not fits(state, cr, pool, t.size)
        ):
            evaluate(name)
            continue
        room = headroom(index, state, cr, lend, upto)
        if (
            t.size > room
            or (gi.user_limit is not None and not user_ok(state, gi, t))
            or not budget_ok(index, state, cr, now)
        ):
            evaluate(name, {cr.group: room})  # the same headroom: nothing changed since
            continue
        del cand[name]
        state.place(t, pool, now)
        out.append(Placement(t.id, name, t.group, pool, t.size, phase))
        changed = True
        evaluate(name)
        # Candidates aimed at this pool that no longer fit move to their next pool.
        ph = by_pool.get(pool)
        free = state.room(pool) if state.node_free else state.free[pool]
        stale: list[str] = []
        while ph and -ph[0][0] > free:
            _, v2, n2 = heapq.heappop(ph)
            c2 = cand.get(n2)
            if c2 is not None and c2[0] == v2:
                stale.append(n2)
        for n2 in stale:  # after the scan: a gang goes back on the pool's list at once
            evaluate(n2)
        for n2 in gi.sized_by_task:
            if n2 != name and n2 in cand:
                evaluate(n2)
        if gi.user_limit is not None:
            # The user's usage rose: in the group's other queues a task that user's limit
            # let go may now be held and the rules' head be a later task (organisation.md
            # "User limit"), also in a queue parked or held waiting for room. Looked at
            # again now; in phase 1 also left active, so phase 3 parks it again if needed.
            for n2 in gi.resources:
                if n2 != name and n2 not in gi.sized_by_task:
                    q2 = state.queues.get(n2)
                    if q2 is not None and q2.live:
                        if not lend:
                            state.active.add(n2)
                        evaluate(n2)
    if lend:
        w.restore()
        state.freed_pools.clear()
        state.freed_levels.clear()
    return changed


def _served(index: EstateIndex, state: State, before: set[str], upto: int) -> Callable[[str], bool]:
    """Which active queues round ``upto`` of phase 1 may pass over (issue 29): those the
    round before looked at (``before``), when its phase 2 preempted nothing, whose every
    envelope of levels 1..``upto`` has less reservation room than the queue's smallest
    task. The round before left them without a candidate (its phase 1 places or looks
    again at every candidate it makes, and its phase 2 only placed: rooms shrank, usage and
    rates rose), and the new round's rule differs from the last only by those envelopes,
    which cannot take any of their tasks; so they have none now either."""
    used = state.used
    resources = index.resources
    groups = index.groups
    queues = state.queues

    def skip(name: str) -> bool:
        if name not in before:
            return False
        cr = resources.get(name)
        if cr is None:
            return False
        q = queues.get(name)
        smallest = q.min_size() if q is not None and q.live else None
        if smallest is None:
            return True  # nothing queued: no candidate in any round
        for x, reservation, _ in groups[cr.group].outer[:upto]:
            if reservation - used.get(x, 0) >= smallest:
                return False
        return True

    return skip


def _park(index: EstateIndex, state: State, cr: CRInfo, now: int) -> int | None:
    """After phase 3 a compute resource with nothing placeable sleeps until something it
    waits on changes: a level's usage falls or a budget resets (it is held at each of its
    levels and woken with any of them), or, when only room holds it back, one of its pools
    gains room. It is also remembered for phase 2 when its head is within reservation.
    Returns the version of its parking on pools for room (lent work), else None."""
    state.active.discard(cr.name)
    q = state.queues.get(cr.name)
    w = state.watchers
    if q is None or not q.live:
        state.reclaim.discard(cr.name)
        return None
    gi = index.groups[cr.group]
    head = _head(state, gi, q) if cr.strict or gi.user_limit is not None else q.head()
    within = _reclaim_candidate(index, state, cr) is not None
    if within:
        state.reclaim.add(cr.name)
    else:
        state.reclaim.discard(cr.name)
    if head is None:
        _hold(state, cr.group, cr.name)  # every task held by its user's limit
        return None
    if cr.strict:
        need = head.size
    elif gi.user_limit is not None:
        # The smallest task its user's limit lets go: the room a watcher wakes it for must
        # be room it can use, or a pool gaining room would wake it again and again.
        need = q.min_size_where(lambda t: user_ok(state, gi, t)) or 0
    else:
        need = q.min_size() or 0
    if need > headroom(index, state, cr, True):
        x = failing_limit_level(index, state, gi, need) or cr.group
        if x == cr.group or within:
            # Held by its own limit, or within reservation (few): woken when the level's
            # usage falls.
            _hold(state, x, cr.name)
        else:
            # Borrowed work held by an envelope's limit: woken in order as the subtree
            # frees GPUs, like a pool's room.
            w.park_lend(
                cr.name,
                (level_key(x),),
                [order_key(cr, min(cr.exec_pos.values(), default=0), head)],
                need,
            )
        return None
    if not budget_ok(index, state, cr, now):
        # Woken when the level's rate falls, or at its period start.
        _hold(state, failing_budget_level(index, state, cr, now) or cr.group, cr.name)
        return None
    pools = cr.pools
    if cr.nodes > 1 and any(p in state.node_free for p in pools):
        # A gang waits on a pool that declares its machines until GPUs free there: whether
        # N machines have room is not one number a watcher compares (issue 15).
        for p in pools:
            if p in state.node_free:
                _hold(state, pool_hold(p), cr.name)
        pools = tuple(p for p in pools if p not in state.node_free)
        if not pools:
            return None
    if within:
        w.park_reserve(cr.name, pools, need)
        return None
    if index.fair and index.depth == 1:
        return w.park_lend(cr.name, pools, None, need)  # ordered by FairParking instead
    return w.park_lend(cr.name, pools, [order_key(cr, cr.exec_pos[p], head) for p in pools], need)


def _hold(state: State, level: str, name: str) -> None:
    held = state.held.get(level)
    if held is None:
        held = state.held[level] = set()
    held.add(name)


# ------------------------------------------------------------------------ phase 2


def _reclaim_candidate(
    index: EstateIndex,
    state: State,
    cr: CRInfo,
    upto: int | None = None,
    rooms: dict[str, int] | None = None,
) -> Task | None:
    """The head within reservation at one of the first ``upto + 1`` levels (all when None;
    best_effort: the first such task). Limits are not asked here: a reclaim may free an
    envelope's limit too (organisation.md "Reclaim"). A task its user's limit holds back
    triggers no reclaim. ``rooms``: as for ``_candidate``."""
    q = state.queues.get(cr.name)
    if q is None or not q.live:
        return None
    gi = index.groups[cr.group]
    room = rooms.get(cr.group) if rooms is not None else None
    if room is None:
        room = (
            headroom(index, state, cr, False)
            if len(gi.levels) == 1
            else reservation_room(index, state, gi, upto)
        )
        if rooms is not None:
            rooms[cr.group] = room
    smallest = q.min_size()
    if smallest is None or smallest > room:
        return None
    return _first_within(state, gi, cr, q, room)


def _first_within(state: State, gi: GroupInfo, cr: CRInfo, q: CRQueue, room: int) -> Task | None:
    """The task of ``q`` that ``room`` GPUs would take: strict, its head or none; best
    effort, its first that fits and that the user limit lets start."""
    if cr.strict:
        t = _head(state, gi, q)
        return t if t is not None and t.size <= room else None
    if gi.user_limit is None:
        return q.first(lambda t: t.size <= room)
    return q.first(lambda t: t.size <= room and user_ok(state, gi, t))


def _reclaim(
    index: EstateIndex, state: State, now: int, out: list[Decision], upto: int | None = None
) -> bool:
    """Phase 2: work within reservation takes back borrowed capacity, only as much as it
    needs, in the first pool of its profile where enough can be freed."""
    names = state.reclaim | state.active
    if not names:
        return False
    resources = index.resources
    groups = index.groups
    heap: list[tuple[Key, str, str]] = []
    queued: dict[str, str] = {}

    def push(name: str, rooms: dict[str, int] | None = None) -> None:
        cr = resources.get(name)
        if cr is None:
            return
        t = _reclaim_candidate(index, state, cr, upto, rooms)
        if t is None:
            queued.pop(name, None)
            # Not within reservation at the levels of this round; a later round (an envelope
            # further out) may still find it so: only the last round forgets it.
            if upto is None or upto + 1 >= len(index.groups[cr.group].levels):
                state.reclaim.discard(name)
            return
        if queued.get(name) == t.id:
            return
        queued[name] = t.id
        heapq.heappush(heap, (order_key(cr, cr.first_exec_pos, t), t.id, name))

    rooms: dict[str, int] = {}  # nothing is placed (nor used) while these are looked at
    for name in sorted(names):
        push(name, rooms)
    changed = False
    done: set[str] = set()
    while heap:
        _, tid, name = heapq.heappop(heap)
        if name in done or queued.get(name) != tid:
            continue
        cr = resources[name]
        t = _reclaim_candidate(index, state, cr, upto)
        if t is None or t.id != tid:
            queued.pop(name, None)
            push(name)
            continue
        if not budget_ok(index, state, cr, now):
            done.add(name)  # a task that fails its start check triggers no reclaim
            continue
        gi = groups[cr.group]
        pool = first_fit(state, cr, t.size) if limit_room(index, state, gi) >= t.size else None
        victim_groups: set[str] = set()
        if pool is None:
            inner = innermost_within(index, state, gi, t.size)
            guarded = gi.levels[inner] if inner is not None else gi.name
            for p in cr.pools:
                if p not in state.free:
                    continue
                victims = choose_victims(index, state, p, gi, t.size, guarded, cr.nodes, now)
                if victims is None:
                    continue
                for v in victims:
                    vpool = v.pool or p
                    lost = state.preempt(v, now, "reclaimed", f"reclaimed by {cr.group}")
                    out.append(
                        Preemption(
                            v.id,
                            v.resource,
                            v.group,
                            vpool,
                            "reclaimed",
                            f"reclaimed by {cr.group}",
                            cr.group,
                            v.size,
                            lost,
                        )
                    )
                    victim_groups.add(v.group)
                pool = p
                break
            else:
                done.add(name)  # no pool can be freed enough: preempt nothing
                continue
        state.place(t, pool, now)
        out.append(Placement(t.id, name, t.group, pool, t.size, "reclaim"))
        changed = True
        state.active.add(name)
        queued.pop(name, None)
        push(name)
        if gi.user_limit is not None:
            # As in _fill: the user's usage rose, so another queue's head as the user limit
            # sees it may be a later task now; phase 2 and phase 3 look at it again.
            for n2 in gi.resources:
                if n2 != name and n2 not in done:
                    q2 = state.queues.get(n2)
                    if q2 is not None and q2.live:
                        state.active.add(n2)
                        push(n2)
        for g in sorted(victim_groups):
            vi = groups.get(g)
            for n2 in vi.resources if vi is not None else ():
                if n2 not in done:
                    push(n2)
    return changed


# ------------------------------------------------------------------------ lending.md, fair


def _live(index: EstateIndex, state: State) -> list[str]:
    return sorted(n for n, q in state.queues.items() if q.live and n in index.resources)


def _lend_fair(index: EstateIndex, state: State, now: int, out: list[Decision]) -> bool:
    """Phase 3 with ``order: fair`` (lending.md): the same candidates as ``_fill``'s, the
    one placed next the one ``fair.fair_pick`` would choose (lowest share from the top
    down), kept by a ``FairTree`` (a ``FlatTree`` on a flat estate) so a placement costs the
    levels it touches, not the number of candidates. It looks at the queues ``_fill`` looks
    at, plus every queue parked on a pool or envelope that gained room and could fit there
    (shares, not the pool's order, choose among them; a queue parked on a full pool has no
    candidate, as ``_fill`` assumes); a queue with no candidate is parked as ``_fill``
    parks it. On a flat estate
    the woken queues are looked at lazily, only while one could come before the tree's pick
    (docs/decisions.md E3), read from ``state.fair_parking``, which keeps them by share
    across passes (issue 28, S1); after a placement only what it changed is looked at again
    (E4)."""
    resources = index.resources
    groups = index.groups
    w = state.watchers
    # A flat estate's fair pick is the lowest (share, key) (``fair.fair_pick`` with one
    # level): the queues parked for room are kept in that order across passes
    # (``state.fair_parking``) and looked at lazily, only while one could come before the
    # tree's pick (docs/decisions.md E3, and issue 28's speed section).
    lazy = index.depth == 1
    tree: FairTree[tuple[GroupInfo, Task, str]] | FlatTree[tuple[GroupInfo, Task, str]] = (
        FlatTree(index, state) if lazy else FairTree(index, state)
    )
    # Per pool, its candidates by the size they need there, largest first (``_fill``'s
    # list): after a placement only those that no longer fit are popped, not every
    # candidate aimed at the pool looked at. An entry is current while its version is.
    by_pool: dict[str, list[tuple[int, int, str]]] = {}
    version: dict[str, int] = {}
    counter = 0
    by_level: dict[str, set[str]] = {}

    def drop(name: str) -> None:
        c = tree.remove(name)
        if c is not None:
            version.pop(name, None)
            for x in c[0].levels:
                by_level[x].discard(name)

    fp = state.fair_parking
    shape = tree.shape
    lowest = _lowest_keys(index)

    def share_of(n: str) -> int:
        return scaled_share(shape, index, state, resources[n].group)

    def park_fair(cr: CRInfo, v: int, put: Callable[[str, Entry], None]) -> None:
        """Files ``cr``'s lend parking (version ``v``) on each of its pools."""
        e = w.lend_at[cr.name]
        s = scaled_share(shape, index, state, cr.group)
        tight, low = _fair_bound(index, state, cr, lowest)
        pos = cr.exec_pos
        for p in e[1]:
            put(p, (s, (pos[p],) + low[1:] if tight else low, cr.name, v))

    def evaluate(name: str) -> None:
        cr = resources[name]
        member = name in tree
        if not member:  # a candidate has no parking to forget: it was forgotten to become one
            w.forget(name)
        c = _candidate(index, state, cr, True, now)
        if c is None:
            drop(name)
            v = _park(index, state, cr, now)
            if lazy and v is not None:
                park_fair(cr, v, fp.parked)
            return
        t, pool = c
        gi = groups[cr.group]
        tree.add(name, order_key(cr, cr.exec_pos[pool], t), gi, (gi, t, pool))
        nonlocal counter
        counter += 1
        version[name] = counter
        # A gang's fit is not one number: it is looked at again after every placement there.
        need = GANG if cr.nodes > 1 and pool in state.node_free else t.size
        heapq.heappush(by_pool.setdefault(pool, []), (-need, counter, name))
        if not member:
            for x in gi.levels:
                by_level.setdefault(x, set()).add(name)

    names = set(state.active)
    freed = frozenset(state.freed_pools)
    if lazy:
        # Shares that fell since the last phase 3: their parked queues may come earlier.
        heaps = fp.heaps
        push = heapq.heappush
        for g in state.share_fell:
            fell = groups.get(g)
            if fell is None:
                continue
            s = scaled_share(shape, index, state, g)
            for n in fell.resources:
                e = w.lend_parking(n)
                if e is None:
                    continue
                cr = resources[n]
                tight, low = _fair_bound(index, state, cr, lowest)
                pos = cr.exec_pos
                for p in e[1]:
                    h = heaps.get(p)
                    if h is None:
                        h = heaps[p] = []
                    push(h, (s, (pos[p], low[1], low[2], low[3]) if tight else low, n, e[0]))
    else:
        for p in state.freed_pools:
            w.wake_lend(p, state.room(p), names)
    state.share_fell.clear()
    for x in state.freed_levels:
        xi = groups.get(x)
        if xi is not None:
            w.wake_lend(level_key(x), xi.limit - state.used.get(x, 0), names)
    for name in sorted(names):
        q = state.queues.get(name)
        if q is not None and q.live and name in resources:
            evaluate(name)
        elif name in resources:
            # Nothing queued: it leaves the active set as ``_fill`` has it leave (through
            # ``_park``), or phases 1 and 2 would look at every queue ever emptied.
            _park(index, state, resources[name], now)
    looked = set(names)

    def current(n: str, v: int) -> bool:
        e = w.lend_parking(n)
        return e is not None and e[0] == v and n in resources

    def may_fit(n: str) -> bool:
        """Whether a pool that gained room (``freed``) and that ``n`` waits on still has
        the room it needs; a queue looked at in this phase waits for the next."""
        if n in looked:
            return False
        e = w.lend_parking(n)
        if e is None:
            return False
        need = e[2]
        room = state.room
        return any(p in freed and room(p) >= need for p in e[1])

    def fits_on(n: str, p: str) -> bool | None:
        """Whether ``n``'s entry on ``p`` (a pool that gained room) is to be looked at now:
        the pool has the room it needs; None when it has none for any queue parked there."""
        r = state.room(p)
        e = w.lend_parking(n)
        if e is not None and r >= e[2]:
            return n not in looked
        least = w.lend_need.get(p)
        return None if not least or r < least[0][0] else False

    if lazy:
        fp.start(sorted(freed))

    later: list[tuple[int, Key, str]] = []
    endgame = False
    best: tuple[int, Key] | None

    def bring(best: tuple[int, Key] | None) -> bool:
        """Looks at the next parked queue whose (share, lowest possible key) comes before
        ``best`` (the tree's pick); False when none does. A queue that no longer may fit
        is left parked as it was, unlooked at: it has no candidate."""
        nonlocal later, endgame
        if not endgame and best is not None:
            n = fp.first_before(best, w.version, share_of, fits_on)
            if n is None:
                return False
            looked.add(n)
            evaluate(n)
            return True
        if not endgame:
            # The tree is empty. Rooms only shrink in this phase: keep only the queues not
            # looked at yet that some pool still has room for (most pools are full by now).
            endgame = True
            fit: set[str] = set()
            for p in sorted(freed):
                r = state.room(p)
                if r >= 0:
                    fit.update(n for need, _, n in w.peek_lend(p, r) if need <= r)
            fit -= looked
            later = [(share_of(n), lowest[n], n) for n in fit if n in resources]
            heapq.heapify(later)
        while later:
            s, lb, n = later[0]
            now_s = share_of(n)
            if now_s != s:  # its group placed since: its share rose
                heapq.heapreplace(later, (now_s, lb, n))
                continue
            if best is not None and (s, lb) >= best:
                return False
            heapq.heappop(later)
            if n in looked or not may_fit(n):
                continue
            looked.add(n)
            evaluate(n)
            return True
        return False

    changed = False
    while True:
        if len(tree):
            name = tree.pick()
            gi, t, pool = tree.payload(name)
            # Only a parked queue could come before the pick (none in play: a first pass).
            if lazy and (later if endgame else fp.tops):
                best = (scaled_share(shape, index, state, gi.name), tree.members[name][0])
                if bring(best):
                    continue
        else:
            if lazy and bring(None):
                continue
            break
        # Not taken out of the tree first: looking at the queue again below replaces its
        # candidate (or drops it), which costs one refresh of the tree rather than two.
        state.place(t, pool, now)
        out.append(Placement(t.id, name, t.group, pool, t.size, "lend"))
        changed = True
        # What the placement can change: its queue, room on its pool, and the headroom,
        # user limit and budget rate at its levels.
        # On the pool, only candidates that no longer fit there move (``_fill`` does the
        # same): the pools before it in their order are unchanged.
        touched = {name}
        ph = by_pool.get(pool)
        free = state.room(pool) if state.node_free else state.free[pool]
        while ph and -ph[0][0] > free:
            _, v2, n2 = heapq.heappop(ph)
            if version.get(n2) == v2:
                touched.add(n2)
        # At the placement's levels, a candidate changes only if the lower headroom no
        # longer takes it, or its budget's start check (the rate rose) or its user limit
        # may now say no: otherwise the same task is still the first that passes, on the
        # same pool (the pools only filled up; its own pool was looked at above).
        for x in gi.levels:
            for n in by_level.get(x, ()):
                if n in touched:
                    continue
                gn, tn, _ = tree.payload(n)
                crn = resources[n]
                if (
                    gn.user_limit is not None
                    or tn.size > headroom(index, state, crn, True)
                    or (crn.weight > 0 and gn.budgeted and not budget_ok(index, state, crn, now))
                ):
                    touched.add(n)
        if gi.user_limit is not None:
            # Parked queues too (decisions, issues 28 and 29, F1): the user's usage rose, so
            # a strict queue's head as the user limit sees it may be a later task now.
            for n in gi.resources:
                if n not in touched:
                    q2 = state.queues.get(n)
                    if q2 is not None and q2.live:
                        touched.add(n)
        for n in sorted(touched):
            evaluate(n)
        tree.moved(gi.levels)
    if lazy:
        fp.settle(current, lambda p: len(index.pools[p].resources) if p in index.pools else 0)
    w.restore()
    state.freed_pools.clear()
    state.freed_levels.clear()
    return changed


_LOWEST: dict[str, dict[str, Key]] = {}


def _lowest_keys(index: EstateIndex) -> dict[str, Key]:
    """Per compute resource, a key no candidate of it comes before (its profile's earliest
    place in its pools' execution orders, its policy's place, no submission yet), cached
    by revision."""
    k = _LOWEST.get(index.revision)
    if k is None:
        if len(_LOWEST) >= 8:
            _LOWEST.clear()
        k = _LOWEST[index.revision] = {
            n: (min(cr.exec_pos.values(), default=0), cr.policy_pos, -1, "")
            for n, cr in index.resources.items()
        }
    return k


def _fair_bound(
    index: EstateIndex, state: State, cr: CRInfo, lowest: dict[str, Key]
) -> tuple[bool, Key]:
    """A key no candidate of ``cr``'s queue comes before while the queue stays as it is (a
    queue that changes is looked at before its parking is read again), and whether its
    first place holds per pool (True: on each pool, the profile's place there) or over all
    of them. Without a user limit and for one machine, a candidate goes to a pool with the
    room its queue parked for, so the pool it is filed on bounds it; a strict queue's
    candidate is its head, so its submission and id are known too. Otherwise
    ``_lowest_keys``'s."""
    low = lowest[cr.name]
    if cr.nodes != 1 or index.groups[cr.group].user_limit is not None:
        return False, low
    if cr.strict:
        q = state.queues.get(cr.name)
        h = q.head() if q is not None else None
        if h is not None:
            return True, (low[0], low[1], h.seq, h.id)
    return True, low


def _rebalance_candidate(index: EstateIndex, state: State, cr: CRInfo, now: int) -> Task | None:
    """Phase 4's candidate of ``cr``: the task phase 3 would place but for room (strict: its
    head; best_effort: its first such task), i.e. every level's limit, the user limit and
    the budget start check let it start."""
    q = state.queues.get(cr.name)
    if q is None or not q.live or not budget_ok(index, state, cr, now):
        return None
    gi = index.groups[cr.group]
    room = headroom(index, state, cr, True)
    return _first_within(state, gi, cr, q, room)


def _rebalance(index: EstateIndex, state: State, now: int, out: list[Decision]) -> bool:
    """Phase 4 (lending.md): the candidates phase 3 left unplaced only for lack of room,
    fixed now, each taken once in phase 3's order (key (1) on the profile's first pool,
    shares recomputed after each placement); skipped if at its turn it is no longer its
    queue's candidate; placed where it fits, else where ``rebalance_victims`` frees room
    from borrowers with a higher share.

    A candidate whose share after the move would be no lower than every sibling's share at
    each of its levels can take from nobody (``Givers``); while every candidate is such,
    nothing changes and no room frees, so when no queue's group could take anything the
    phase ends at once, without fixing its candidates (the steady pass's case). On a flat
    estate the bounds kept across passes say so first, most passes (``_nobody_takes``)."""
    if state.rebalance_idle == (now, state.version):
        return False  # it did nothing, and nothing was placed or preempted since
    if index.depth == 1 and _nobody_takes(index, state):
        state.rebalance_idle = (now, state.version)
        return False
    resources = index.resources
    groups = index.groups
    givers = Givers(index, state, now)
    if not givers.any_taker():
        state.rebalance_idle = (now, state.version)
        return False
    fixed: list[tuple[str, CRInfo, Task]] = []
    actors: list[tuple[str, CRInfo, Task]] = []
    flat = index.depth == 1
    live = _live(index, state)
    # Flat: the queues of teams that cannot take (takers.py's figures, current since
    # ``_nobody_takes``) whose smallest task fits in no pool are not listed now: their
    # candidate, if any, is in ``fixed`` and not an actor. They are listed only when a move
    # needs them (``list_before_move``, ``unlisted_can_act``; docs/decisions.md, L1).
    later: dict[str, list[str]] = {}  # team -> its queues not listed
    later_min: dict[str, int] = {}  # team -> the smallest task of those queues
    taking = _taking_teams(state) if flat else None
    top_free = max(state.free.values(), default=-1)
    queues = state.queues
    for name in live:
        cr = resources[name]
        if taking is not None and cr.group not in taking:
            m = queues[name].min_size()
            if m is not None and m > top_free:
                g = cr.group
                later.setdefault(g, []).append(name)
                if m < later_min.get(g, m + 1):
                    later_min[g] = m
                continue
        t = _rebalance_candidate(index, state, cr, now)
        if t is not None and first_fit(state, cr, t.size) is None:
            fixed.append((name, cr, t))
            if (flat or not actors) and _may_act(state, givers, groups[cr.group], cr, t.size):
                actors.append((name, cr, t))
    if not actors:
        # Every candidate, at its turn, would be passed over by the same checks as below:
        # none fits, and none has a pool where ``rebalance_victims`` could find a victim.
        # Passing one over changes nothing, so the state at each turn is the state now and
        # the phase decides nothing: it ends without ordering its candidates.
        state.rebalance_idle = (now, state.version)
        return False

    shape = shape_of(index)
    shares: dict[str, int] = {}
    """Every listed team's share before any move (phase 3's order in phase 4)."""

    def share_of(g: str) -> int:
        s = shares.get(g)
        if s is None:
            s = shares[g] = scaled_share(shape, index, state, g)
        return s

    if flat:
        for _, _, x in fixed:
            share_of(x.group)

    def rank(e: tuple[str, CRInfo, Task]) -> tuple[int, Key]:
        _, c, x = e
        return shares[x.group], order_key(c, c.first_exec_pos, x)

    extra: dict[str, tuple[str, CRInfo, Task]] = {}
    """The unlisted queues' candidates as they were at the phase's start, once listed."""

    taker: list[str] = []

    def list_before_move(team: str, touched: set[str]) -> None:
        """Before the first move (by ``team``): the unlisted queues of the teams it touches
        (the taker's, the victims') get their candidate and share as they are now, the
        phase's start. A team the move does not touch keeps its queues, usage, user usage
        and budget, so its queues' candidates can be listed after the move, the same."""
        taker.append(team)
        for g in touched:
            for name in later.pop(g, ()):
                cr = resources[name]
                t = _rebalance_candidate(index, state, cr, now)
                if t is not None:
                    share_of(t.group)
                    extra[name] = (name, cr, t)

    def unlisted_can_act(mark: tuple[int, Key]) -> bool:
        """After the first move: whether some candidate of the queues still unlisted (teams
        the move did not touch) comes after ``mark`` and fits somewhere or may take, as
        ``none_can_act`` asks; one whose smallest task fits in no pool and may take from
        none cannot (a larger task neither), so only the others are listed."""
        if extra and not none_can_act(e for e in extra.values() if rank(e) > mark):
            return True
        if not later:
            return False
        top = max(state.free.values(), default=-1)
        # Every pool's give now is at most the highest of the teams' figures before the
        # move (a victim's team only lost usage and tasks), the taker's found again; an
        # untouched team's ``after`` is still its own: above that give and with no task
        # that fits anywhere, none of its queues can act (takers.py's bound, per team).
        tb = state.takers
        mine = _team_figures(index, state, groups[taker[0]])[1]
        give = max(tb.top_give(), mine if mine is not None else -1)
        names: list[str] = []
        for g, ns in later.items():
            a = tb.after.get(g)
            if a is None or a <= give or later_min[g] <= top:
                names.extend(ns)
        for name in names:
            cr = resources[name]
            m = queues[name].min_size()
            if m is None:
                continue
            gi = groups[cr.group]
            if m > top and not _may_act(state, givers, gi, cr, m):
                continue
            t = _rebalance_candidate(index, state, cr, now)
            if t is None:
                continue
            e = (name, cr, t)
            share_of(t.group)
            if rank(e) > mark and not none_can_act((e,)):
                return True
        return False

    def turn(name: str, cr: CRInfo, t: Task) -> tuple[str, ...] | None:
        """Candidate ``t``'s turn: placed (with victims if it must), returning the levels
        whose usage moved, or passed over (None, nothing changed)."""
        now_cand = _rebalance_candidate(index, state, cr, now)
        if now_cand is not t:
            return None  # no longer its queue's candidate (a victim went back in front of it)
        gi = groups[cr.group]
        pool = first_fit(state, cr, t.size)
        moved: list[str] = list(gi.levels)
        victims: list[Task] = []
        if pool is None:
            if not givers.may_take(gi, t.size):
                return None  # no level it could take from: rebalance_victims finds nobody
            for p in cr.pools:
                if p not in state.free:
                    continue
                if not givers.may_take_on(p, gi, t.size):
                    continue  # nobody on the pool has a share above its share after
                found = rebalance_victims(index, state, p, gi, t.size, cr.nodes, now)
                if found is None:
                    continue
                victims = found
                pool = p
                break
            else:
                return None  # no pool can be freed enough: preempt nothing
        if later:
            list_before_move(cr.group, {cr.group, *(v.group for v in victims)})
        text = f"rebalanced for {cr.group}"
        for v in victims:
            vpool = v.pool or pool
            lost = state.preempt(v, now, "rebalanced", text)
            out.append(
                Preemption(
                    v.id,
                    v.resource,
                    v.group,
                    vpool,
                    "rebalanced",
                    text,
                    cr.group,
                    v.size,
                    lost,
                )
            )
            moved.extend(groups[v.group].levels if v.group in groups else ())
        state.place(t, pool, now)
        out.append(Placement(t.id, name, t.group, pool, t.size, "rebalance"))
        state.active.add(name)
        if gi.user_limit is not None:  # looked at again by the repeat (F1)
            state.active.update(
                n for n in gi.resources if (q2 := state.queues.get(n)) is not None and q2.live
            )
        levels = tuple(dict.fromkeys(moved))
        givers.moved(levels)
        givers.rose(gi)
        return levels

    def none_can_act(rest: Iterable[tuple[str, CRInfo, Task]]) -> bool:
        """As before the loop: every candidate left would, at its turn, fit nowhere and find
        no pool to take from; passing one over changes nothing, so the rest of the phase
        would decide nothing."""
        return not any(
            first_fit(state, c, x.size) is not None
            or _may_act(state, givers, groups[c.group], c, x.size)
            for _, c, x in rest
        )

    rest = fixed
    if flat:
        # On a flat estate the fair order, while no share moves, is (the team's share,
        # engine.md's key): the tree picks the team with the lowest (share, first key),
        # then that team's first candidate. Until the first move, a candidate that cannot
        # act is passed over at its turn with nothing changed, so only the actors are taken
        # in that order; at the first move, every candidate before the mover was passed
        # over, and those after it go on through the tree (issue 28's steady p99: a
        # rebalancing pass moved one task, then picked its ~6,000 other candidates).
        for e in sorted(actors, key=rank):
            mark = rank(e)
            if turn(*e) is not None:
                rest = [f for f in fixed if rank(f) > mark]
                break
        else:
            return False
        if none_can_act(rest) and not unlisted_can_act(mark):
            return True
        if later or extra:  # the tree takes every candidate after the mover, in listing order
            for ns in later.values():
                for name in ns:
                    cr = resources[name]
                    t = _rebalance_candidate(index, state, cr, now)
                    if t is not None:
                        share_of(t.group)
                        extra[name] = (name, cr, t)
            later.clear()
            known = {e[0]: e for e in fixed}
            listed = (extra.get(name) or known.get(name) for name in live)
            rest = [f for f in listed if f is not None and rank(f) > mark]
    tree: FairTree[Task] = FairTree(index, state)
    left: dict[str, tuple[str, CRInfo, Task]] = {}
    for e in rest:
        name, cr, t = e
        tree.add(name, order_key(cr, cr.first_exec_pos, t), groups[t.group], t)
        left[name] = e
    changed = flat
    while len(tree):
        name = tree.pick()
        t = tree.remove(name)
        e = left.pop(name)
        if t is None:
            continue
        levels = turn(name, e[1], t)
        if levels is None:
            continue
        changed = True
        tree.moved(levels)
        if none_can_act(left.values()):
            break
    return changed


def _taking_teams(state: State) -> set[str]:
    """On a flat estate, right after ``_nobody_takes`` said someone may take: the teams whose
    share after their smallest queued task is at most the highest give (takers.py). Any
    other team's candidate has ``may_take_on`` false on every pool (its share after the
    move is above every pool's give), so it is no actor of phase 4."""
    tb = state.takers
    top = tb.top_give()
    return {g for g, a in tb.after.items() if a <= top}


def _nobody_takes(index: EstateIndex, state: State) -> bool:
    """On a flat estate, whether no team could take anything in phase 4 (takers.py): the
    figures of the teams that changed since the last look are brought up to date first. A
    necessary condition of ``Givers.any_taker``: when this says nobody, so would it."""
    tb = state.takers
    groups = index.groups
    names = groups.keys() if tb.fresh else state.taker_dirty
    tb.fresh = False
    for g in names:
        gi = groups.get(g)
        if gi is not None:
            tb.set(g, *_team_figures(index, state, gi))
    state.taker_dirty.clear()
    return tb.nobody_takes()


def _team_figures(index: EstateIndex, state: State, gi: GroupInfo) -> tuple[int | None, int | None]:
    """Takers.py's two figures of a top-level team now: its share after taking its smallest
    queued task (None: nothing queued) and its highest possible give (None: nothing placed
    above size 0), both scaled."""
    g = gi.name
    queues = state.queues
    smallest: int | None = None
    for name in gi.resources:
        q = queues.get(name)
        if q is not None and q.live and q.sizes:
            m = min(q.sizes)
            if smallest is None or m < smallest:
                smallest = m
    u = state.used.get(g, 0)
    f = shape_of(index).factor[g]
    after: int | None = None
    if smallest is not None:
        a = u + smallest - gi.reservation
        after = a * f if a > 0 else 0
    least = min((z for z in state.placed_sizes.get(g, ()) if z > 0), default=None)
    give = (u - least - gi.reservation) * f if least is not None else None
    return after, give


def _may_act(state: State, givers: "Givers", gi: GroupInfo, cr: CRInfo, size: int) -> bool:
    """Whether phase 4 could do anything for a candidate of ``size`` of ``cr`` that does not
    fit now: the same checks the loop makes before ``rebalance_victims``."""
    if not givers.may_take(gi, size):
        return False
    return any(p in state.free and givers.may_take_on(p, gi, size) for p in cr.pools)


class Givers:
    """For phase 4: per node of the organisation, the two highest shares among its
    children, so ``may_take`` answers in a few steps whether some level could give a
    candidate anything. A victim's giving level ``Y`` and the taker's ``X`` are siblings
    (the diverging levels), and ``Y``'s share after the move is below its share now, so a
    move needs ``share_after(X) < share(Y)`` for some sibling ``Y`` of some level ``X`` of
    the taker. Shares that fall leave the two highest as upper bounds (still safe to skip
    by); shares that rise are carried in (``moved``)."""

    def __init__(self, index: EstateIndex, state: State, now: int) -> None:
        self.index = index
        self.state = state
        self.shape = shape_of(index)
        self.top: dict[str, tuple[tuple[int, str], tuple[int, str]]] = {}
        self.now = now
        self.give: dict[str, int] = {}
        """Pool → its scaled ``give`` (``may_take_on``): an upper bound once shares fall
        (victims leaving), dropped when a rebalance places (``rose``)."""
        for node, children in self.shape.children.items():
            self._rank(node, children)

    def _rank(self, node: str, children: list[str]) -> None:
        a: tuple[int, str] = (-1, "")
        b: tuple[int, str] = (-1, "")
        for c in children:
            e = (scaled_share(self.shape, self.index, self.state, c), c)
            if e > a:
                a, b = e, a
            elif e > b:
                b = e
        self.top[node] = (a, b)

    def moved(self, levels: tuple[str, ...]) -> None:
        shape = self.shape
        for x in levels:
            up = shape.parent.get(x)
            if up is None:
                continue
            a, b = self.top[up]
            best = {a[1]: a[0], b[1]: b[0]}
            s = scaled_share(shape, self.index, self.state, x)
            best[x] = max(best.get(x, -1), s)  # a share that fell keeps its old bound
            ranked = sorted(((v, k) for k, v in best.items()), reverse=True)
            a, b = ranked[0], ranked[1] if len(ranked) > 1 else (-1, "")
            self.top[up] = (a, b)

    def may_take(self, gi: GroupInfo, size: int) -> bool:
        """Whether some sibling of some level of ``gi`` has a share above the level's share
        after taking ``size``."""
        shape = self.shape
        used = self.state.used
        groups = self.index.groups
        for x in gi.levels:
            a, b = self.top[shape.parent[x]]
            best = b[0] if a[1] == x else a[0]
            after = used.get(x, 0) + size - groups[x].reservation
            if (after * shape.factor[x] if after > 0 else 0) < best:
                return True
        return False

    def may_take_on(self, pool: str, gi: GroupInfo, size: int) -> bool:
        """Whether some placed task on ``pool`` could be a victim of ``gi``'s candidate of
        ``size``: a necessary condition of ``rebalance_victims`` finding one, so a pool that
        fails it is passed over without looking at its tasks one by one.

        A victim ``v`` needs ``share_after(X) <= (used(Y) - chosen(Y) - reservation(Y)) /
        w(Y)`` with ``chosen(Y) >= size(v)``, ``X`` a level of the taker and ``Y`` one of
        ``v``'s, and ``v`` unprotected, not orphaned, of a size above 0. So some level ``x``
        of ``gi`` must have ``share_after(x) <= give(pool)``, the highest ``(used(z) -
        size(v) - reservation(z)) / w(z)`` over such tasks ``v`` on the pool and the levels
        ``z`` of their groups (``_give``)."""
        top = self.give.get(pool)
        if top is None:
            top = self.give[pool] = self._give(pool)
        if top < 0:
            return False
        shape = self.shape
        used = self.state.used
        groups = self.index.groups
        for x in gi.levels:
            after = used.get(x, 0) + size - groups[x].reservation
            if (after * shape.factor[x] if after > 0 else 0) <= top:
                return True
        return False

    def _give(self, pool: str) -> int:
        """The scaled ``give`` of ``pool`` (``may_take_on``); -1 when no task there could be
        a victim. A group's smallest eligible task gives its highest bound."""
        index, state, now = self.index, self.state, self.now
        groups = index.groups
        factor = self.shape.factor
        used = state.used
        protecting = index.protecting
        in_order = state.placed_in_time_order
        top = -1
        for h, tasks in state.placed_by_pool_group.get(pool, {}).items():
            hi = groups.get(h)
            if hi is None or not tasks:
                continue
            pm = hi.protect_ms if protecting else 0
            smallest = 0
            for v in tasks.values():
                if pm > 0 and v.placed_at is not None and now - v.placed_at < pm:
                    if in_order:
                        break  # the rest were placed later: protected too
                    continue
                sz = v.size
                if sz <= 0 or v.orphan or (smallest and sz >= smallest):
                    continue
                smallest = sz
            if not smallest:
                continue
            for z in hi.levels:
                g = (used.get(z, 0) - smallest - groups[z].reservation) * factor[z]
                if g > top:
                    top = g
        return top

    def rose(self, gi: GroupInfo) -> None:
        """A rebalance moved GPUs: usage rose at ``gi``'s levels and a task joined a pool,
        so every pool's bound is found again when next asked (rare: the steady pass
        rebalances nothing)."""
        self.give.clear()

    def any_taker(self) -> bool:
        """Whether some team with queued work could take something, by its smallest queued
        task (a larger one's share after the move is higher still), from some pool of its
        queues (``may_take_on``, by the same smallest size; the pools of all its compute
        resources: a superset, so still only a necessary condition)."""
        queues = self.state.queues
        free = self.state.free
        pools_of = _group_pools(self.index)
        for gi in self.index.groups.values():
            smallest: int | None = None
            for name in gi.resources:
                q = queues.get(name)
                if q is not None and q.live:
                    m = min(q.sizes) if q.sizes else None
                    if m is not None and (smallest is None or m < smallest):
                        smallest = m
            if smallest is None or not self.may_take(gi, smallest):
                continue
            if any(p in free and self.may_take_on(p, gi, smallest) for p in pools_of[gi.name]):
                return True
        return False


_POOLS: dict[str, dict[str, tuple[str, ...]]] = {}


def _group_pools(index: EstateIndex) -> dict[str, tuple[str, ...]]:
    """Per group, the pools of its compute resources, cached by revision."""
    k = _POOLS.get(index.revision)
    if k is None:
        if len(_POOLS) >= 8:
            _POOLS.clear()
        k = _POOLS[index.revision] = {
            g: tuple(dict.fromkeys(p for n in gi.resources for p in index.resources[n].pools))
            for g, gi in index.groups.items()
        }
    return k
