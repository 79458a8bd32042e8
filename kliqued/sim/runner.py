"""Running work in simulated time on the daemon's engine: scenarios and traces.

Simulated time jumps from one moment to the next where something can happen: an event, an
expectation, a task's runtime running out, or a moment the engine asked for (``next_pass_at``:
a budget runs out, a period starts). At each moment, in scenarios.md's order: tasks whose
runtime is up end, then the events of that time apply in file order, then the engine runs its
passes, then expectations of that time are checked. So the result never depends on
``pass_interval`` and times are exact.

:class:`Driver` is that loop, written once: a scenario (:class:`Simulator`) and a trace replay
(``trace.Replay``) differ only in where their events come from, what they check after a
moment and when they stop.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable

from compiler.compiled import CompiledEstate
from compiler.units import milli_str
from kliqued.engine import (
    Alert,
    Cancellation,
    EstateIndex,
    PassResult,
    Placement,
    Preemption,
    State,
    Task,
    run_pass,
)
from kliqued.engine.periods import format_time

from .expect import Miss, check
from .scenario import Event, Scenario

_PHASE_TEXT = {
    "reserve": "fill reservation",
    "reclaim": "reclaim",
    "lend": "lend idle",
    "rebalance": "rebalance",
}


@dataclass(slots=True)
class _Run:
    runtime: int
    checkpoint: int | None
    progress: int = 0
    placed_at: int | None = None
    token: int = 0


class Driver:
    """An engine, its state and the runtimes of tasks, advanced through simulated time.

    Subclasses feed events through :meth:`drive`'s callbacks and may override the ``on_*``
    hooks to watch what happens (they are no-ops here)."""

    def __init__(self, estate: CompiledEstate, start: int) -> None:
        self.start = start
        self.index = EstateIndex.build(estate)
        self.state = State(self.index, start)
        self.runs: dict[str, _Run] = {}
        self.ends: list[tuple[int, int, str, int]] = []
        self._end_seq = 0
        self.passes = 0
        self.now = start
        # Workers, for the pools a scenario gives them (``workers`` events); every other pool
        # starts its tasks once placed. As the daemon's workers do, a pool's workers start
        # its placed tasks oldest placement first while their GPUs have room.
        self.worker_gpus: dict[str, int] = {}
        self.busy: dict[str, int] = {}
        self.started_size: dict[str, tuple[str, int]] = {}
        self.unstarted: dict[str, dict[str, None]] = {}

    # ------------------------------------------------------------------ hooks
    def on_decision(self, now: int, d: object) -> None:
        """Every decision of every pass, in order (after the runtimes are updated)."""

    def on_runtime_end(self, tid: str, now: int) -> None:
        """A task's runtime ran out (before the state is told)."""

    def on_pass(self, now: int, res: PassResult) -> None:
        """After each pass at ``now``, its decisions handled."""

    def on_started(self, tid: str, pool: str, now: int) -> None:
        """A worker of a pool with ``workers`` took a placed task (the other pools' tasks
        start once placed, with no call)."""

    # ------------------------------------------------------------------ workers
    def set_workers(self, pool: str, gpus_milli: int, now: int) -> None:
        """The pool's live workers have ``gpus_milli`` GPUs from ``now`` (0: none, so the
        pool takes no new placements). Tasks already running there keep running: losing
        running work is the daemon's lost-worker rule, not the engine's."""
        st = self.state
        if st.wait_for_starts(pool):
            placed = st.placed_on(pool)
            self.busy[pool] = sum(t.size for t in placed)
            for t in placed:
                self.started_size[t.id] = (pool, t.size)
        self.worker_gpus[pool] = gpus_milli
        st.set_pool_live(pool, gpus_milli > 0, now)
        self._start_waiting(pool, now)

    def _start_waiting(self, pool: str, now: int) -> None:
        cap = self.worker_gpus.get(pool, 0)
        waiting = self.unstarted.get(pool)
        if not waiting or cap <= 0:
            return
        busy = self.busy.get(pool, 0)
        for tid in list(waiting):
            t = self.state.tasks[tid]
            if busy + t.size <= cap:
                del waiting[tid]
                busy += t.size
                self.started_size[tid] = (pool, t.size)
                self.state.set_started(tid, True, now)
                self._placed(tid, now)
                self.on_started(tid, pool, now)
        self.busy[pool] = busy

    def _left_pool(self, tid: str, pool: str | None) -> str | None:
        """``tid`` no longer holds ``pool`` (ended or preempted): its workers' room is back.
        The pool whose waiting tasks may start now, if any."""
        held = self.started_size.pop(tid, None)
        if held is not None:
            self.busy[held[0]] -= held[1]
            return held[0]
        if pool is not None:
            self.unstarted.get(pool, {}).pop(tid, None)
        return None

    # ------------------------------------------------------------------ runtime bookkeeping
    def _placed(self, tid: str, now: int) -> None:
        r = self.runs.get(tid)
        if r is None:
            return
        r.placed_at = now
        r.token += 1
        self._end_seq += 1
        heapq.heappush(
            self.ends, (now + max(0, r.runtime - r.progress), self._end_seq, tid, r.token)
        )

    def _unplaced(self, tid: str, now: int, preempted: bool) -> None:
        r = self.runs.get(tid)
        if r is None or r.placed_at is None:
            return
        r.progress += now - r.placed_at
        r.placed_at = None
        r.token += 1
        if preempted:
            r.progress = (r.progress // r.checkpoint) * r.checkpoint if r.checkpoint else 0

    def next_end(self) -> int | None:
        """When the next placed task's runtime runs out, if any."""
        h = self.ends
        runs = self.runs
        while h:
            t, _, tid, tok = h[0]
            r = runs.get(tid)
            if r is not None and r.token == tok and r.placed_at is not None:
                return t
            heapq.heappop(h)
        return None

    def end_due(self, now: int) -> bool:
        """Ends every task whose runtime is up at ``now``; True if any did."""
        any_ended = False
        while True:
            t = self.next_end()
            if t is None or t > now:
                return any_ended
            _, _, tid, _ = heapq.heappop(self.ends)
            self.on_runtime_end(tid, now)
            self._unplaced(tid, now, preempted=False)
            del self.runs[tid]
            freed = self._left_pool(tid, self.state.tasks[tid].pool)
            self.state.end(tid, now, "finished")
            if freed is not None:
                self._start_waiting(freed, now)
            any_ended = True

    # ------------------------------------------------------------------ changes
    def submit(
        self,
        tid: str,
        resource: str,
        user: str,
        project: str | None,
        gpus_milli: int | None,
        runtime_ms: int | None,
        checkpoint_ms: int | None,
        now: int,
    ) -> Task:
        t = self.state.submit(
            tid, resource, user, project, gpus_milli, at=now, checkpoint_ms=checkpoint_ms
        )
        if runtime_ms is not None:
            self.runs[tid] = _Run(runtime_ms, checkpoint_ms)
        return t

    def end_task(self, tid: str, now: int, kind: str) -> bool:
        """``finish`` or ``cancel`` from outside; False if the task had already ended."""
        t = self.state.tasks.get(tid)
        if t is None or t.state == "ended":
            return False
        self._unplaced(tid, now, preempted=False)
        self.runs.pop(tid, None)
        freed = self._left_pool(tid, t.pool)
        self.state.end(tid, now, kind)
        if freed is not None:
            self._start_waiting(freed, now)
        return True

    def set_estate(self, estate: CompiledEstate, now: int) -> None:
        self.index = EstateIndex.build(estate)
        self.state.bind(self.index, now)

    # ------------------------------------------------------------------ passes
    def run_pass(self, now: int) -> PassResult:
        res = run_pass(self.index, self.state, now)
        if res.repeats:
            self.passes += 1
        touched: set[str] = set()
        for d in res.decisions:
            if isinstance(d, Placement):
                if d.pool in self.worker_gpus:
                    self.unstarted.setdefault(d.pool, {})[d.task] = None
                    touched.add(d.pool)
                else:
                    self._placed(d.task, now)
            elif isinstance(d, Preemption):
                self._unplaced(d.task, now, preempted=True)
                freed = self._left_pool(d.task, d.pool)
                if freed is not None:
                    touched.add(freed)
            elif isinstance(d, Cancellation):
                self.runs.pop(d.task, None)
            self.on_decision(now, d)
        for pool in sorted(touched):
            self._start_waiting(pool, now)
        self.on_pass(now, res)
        return res

    def drive(
        self,
        next_event: Callable[[], int | None],
        apply: Callable[[int], None],
        after: Callable[[int], None] | None = None,
        stop: Callable[[int, bool], bool] | None = None,
    ) -> int:
        """The loop. ``next_event()``: the time of the next event or expectation (None when
        there are no more); ``apply(now)``: applies the events due at ``now``; ``after(now)``:
        runs after the passes of ``now`` (expectations); ``stop(t, engine_only)``: True to
        stop before moving to ``t`` (``engine_only``: only the engine's own moment is left,
        no event and no runtime end). Returns the time of the last moment run."""
        next_engine: int | None = None
        now = self.now
        state = self.state
        while True:
            t = next_event()
            e = self.next_end()
            only_engine = False
            if e is not None and (t is None or e < t):
                t = e
            if next_engine is not None and state.enabled and (t is None or next_engine < t):
                only_engine = t is None
                t = next_engine
            if t is None:
                break
            if stop is not None and stop(t, only_engine):
                break
            now = max(now, t)
            self.now = now
            self.end_due(now)
            apply(now)
            res = self.run_pass(now)
            # A runtime of 0, or one that ran out exactly now, ends now and may free room.
            while self.end_due(now):
                res = self.run_pass(now)
            next_engine = res.next_pass_at
            if after is not None:
                after(now)
        return now


@dataclass
class SimResult:
    scenario: Scenario
    misses: list[Miss] = field(default_factory=list)
    timeline: list[str] = field(default_factory=list)
    decisions: list[tuple[int, object]] = field(default_factory=list)
    """Every decision of the run with its time (placements, preemptions, cancellations,
    alerts)."""
    passes: int = 0

    @property
    def ok(self) -> bool:
        return not self.misses


class Simulator(Driver):
    """One scenario's run. ``timeline=True`` keeps a line per decision and per change of a
    waiting reason (for ``--timeline``)."""

    def __init__(self, scenario: Scenario, timeline: bool = False) -> None:
        super().__init__(scenario.estate, scenario.start)
        self.sc = scenario
        self.want_timeline = timeline
        self.result = SimResult(scenario)
        self._reasons: dict[str, str] = {}

    # ------------------------------------------------------------------ timeline
    def _log(self, t: int, text: str) -> None:
        if self.want_timeline:
            self.result.timeline.append(f"{format_time(t)} {self.sc.offset(t):>10}  {text}")

    def on_runtime_end(self, tid: str, now: int) -> None:
        self._log(now, f"end      {tid}: runtime done")

    def on_started(self, tid: str, pool: str, now: int) -> None:
        self._log(now, f"start    {tid} on {pool} (its workers took it)")

    def on_decision(self, now: int, d: object) -> None:
        self.result.decisions.append((now, d))
        if not self.want_timeline:
            return
        if isinstance(d, Placement):
            self._log(now, f"place    {d.task} on {d.pool} ({d.resource}, {_PHASE_TEXT[d.phase]})")
        elif isinstance(d, Preemption):
            self._log(now, f"preempt  {d.task} from {d.pool} ({d.resource}): {d.text}")
        elif isinstance(d, Cancellation):
            self._log(now, f"cancel   {d.task}: {d.text}")
        elif isinstance(d, Alert):
            self._log(now, f"alert    {d.text}")

    def on_pass(self, now: int, res: PassResult) -> None:
        self.result.passes = self.passes
        if self.want_timeline:
            reasons = res.waiting_reasons()
            for tid, r in reasons.items():
                text = f"{r.kind}: {r.text}"
                if self._reasons.get(tid) != text:
                    self._log(now, f"waits    {tid}: {text}")
            self._reasons = {tid: f"{r.kind}: {r.text}" for tid, r in reasons.items()}

    # ------------------------------------------------------------------ events
    def _apply(self, ev: Event, now: int) -> None:
        if ev.kind == "submit":
            s = ev.submit
            assert s is not None
            for tid in s.ids:
                self.submit(
                    tid,
                    s.resource,
                    s.user,
                    s.project,
                    s.gpus_milli,
                    s.runtime_ms,
                    s.checkpoint_ms,
                    now,
                )
            n = len(s.ids)
            self._log(
                now,
                f"submit   {s.ids[0]}{f' .. {s.ids[-1]}' if n > 1 else ''} "
                f"to {s.resource} (user {s.user})",
            )
        elif ev.kind in ("finish", "cancel"):
            for tid in ev.tasks:
                if self.end_task(tid, now, "finished" if ev.kind == "finish" else "cancelled"):
                    self._log(now, f"{ev.kind:<8} {tid}")
        elif ev.kind == "engine":
            self.state.set_enabled(ev.enabled, now)
            self._log(now, f"engine   {'enabled' if ev.enabled else 'disabled'}")
        elif ev.kind == "workers":
            for pool, gpus in ev.workers.items():
                self.set_workers(pool, gpus, now)
                self._log(
                    now, f"workers  {pool}: {milli_str(gpus) + ' GPUs' if gpus else 'none live'}"
                )
        elif ev.kind == "set":
            assert ev.estate is not None
            self.set_estate(ev.estate, now)
            changes = ", ".join(f"{k}: {v}" for k, v in ev.changes.items())
            self._log(now, f"set      {changes} (revision {ev.estate.revision[:19]})")

    def run(self) -> SimResult:
        sc = self.sc
        events = sc.events
        exps = sc.expectations
        pos = [0, 0]  # next event, next expectation
        last = max([e.at for e in events] + [x.at for x in exps] + [sc.start])

        def next_event() -> int | None:
            ei, xi = pos
            cands = []
            if ei < len(events):
                cands.append(events[ei].at)
            if xi < len(exps):
                cands.append(exps[xi].at)
            return min(cands) if cands else None

        def apply(now: int) -> None:
            while pos[0] < len(events) and events[pos[0]].at <= now:
                self._apply(events[pos[0]], now)
                pos[0] += 1

        def after(now: int) -> None:
            while pos[1] < len(exps) and exps[pos[1]].at <= now:
                self.result.misses.extend(check(exps[pos[1]], self.index, self.state, now))
                pos[1] += 1

        self.drive(next_event, apply, after, stop=lambda t, _: t > last)
        self.result.passes = self.passes
        return self.result


def simulate(scenario: Scenario, timeline: bool = False) -> SimResult:
    return Simulator(scenario, timeline).run()
