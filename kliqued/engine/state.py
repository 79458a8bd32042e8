"""The engine's state: tasks, queues, what is placed where, and the budget meters.

The caller (daemon or simulator) owns one ``State`` and tells it what happened (a task was
submitted, ended, the engine switched off); ``run_pass`` then decides and applies its own
decisions to the same object. The state keeps every counter a pass needs (used per group, free
per pool, placed tasks per pool and group in placement order) up to date as things happen, so
a pass costs what changed, not the size of the estate. Nothing here reads a clock: every call
carries its time, in integer milliseconds, and times never go backwards.
"""

from __future__ import annotations

import difflib
import heapq

from klique_util.excerpt import excerpt
from klique_util.nodefit import choose_nodes, describe, largest_fit, shape_fits, share
from klique_util.units import from_milli

from .budget import Meter
from .decisions import Cancellation
from .fairpark import FairParking
from .takers import TakerBounds
from .errors import DuplicateTask, SubmissionError, TimeWentBackwards, UnknownTask
from .index import CRInfo, EstateIndex, PoolInfo
from .periods import Period
from .queues import CRQueue
from .task import ENDED, PLACED, QUEUED, Task
from .victims import lost_work
from .watch import Watchers, level_key, pool_hold

__all__ = ["Task", "State", "QUEUED", "PLACED", "ENDED", "check_submission", "SubmissionError"]


def _did_you_mean(index: EstateIndex, resource: str, user: str) -> str:
    """The compute resources ``user`` may send to that ``resource`` may have meant: the same
    profile under a policy (``l40s-1x`` for ``llm-research/l40s-1x``), else a near spelling.
    Only resources of the user's own groups are named, so a refusal tells nothing of others'."""
    mine = sorted(
        name
        for name, cr in index.resources.items()
        if user in index.users.get(cr.group, frozenset())
    )
    near = (
        [name for name in mine if name.split("/", 1)[-1] == resource] if "/" not in resource else []
    )
    near = near or difflib.get_close_matches(resource, mine, n=3)
    if not near:
        return ""
    return (
        f"; did you mean {' or '.join(near)}? (a compute resource is POLICY/PROFILE: "
        "kliqued resources lists yours)"
    )


def check_submission(
    index: EstateIndex,
    resource: str,
    user: str,
    project: str | None,
    gpus_milli: int | None,
    *,
    require_project: bool = False,
) -> int:
    """The task's size in milli-GPUs, or a :class:`SubmissionError` saying why the estate does
    not accept it. The daemon's API and the simulator both call this, so the rules for who may
    send what are written once.

    A named project must be one of the group's projects when it lists any (scenarios.md). A
    task may name none (organisation.md orders "tasks of no listed project last"), so the
    engine and the simulator accept that; the daemon's API passes ``require_project`` because
    it records use against a project (docs/decisions.md, issue 10)."""
    cr = index.resources.get(resource)
    if cr is None:
        raise SubmissionError(
            "resource",
            f"unknown compute resource {excerpt(resource)}{_did_you_mean(index, resource, user)}",
        )
    users = index.users.get(cr.group, frozenset())
    if user not in users:
        raise SubmissionError(
            "user", f"user {excerpt(user)} is not in the users of group {cr.group!r}"
        )
    projects = index.projects.get(cr.group, frozenset())
    if projects and project not in projects and (project is not None or require_project):
        allowed = ", ".join(sorted(projects))
        if project is None:
            raise SubmissionError(
                "project",
                f"project required: group {cr.group!r} records "
                f"its use against a project; give one of {allowed}",
            )
        raise SubmissionError(
            "project",
            f"project {excerpt(project)} is not a project of group "
            f"{cr.group!r}: give one of {allowed}",
        )
    if gpus_milli is not None:
        if cr.fixed_size is not None:
            raise SubmissionError(
                "gpus", f"profile {cr.profile!r} has a fixed size; a task cannot set gpus"
            )
        if gpus_milli < 0:
            raise SubmissionError("gpus", "gpus must be >= 0")
        if cr.max_size is not None and gpus_milli > cr.max_size:
            raise SubmissionError(
                "gpus",
                f"gpus {from_milli(gpus_milli):g} is above the "
                f"maximum of profile '{cr.profile}' "
                f"({from_milli(cr.max_size):g})",
            )
    size = cr.size_for(gpus_milli)
    _check_nodes(index, cr, size)
    g = index.groups.get(cr.group)
    if g is not None and size > g.limit:
        raise SubmissionError(
            "gpus",
            f"gpus {from_milli(size):g} is above the limit of "
            f"group '{cr.group}' ({from_milli(g.limit):g})",
        )
    return size


def _check_nodes(index: EstateIndex, cr: CRInfo, size: int) -> None:
    """A task that no machine of its profile's pools could ever hold is refused, naming the
    largest shape (issue 15); pools that declare no nodes hold any size up to capacity."""
    if cr.nodes == 1 and not index.shaped:
        return
    if cr.nodes > 1 and share(size, cr.nodes) is None:
        raise SubmissionError(
            "gpus",
            f"gpus {from_milli(size):g} cannot be split evenly over "
            f"the {cr.nodes} nodes of profile '{cr.profile}': give a "
            f"multiple of {cr.nodes}",
        )
    shaped = [index.pools[p] for p in cr.pools if p in index.pools]
    if not shaped or any(not info.shapes for info in shaped):
        return
    if any(shape_fits_info(info, size, cr.nodes) for info in shaped):
        return
    best = max(shaped, key=lambda info: largest_fit(info.shapes, cr.nodes))
    over = f" over {cr.nodes} nodes" if cr.nodes > 1 else ""
    raise SubmissionError(
        "gpus",
        f"gpus {from_milli(size):g}{over} fits no machine of the "
        f"pools of profile '{cr.profile}': the largest task is "
        f"{from_milli(largest_fit(best.shapes, cr.nodes)):g} GPUs{over} "
        f"(pool {best.name}: {describe(best.shapes)})",
    )


def shape_fits_info(info: PoolInfo, size: int, nodes: int) -> bool:
    return shape_fits(info.shapes, size, nodes)


class State:
    """Everything that changes; one per daemon or simulation."""

    def __init__(
        self,
        index: EstateIndex,
        now: int,
        enabled: bool = True,
        self_starting: set[str] | None = None,
    ) -> None:
        self.index: EstateIndex | None = None
        self.clock = now
        self.enabled = enabled
        self.enabled_since = now
        """When the engine was last switched (on or off): a credit (``end`` with
        ``ran_until``) takes budget charges back only after it."""
        self.tasks: dict[str, Task] = {}
        self.queues: dict[str, CRQueue] = {}
        self.used: dict[str, int] = {}
        """Milli-GPUs placed per group; an envelope's group counts its whole subtree
        (organisation.md ``used(x)``)."""
        self.user_used: dict[tuple[str, str], int] = {}
        """Milli-GPUs placed per (group, user): the user limit."""
        self.pool_used: dict[str, int] = {}
        self.free: dict[str, int] = {}
        self.node_free: dict[str, list[int]] = {}
        """Per pool that declares nodes: each machine's room (issue 15)."""
        self.node_room: dict[str, int] = {}
        """Per pool that declares nodes: the most room on one machine."""
        self.placed_by_group: dict[str, dict[str, Task]] = {}
        self.placed_sizes: dict[str, dict[int, int]] = {}
        """Per group: how many placed tasks have each size (phase 4's gate asks for the
        smallest; takers.py)."""
        self.placed_by_pool_group: dict[str, dict[str, dict[str, Task]]] = {}
        self.pool_group_used: dict[str, dict[str, int]] = {}
        self.meters: dict[str, Meter] = {}
        self.submit_seq = 0
        self.place_seq = 0
        self.last_placed_at: int | None = None
        self.rebalance_idle: tuple[int, int] | None = None
        """(moment, ``version``) of the last phase 4 that decided nothing: the repeat of
        a pass that placed and preempted nothing since runs it to the same end, and
        skips it (every placement and preemption moves ``version``)."""
        self.placed_in_time_order = True
        """Every placement so far came at or after the one before: then each pool's and
        group's placed tasks (in placement order) are also in ``placed_at`` order, and the
        tasks still protected are a suffix of them (phase 4 stops at the first)."""
        # What the next pass must look at (see passes.py).
        self.dirty = True
        self.active: set[str] = set()
        self.reclaim: set[str] = set()
        self.freed_pools: set[str] = set()
        self.freed_levels: set[str] = set()
        """Envelopes whose usage fell since the last pass: phase 3 wakes the queues parked on
        their limit one at a time, in order, as it does for a pool's room."""
        self.held: dict[str, set[str]] = {}
        """Per group: its compute resources that phase 3 left waiting on the group's limit or
        budget (no pool watches them), woken when the group's usage falls."""
        self.watchers = Watchers({})
        self.fair_parking = FairParking()
        """``order: fair`` on a flat estate: the lend-parked queues by share (passes)."""
        self.share_fell: set[str] = set()
        """Groups whose usage fell since the last fair phase 3 (their shares fell)."""
        self.takers = TakerBounds()
        """``order: fair`` on a flat estate: phase 4's gate (passes, takers.py)."""
        self.taker_dirty: set[str] = set()
        """Groups whose usage, placed tasks or queued tasks changed since the gate last
        looked at them."""
        self.rate_changed: set[str] = set()
        self.triggers: list[tuple[int, str, int]] = []
        self.trigger_version: dict[str, int] = {}
        self.budget_check_all = True
        self.alerts_raised: dict[str, tuple[int, set[int]]] = {}
        self.last_pass_at: int | None = None
        self.pending_cancellations: list[Cancellation] = []
        self.version = 0
        """Bumped by every change: a PassResult's lazy views refuse a changed state."""
        self.pass_budget_left: dict[str, tuple[int, Meter]] | None = None
        """While a pass runs: what is left of each budgeted level's budget at the pass's
        moment, and its meter, as the start checks first ask for them
        (rules._level_budget_ok); None between passes."""
        self.no_worker: set[str] = set()
        """Pools with no live worker (the caller says so: ``set_pool_live``)."""
        self.no_autoscaler: set[str] = set()
        """Autoscaled pools whose autoscaler is not running (the caller says so:
        ``set_autoscaler_live``); every autoscaler runs until then (the simulator)."""
        self.unavailable: set[str] = set()
        """Pools that take no new placements: those with no live worker, except autoscaled
        ones whose autoscaler runs (their nodes come with the demand placed on them).
        Absent from ``free``."""
        self.self_starting: set[str] | None = self_starting
        """Pools whose tasks count as started once placed; None: every pool (a caller that
        has no workers to wait for). The daemon sets an empty set and reports each start
        (``set_started``); the simulator keeps the pools a scenario gives no ``workers``."""
        self.start_deadlines: list[tuple[int, int, str, int]] = []
        """Heap of (moment, place seq, task id, start token): when a placed task that no
        worker took goes back to its queue, its start timeout being over and its pool
        without a live worker. An entry applies only while the task is placed, unstarted,
        with the same token, on a pool with no live worker; the others are dropped on the
        way."""
        self.recalled: dict[str, str] = {}
        """Per placed task sent back by ``set_pool_live`` to an earlier pool of its profile
        that took work again: that pool, for the requeue's reason. Dropped with the
        requeue, or when a worker takes the task first."""
        self.lost_units: dict[str, int] = {}
        """Per level (group with a policy): milli-GPU x ms of work lost by the preemptions of
        its subtree's tasks (lending.md: size x lost work at each preemption)."""
        self.protection_ends: list[tuple[int, int, str]] = []
        """Heap of (moment, place seq, task id): when a placed task's protection ends
        (lending.md); an entry applies only while the task keeps that placement. Empty
        unless some policy protects."""
        self.bind(index, now)

    # ---------------------------------------------------------------- reading
    def room(self, pool: str) -> int:
        """The largest single-machine task ``pool`` takes now: its free GPUs, and, when it
        declares nodes, no more than its roomiest machine; -1 when it takes no work."""
        f = self.free.get(pool, -1)
        r = self.node_room.get(pool)
        return f if r is None or f < r else r

    def meter(self, group: str) -> Meter:
        m = self.meters.get(group)
        if m is None:
            m = self.meters[group] = Meter(self.clock)
        return m

    def queue(self, resource: str) -> list[Task]:
        q = self.queues.get(resource)
        return list(q) if q else []

    def position(self, task_id: str) -> int | None:
        """0-based place in line of a queued task (0 = the head of its compute resource), in
        O(log n); None when it is not queued."""
        t = self.tasks.get(task_id)
        if t is None or t.status != QUEUED:
            return None
        return self.queues[t.resource].position(t)

    def placed_tasks(self) -> list[Task]:
        return [t for d in self.placed_by_group.values() for t in d.values()]

    def placed_of(self, group: str) -> list[Task]:
        """The group's placed tasks, oldest placement first (a copy: callers may not edit
        the engine's index)."""
        return list(self.placed_by_group.get(group, {}).values())

    def placed_on(self, pool: str) -> list[Task]:
        """The tasks placed on ``pool`` (a copy), grouped by group."""
        return [t for d in self.placed_by_pool_group.get(pool, {}).values() for t in d.values()]

    def borrowed_by_pool(self) -> dict[str, int]:
        """Milli-GPUs on each pool held by groups above their reservation. A group's borrowed
        amount (used - reservation) is counted on its newest placements, the ones a reclaim
        takes first (engine.md, reclaim.choose_victims), so the figure says where
        reclaimable work sits."""
        groups = self.index.groups if self.index is not None else {}
        out: dict[str, int] = {}
        for g, tasks in self.placed_by_group.items():
            gi = groups.get(g)
            over = self.used.get(g, 0) - (gi.reservation if gi is not None else 0)
            for t in reversed(tasks.values()):
                if over <= 0:
                    break
                take = min(over, t.size)
                if t.pool is not None:
                    out[t.pool] = out.get(t.pool, 0) + take
                over -= take
        return out

    def take_cancellations(self) -> list[Cancellation]:
        """The cancellations ``bind`` made since the last pass, handed over once (the pass
        reports them)."""
        out = self.pending_cancellations
        self.pending_cancellations = []
        return out

    def wait_for_starts(self, pool: str) -> bool:
        """From now on, tasks placed on ``pool`` count as started only when a worker reports
        it (``set_started``). True when the pool counted its placements as started until now
        (the simulator's pool that gets workers)."""
        if self.self_starting is None:
            self.self_starting = set(self.index.pools) if self.index is not None else set()
        if pool not in self.self_starting:
            return False
        self.self_starting.discard(pool)
        return True

    def _counted(self, group: str) -> tuple[str, ...]:
        """The groups whose counters sum to ``group``'s subtree: itself when it has a policy
        (an envelope's counters already cover its subtree), else the teams below it."""
        idx = self.index
        if idx is None or group in idx.groups:
            return (group,)
        return idx.teams_below.get(group, (group,))

    def used_by(self, group: str) -> int:
        """Milli-GPUs placed in ``group``'s subtree (a group with no policy sums its teams)."""
        return sum(self.used.get(g, 0) for g in self._counted(group))

    def gpu_units(self, group: str, now: int) -> int:
        """Ledger milli-GPU x ms of the group's subtree up to ``now`` (counts while disabled
        too)."""
        total = 0
        for g in self._counted(group):
            m = self.meters.get(g)
            total += m.gpu_used(now) if m else 0
        return total

    def lost_gpu_units(self, group: str) -> int:
        """Milli-GPU x ms lost by preemptions of ``group``'s subtree so far (lending.md)."""
        return sum(self.lost_units.get(g, 0) for g in self._counted(group))

    def protection_due(self, now: int) -> bool:
        """Whether some placed task's protection ended at or before ``now`` since the last
        look (those entries are dropped: the pass about to run sees them unprotected)."""
        h = self.protection_ends
        due = False
        while h and h[0][0] <= now:
            _, seq, tid = heapq.heappop(h)
            t = self.tasks.get(tid)
            if t is not None and t.status == PLACED and t.place_seq == seq:
                due = True
        return due

    def next_protection_end(self) -> int | None:
        """The next moment a placed task's protection ends, if any."""
        h = self.protection_ends
        while h:
            _, seq, tid = h[0]
            t = self.tasks.get(tid)
            if t is not None and t.status == PLACED and t.place_seq == seq:
                return h[0][0]
            heapq.heappop(h)
        return None

    def _protect(self, t: Task) -> None:
        idx = self.index
        if idx is None or not idx.protecting or t.placed_at is None:
            return
        gi = idx.groups.get(t.group)
        if gi is not None and gi.protect_ms > 0:
            heapq.heappush(self.protection_ends, (t.placed_at + gi.protect_ms, t.place_seq, t.id))

    def weighted_units(self, group: str, period: Period, now: int) -> int:
        total = 0
        for g in self._counted(group):
            m = self.meters.get(g)
            total += m.used(period, now, self.enabled) if m else 0
        return total

    # ---------------------------------------------------------------- changes from outside
    def _tick(self, at: int) -> None:
        if at < self.clock:
            raise TimeWentBackwards(f"time went backwards: {at} < {self.clock}")
        self.clock = at
        self.version += 1
        self.dirty = True

    def submit(
        self,
        task_id: str,
        resource: str,
        user: str,
        project: str | None = None,
        gpus_milli: int | None = None,
        *,
        at: int,
        checked: bool = False,
        checkpoint_ms: int | None = None,
    ) -> Task:
        """Queues a new task at the back of its compute resource. Raises SubmissionError for
        what the estate does not allow, DuplicateTask for a task id already used.
        ``checked``: the caller ran ``check_submission`` against this estate already (the
        daemon does before it logs a submission, and its log replays in order), so it is
        not run twice; an unknown compute resource is still refused. ``checkpoint_ms``: the
        task checkpoints that often in each placement (lending.md's lost work)."""
        assert self.index is not None
        if task_id in self.tasks:
            raise DuplicateTask(f"task id {excerpt(task_id)} is already used")
        known = self.index.resources.get(resource) if checked else None
        size = (
            known.size_for(gpus_milli)
            if known is not None
            else check_submission(self.index, resource, user, project, gpus_milli)
        )
        self._tick(at)
        cr = self.index.resources[resource]
        self.submit_seq += 1
        t = Task(
            task_id,
            resource,
            cr.group,
            user,
            project,
            gpus_milli,
            size,
            cr.weight,
            self.submit_seq,
            at,
        )
        t.nodes = cr.nodes
        t.checkpoint_every = checkpoint_ms if checkpoint_ms is not None and checkpoint_ms > 0 else 0
        self.tasks[task_id] = t
        q = self.queues.get(resource)
        if q is None:
            gi = self.index.groups.get(cr.group)
            q = self.queues[resource] = CRQueue(gi.project_rank if gi is not None else None)
        q.push(t)
        self.active.add(resource)
        self.taker_dirty.add(cr.group)
        return t

    def checkpoint(self, task_id: str, at: int) -> None:
        """The placed task saved its work at ``at`` (its worker says so): a preemption from
        now on loses only the work since (lending.md). Ignored for a task not placed. It
        changes no decision by itself, so it asks for no pass."""
        t = self.tasks.get(task_id)
        if t is None or t.status != PLACED or t.placed_at is None or at < t.placed_at:
            return
        if t.checkpoint_at is None or at > t.checkpoint_at:
            t.checkpoint_at = at

    def end(
        self, task_id: str, at: int, kind: str = "finished", ran_until: int | None = None
    ) -> bool:
        """The task finished, failed or was cancelled. A task that already ended is left as
        it is (False). ``ran_until``: a placed task that ended earlier than ``at``, the
        moment the caller heard of it (a worker's report delayed by the worker's restart, a
        network cut, a full disk): its state changes at ``at`` (time never goes back for the
        passes), and the budget and GPU time it was charged after ``ran_until`` are taken
        back at each of its levels (``Meter.credit``), so the meters charge what ran.
        Clamped to the placement and ``at``."""
        t = self.tasks.get(task_id)
        if t is None:
            raise UnknownTask(task_id)
        if t.status == ENDED:
            return False
        self._tick(at)
        ended = at
        if t.status == PLACED:
            placed_at = t.placed_at if t.placed_at is not None else at
            ended = at if ran_until is None else max(placed_at, min(ran_until, at))
            self._unplace(t, at)
            if ended < at:
                self._credit(t, ended, at)
        else:
            self._dequeue(t)
        t.status = ENDED
        t.end_kind = kind
        t.ended_at = ended
        return True

    def _credit(self, t: Task, start: int, end: int) -> None:
        """Takes back ``t``'s charge over ``[start, end)`` at each of its levels. The budget
        part only when the engine was on over the whole span (it charged nothing while off:
        the span after the last switch is taken back, the rest was never charged)."""
        gi = self.index.groups.get(t.group) if self.index is not None else None
        charged_from = max(start, self.enabled_since)
        for x in gi.levels if gi is not None else (t.group,):
            m = self.meter(x)
            if self.enabled and charged_from < end:
                m.credit(charged_from, end, t.weight, 0, True)
            m.credit(start, end, 0, t.size, False)
        self.rate_changed.update(gi.levels if gi is not None else (t.group,))

    def set_enabled(self, enabled: bool, at: int) -> None:
        """Switches the engine. While off there are no passes and no budget charge; the
        ledger's GPU-hours still count."""
        if enabled == self.enabled:
            return
        self._tick(at)
        for m in self.meters.values():
            m.settle(at, self.enabled)
        self.enabled = enabled
        self.enabled_since = at
        self.budget_check_all = True
        self.rate_changed.update(self.meters)

    def set_pool_live(self, pool: str, live: bool, at: int) -> None:
        """Whether ``pool`` has a live worker. Without one it takes no new placements, unless
        it autoscales and its autoscaler runs (``set_autoscaler_live``: the autoscaler
        launches nodes for the work placed there); its placed tasks stay, and those no
        worker took go back to their queue once their start timeout is over. A pool coming
        back is looked at by the next pass as if room had just freed there."""
        if live == (pool not in self.no_worker):
            return
        self._tick(at)
        if not live:
            self.no_worker.add(pool)
            # Its unstarted work goes back at its deadline, or now if that is past: a rare
            # change, so looking at the pool's placed tasks here is cheap.
            for t in self._unstarted_on(pool):
                if t.start_deadline is not None:
                    heapq.heappush(
                        self.start_deadlines,
                        (max(t.start_deadline, at), t.place_seq, t.id, t.start_token),
                    )
            self._set_available(pool, at)
            return
        self.no_worker.discard(pool)
        self._set_available(pool, at)
        # Gangs wait on the pool itself (not on its room watchers): a pool that takes work
        # again is news to them too.
        self._wake_gangs(pool)
        self._recall(pool, at)

    def _recall(self, pool: str, at: int) -> None:
        """``pool`` takes work again (its worker came back): the unstarted work that went,
        meanwhile, to a later pool of its profile where no worker is live (an autoscaled
        pool whose node has not come) goes back to the front of its queue at once, so the
        next pass places it by the profile's order, on ``pool`` if it has room, rather than
        waiting there up to the start timeout while ``pool``'s worker sits idle
        (docs/decisions.md N8). A rare change: O(unstarted tasks on pools without a
        worker)."""
        if self.index is None or pool in self.unavailable:
            return
        for other in sorted(self.no_worker):
            for t in self._unstarted_on(other):
                cr = self.index.resources.get(t.resource)
                if (
                    cr is None
                    or t.orphan
                    or pool not in cr.pools
                    or other not in cr.pools
                    or cr.pools.index(pool) > cr.pools.index(other)
                ):
                    continue
                t.start_token += 1
                t.start_deadline = at
                self.recalled[t.id] = pool
                heapq.heappush(self.start_deadlines, (at, t.place_seq, t.id, t.start_token))

    def set_autoscaler_live(self, pool: str, live: bool, at: int) -> None:
        """Whether the autoscaler of the autoscaled ``pool`` runs (the caller hears its
        heartbeat). An autoscaled pool with no live worker takes work only while it does:
        with neither, nothing can start what is placed there, so the pool takes no new
        placements (reason ``no autoscaler running for P``) and its placed tasks no worker
        took go back to the front of their queues at once (kind ``unstarted``), as a lost
        worker's do, rather than holding capacity and budget until their start timeout.
        Ignored for other pools (a pool that does not autoscale needs a worker anyway)."""
        if live == (pool not in self.no_autoscaler):
            return
        self._tick(at)
        if live:
            self.no_autoscaler.discard(pool)
        else:
            self.no_autoscaler.add(pool)
        self._set_available(pool, at)
        if live:
            self._wake_gangs(pool)

    def takes_work(self, pool: str) -> bool:
        """The liveness rule (docs/decisions.md N1, N2, N7): a live worker, or, for an
        autoscaled pool, a live autoscaler."""
        if pool not in self.no_worker:
            return True
        info = self.index.pools.get(pool) if self.index is not None else None
        return info is not None and info.autoscaled and pool not in self.no_autoscaler

    def _unstarted_on(self, pool: str) -> list[Task]:
        return [
            t
            for d in self.placed_by_pool_group.get(pool, {}).values()
            for t in d.values()
            if not t.started
        ]

    def _set_available(self, pool: str, at: int) -> None:
        """Puts ``pool`` in or out of ``unavailable`` (and ``free``) as ``takes_work`` says.
        An autoscaled pool going out sends its unstarted work back at once (an entry due
        at ``at``, which applies only while the pool stays out)."""
        down = not self.takes_work(pool)
        if down == (pool in self.unavailable):
            return
        info = self.index.pools.get(pool) if self.index is not None else None
        if down:
            self.unavailable.add(pool)
            self.free.pop(pool, None)
            if info is not None and info.autoscaled:
                for t in self._unstarted_on(pool):
                    heapq.heappush(self.start_deadlines, (at, t.place_seq, t.id, t.start_token))
            return
        self.unavailable.discard(pool)
        if info is not None:
            self.free[pool] = info.capacity - self.pool_used.get(pool, 0)
            self.freed_pools.add(pool)

    def _wake_gangs(self, pool: str) -> None:
        gang = self.held.pop(pool_hold(pool), None)
        if gang:
            self.active.update(n for n in gang if n in self.queues)

    def set_started(self, task_id: str, started: bool, at: int) -> None:
        """A worker took the placed task (``True``), or gave it back unstarted (``False``:
        its start timeout counts again from ``at``). Ignored for a task not placed."""
        t = self.tasks.get(task_id)
        if t is None or t.status != PLACED or t.started == started:
            return
        t.started = started
        if started:
            t.start_token += 1  # its pending deadline no longer applies
            self.recalled.pop(task_id, None)
            return
        self._tick(at)
        self._start_timer(t, at)

    def restart_start_timers(self, at: int) -> None:
        """Every placed task no worker took gets its full start timeout again from ``at``: a
        restarted daemon gives workers time to come back rather than requeueing at once the
        work that waited while it was down. Once per start, O(placed tasks)."""
        for d in self.placed_by_group.values():
            for t in d.values():
                if not t.started:
                    self._start_timer(t, at)
        self.version += 1

    def _start_timer(self, t: Task, at: int) -> None:
        t.start_token += 1
        self.recalled.pop(t.id, None)  # a new timer replaces a recall (a restart's grace)
        info = self.index.pools.get(t.pool or "") if self.index is not None else None
        timeout = info.start_timeout if info is not None else 0
        t.start_timeout = timeout
        t.start_deadline = at + timeout if timeout > 0 else None
        if t.start_deadline is not None and t.pool in self.no_worker:
            heapq.heappush(
                self.start_deadlines, (t.start_deadline, t.place_seq, t.id, t.start_token)
            )

    def start_entry_task(self, entry: tuple[int, int, str, int]) -> Task | None:
        t = self.tasks.get(entry[2])
        if (
            t is not None
            and t.status == PLACED
            and not t.started
            and t.start_token == entry[3]
            and t.pool in self.no_worker
            and (
                t.pool in self.unavailable
                or (t.start_deadline is not None and entry[0] >= t.start_deadline)
            )
        ):
            # a pool out of work sends it back at once; otherwise only its deadline does
            return t
        return None

    def start_due(self, now: int) -> bool:
        """Whether some placed task's start deadline is at or before ``now`` (the entries of
        tasks started, requeued or ended since are dropped on the way)."""
        h = self.start_deadlines
        while h:
            if self.start_entry_task(h[0]) is not None:
                return h[0][0] <= now
            heapq.heappop(h)
        return False

    def next_start_deadline(self) -> int | None:
        """The earliest start deadline still pending, if any."""
        self.start_due(-1)  # drops the entries that no longer apply from the top
        return self.start_deadlines[0][0] if self.start_deadlines else None

    def note_alert(self, group: str, period_start: int, threshold_milli: int) -> None:
        """Records that an alert was already raised (a daemon replaying its log), so the
        engine does not raise it a second time in the same period."""
        raised = self.alerts_raised.get(group)
        if raised is None or raised[0] != period_start:
            raised = self.alerts_raised[group] = (period_start, set())
        raised[1].add(threshold_milli)

    def forget(self, task_id: str) -> None:
        """Drops an ended task (a long-running daemon's memory), and its cancellation if one
        is still to be reported: the task ended another way first."""
        t = self.tasks.get(task_id)
        if t is not None and t.status == ENDED:
            del self.tasks[task_id]
            if self.pending_cancellations:
                self.pending_cancellations = [
                    c for c in self.pending_cancellations if c.task != task_id
                ]

    # ---------------------------------------------------------------- the estate
    def bind(self, index: EstateIndex, at: int) -> list[Cancellation]:
        """Adopts a new compiled estate. Queued tasks of a removed compute resource are
        cancelled (returned, and reported by the next pass); its placed tasks keep running to
        their end. Queued tasks take their profile's current size and weight; placed tasks
        keep what they were placed with. Nothing is preempted here: a lowered limit or
        capacity only makes new work wait (engine.md)."""
        if index is self.index:
            return []
        self._tick(at)
        old = self.index
        self.index = index
        cancels: list[Cancellation] = []
        for name in list(self.queues):
            q = self.queues[name]
            cr = index.resources.get(name)
            gi = index.groups.get(cr.group) if cr is not None else None
            ranks = gi.project_rank if gi is not None else None
            if cr is not None and ranks != q.ranks:
                q = self.queues[name] = self._requeued(q, ranks)
            if cr is None:
                for t in list(q):
                    self._dequeue(t)
                    t.status = ENDED
                    t.end_kind = "cancelled"
                    t.ended_at = at
                    c = Cancellation(
                        t.id, name, t.group, f"compute resource {name} was removed from the estate"
                    )
                    cancels.append(c)
                continue
            for t in list(q):
                was = t.size
                t.size = cr.size_for(t.requested)
                t.weight = cr.weight
                t.nodes = cr.nodes
                if t.size != was:
                    q.resized(t, was)
        for d in self.placed_by_group.values():
            for t in d.values():
                t.orphan = t.resource not in index.resources
        self._recount_envelopes(old, index, at)
        self.unavailable = {
            p
            for p in self.no_worker
            if p not in index.pools or not index.pools[p].autoscaled or p in self.no_autoscaler
        }
        self.free = {
            p: info.capacity - self.pool_used.get(p, 0)
            for p, info in index.pools.items()
            if p not in self.unavailable
        }
        self._repack_nodes(index)
        self.active = {n for n, q in self.queues.items() if q.live and n in index.resources}
        self.reclaim = set()
        self.held = {}
        watched = {p: len(info.resources) for p, info in index.pools.items()}
        watched.update(
            {
                level_key(g): len(gi.subtree_resources)
                for g, gi in index.groups.items()
                if gi.envelope
            }
        )
        self.watchers = Watchers(watched)
        self.fair_parking = FairParking()
        self.share_fell = set()
        self.takers = TakerBounds()
        self.taker_dirty = set()
        self.freed_pools = set(index.pools)
        self.freed_levels = set()
        # A changed protect_for applies to placed tasks at once (lending.md).
        self.protection_ends = []
        if index.protecting:
            for d in self.placed_by_group.values():
                for t in d.values():
                    self._protect(t)
            heapq.heapify(self.protection_ends)
        self.budget_check_all = True
        self.rate_changed.update(self.meters)
        self.pending_cancellations.extend(cancels)
        return cancels

    def _repack_nodes(self, index: EstateIndex) -> None:
        """Each pool's machines under the (new) estate, with the placed tasks put back on them
        in placement order. A task that no longer fits the declared machines (they shrank)
        still holds its GPUs, on the roomiest machines, which may go below zero: like a
        lowered capacity, that preempts nothing and makes new work wait."""
        self.node_free = {
            p: list(info.node_caps) for p, info in index.pools.items() if info.node_caps
        }
        placed = sorted(
            (t for d in self.placed_by_group.values() for t in d.values()),
            key=lambda t: t.place_seq,
        )
        for t in placed:
            nf = self.node_free.get(t.pool or "")
            if nf is None:
                t.alloc = ()
                continue
            picked = choose_nodes(nf, t.size, t.nodes)
            if picked is None:
                n = max(1, min(t.nodes, len(nf)))
                picked = sorted(sorted(range(len(nf)), key=lambda i: (-nf[i], i))[:n])
            each = t.size // len(picked)
            t.alloc = tuple((i, each) for i in picked)
            for i, amount in t.alloc:
                nf[i] -= amount
        self.node_room = {p: max(nf) for p, nf in self.node_free.items()}

    @staticmethod
    def _requeued(q: CRQueue, ranks: dict[str, int] | None) -> CRQueue:
        """The queue under a new project order: the same tasks, re-placed in line."""
        nq = CRQueue(ranks)
        for t in list(q):
            nq.push(t)
        return nq

    def _recount_envelopes(self, old: EstateIndex | None, index: EstateIndex, at: int) -> None:
        """An envelope's counters (GPUs in use, its budget meter) are the sums over its
        subtree's teams under the new tree: a group moved to another parent takes its counts
        there (organisation.md "Estate changes"), and a group that is no longer an envelope
        drops them. Team counters are the record; nothing is preempted here."""
        was = {g for g, gi in old.groups.items() if gi.envelope} if old is not None else set()
        now_env = {g: gi for g, gi in index.groups.items() if gi.envelope}
        for g in was - now_env.keys():
            self.used.pop(g, None)
            self.meters.pop(g, None)
        if not now_env:
            return
        below: dict[str, list[str]] = {g: [] for g in now_env}
        for g, gi in index.groups.items():
            if not gi.envelope:
                for e in gi.levels[1:]:
                    below[e].append(g)
        for e, teams in below.items():
            self.used[e] = sum(self.used.get(t, 0) for t in teams)
            self.meters[e] = Meter.merged(
                [self.meters[t] for t in teams if t in self.meters], at, self.enabled
            )

    # ---------------------------------------------------------------- used by the pass
    def _dequeue(self, t: Task) -> None:
        q = self.queues[t.resource]
        q.left(t)
        self.taker_dirty.add(t.group)
        t.status = ENDED  # provisional; callers set the final status
        if self.index is not None and t.resource in self.index.resources:
            self.active.add(t.resource)

    def place(self, t: Task, pool: str, now: int) -> None:
        q = self.queues[t.resource]
        q.left(t)
        t.status = PLACED
        t.pool = pool
        t.placed_at = now
        t.checkpoint_at = None
        last = self.last_placed_at
        if last is not None and now < last:
            self.placed_in_time_order = False
        self.last_placed_at = now
        self.place_seq += 1
        t.place_seq = self.place_seq
        g = t.group
        size = t.size
        used = self.used
        gi = self.index.groups.get(g) if self.index is not None else None
        levels = gi.levels if gi is not None else (g,)
        # Every level counts the task: its GPUs, and its budget meter's rate from now on.
        meters = self.meters
        enabled = self.enabled
        weight = t.weight
        for x in levels:
            used[x] = used.get(x, 0) + size
            m = meters.get(x)
            if m is None:
                m = self.meter(x)
            # Meter.change, inline (the hot path of a first pass: every level of every
            # placement): settled once per moment, then only the rates move.
            if now != m.since or now != m.gpu_since:
                m.settle(now, enabled)
            m.rate += weight
            m.gpu_rate += size
            if weight > 0:
                m.weighted_tasks += 1
        self.rate_changed.update(levels)
        uk = (g, t.user)
        self.user_used[uk] = self.user_used.get(uk, 0) + size
        self.pool_used[pool] = self.pool_used.get(pool, 0) + size
        if pool in self.free:
            self.free[pool] -= size
        nf = self.node_free.get(pool)
        if nf is not None:
            picked = choose_nodes(nf, size, t.nodes)
            if picked is None:  # the caller checked the fit; a hand-placed task still counts
                picked = [max(range(len(nf)), key=lambda i: (nf[i], -i))]
            each = size // len(picked)
            t.alloc = tuple((i, each) for i in picked)
            for i in picked:
                nf[i] -= each
            self.node_room[pool] = max(nf)
        self.placed_by_group.setdefault(g, {})[t.id] = t
        ps = self.placed_sizes.get(g)
        if ps is None:
            ps = self.placed_sizes[g] = {}
        ps[size] = ps.get(size, 0) + 1
        self.taker_dirty.add(g)
        self.placed_by_pool_group.setdefault(pool, {}).setdefault(g, {})[t.id] = t
        pg = self.pool_group_used.setdefault(pool, {})
        pg[g] = pg.get(g, 0) + size
        if self.index is not None and self.index.protecting:
            self._protect(t)
        t.started = self.self_starting is None or pool in self.self_starting
        if t.started:
            t.start_token += 1
            t.start_deadline = None
        else:
            self._start_timer(t, now)
        self.version += 1

    def _unplace(self, t: Task, now: int) -> None:
        pool = t.pool
        assert pool is not None
        if self.recalled:
            self.recalled.pop(t.id, None)  # it leaves the placement another way first
        g = t.group
        size = t.size
        idx = self.index
        gi = idx.groups.get(g) if idx is not None else None
        levels = gi.levels if gi is not None else (g,)
        used = self.used
        meters = self.meters
        enabled = self.enabled
        weight = t.weight
        for x in levels:
            used[x] -= size
            m = meters.get(x)
            if m is None:
                m = self.meter(x)
            m.change(now, enabled, -weight, -size)  # (not the first pass's hot path)
            if weight > 0:
                m.weighted_tasks -= 1
        self.rate_changed.update(levels)
        self.user_used[(g, t.user)] -= size
        self.share_fell.add(g)
        self.taker_dirty.add(g)
        self.pool_used[pool] -= size
        if pool in self.free:
            self.free[pool] += size
            self.freed_pools.add(pool)
        if t.alloc:
            nf = self.node_free.get(pool)
            if nf is not None:
                for i, amount in t.alloc:
                    if i < len(nf):
                        nf[i] += amount
                self.node_room[pool] = max(nf)
            t.alloc = ()
            gang = self.held.pop(pool_hold(pool), None)
            if gang:
                self.active.update(n for n in gang if n in self.queues)
        del self.placed_by_group[g][t.id]
        ps = self.placed_sizes[g]
        left = ps[size] - 1
        if left:
            ps[size] = left
        else:
            del ps[size]
        del self.placed_by_pool_group[pool][g][t.id]
        self.pool_group_used[pool][g] -= size
        t.pool = None
        self.version += 1
        # Room and headroom were given back: waiting work of the task's levels may now go.
        # Queues that wait for room are parked on their pools and woken by the room; a
        # level's usage matters to the queues held by its limit, budget or a user limit,
        # and, once the level is back within its reservation, to every queue of its subtree
        # (phases 1 and 2 may now serve them). A group with a user limit wakes all its
        # queues: the user's held tasks may now be heads again.
        if idx is not None and gi is not None:
            groups = idx.groups
            queues = self.queues
            active = self.active
            for x in levels:
                xi = groups[x]
                u = used[x]
                names: tuple[str, ...] | set[str]
                if x != g:
                    self.freed_levels.add(x)
                if u <= xi.reservation and u <= xi.limit:
                    names = xi.subtree_resources
                    self.held.pop(x, None)
                elif x == g and gi.user_limit is not None:
                    names = gi.resources
                    self.held.pop(x, None)
                else:
                    names = self.held.pop(x, ())
                for name in names:
                    q = queues.get(name)
                    if q is not None and q.live:
                        active.add(name)

    def preempt(self, t: Task, now: int, kind: str, text: str) -> int:
        """Back to the front of its queue. The pass calls this for reclaims and budgets; the
        daemon calls it for a lost worker, so it also marks the state changed: the next pass
        must look at the requeued task and the room it gave back. Returns the work it lost
        (ms, lending.md), which is also counted at each of its levels (``lost_units``)."""
        lost = lost_work(t, now)
        if lost:
            idx = self.index
            gi = idx.groups.get(t.group) if idx is not None else None
            units = lost * t.size
            for x in gi.levels if gi is not None else (t.group,):
                self.lost_units[x] = self.lost_units.get(x, 0) + units
        self._unplace(t, now)
        self.dirty = True
        t.status = QUEUED
        t.ran_before = True
        t.preemptions += 1
        t.last_preempt_kind = kind
        t.last_preempt_text = text
        t.placed_at = None
        self.queues[t.resource].push(t)
        self.active.add(t.resource)
        return lost
