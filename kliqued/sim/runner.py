"""Running a scenario in simulated time on the daemon's engine.

Simulated time jumps from one moment to the next where something can happen: an event, an
expectation, a task's runtime running out, or a moment the engine asked for (``next_pass_at``:
a budget runs out, a period starts). At each moment, in scenarios.md's order: tasks whose
runtime is up end, then the events of that time apply in file order, then the engine runs its
passes, then expectations of that time are checked. So the result never depends on
``pass_interval`` and times are exact.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from kliqued.engine import (Alert, Cancellation, EstateIndex, PassResult, Placement,
                            Preemption, State, run_pass)
from kliqued.engine.periods import format_time

from .expect import Miss, check
from .scenario import Event, Scenario

_PHASE_TEXT = {"reserve": "fill reservation", "reclaim": "reclaim", "lend": "lend idle"}


@dataclass
class _Run:
    runtime: int
    checkpoint: int | None
    progress: int = 0
    placed_at: int | None = None
    token: int = 0


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


class Simulator:
    """One scenario's run. ``timeline=True`` keeps a line per decision and per change of a
    waiting reason (for ``--timeline``)."""

    def __init__(self, scenario: Scenario, timeline: bool = False) -> None:
        self.sc = scenario
        self.want_timeline = timeline
        self.index = EstateIndex.build(scenario.estate)
        self.state = State(self.index, scenario.start)
        self.runs: dict[str, _Run] = {}
        self.ends: list[tuple[int, int, str, int]] = []
        self._end_seq = 0
        self.result = SimResult(scenario)
        self._reasons: dict[str, str] = {}

    # ------------------------------------------------------------------ timeline
    def _log(self, t: int, text: str) -> None:
        if self.want_timeline:
            self.result.timeline.append(f"{format_time(t)} {self.sc.offset(t):>10}  {text}")

    # ------------------------------------------------------------------ runtime bookkeeping
    def _placed(self, tid: str, now: int) -> None:
        r = self.runs.get(tid)
        if r is None:
            return
        r.placed_at = now
        r.token += 1
        self._end_seq += 1
        heapq.heappush(self.ends, (now + max(0, r.runtime - r.progress), self._end_seq, tid,
                                   r.token))

    def _unplaced(self, tid: str, now: int, preempted: bool) -> None:
        r = self.runs.get(tid)
        if r is None or r.placed_at is None:
            return
        r.progress += now - r.placed_at
        r.placed_at = None
        r.token += 1
        if preempted:
            r.progress = (r.progress // r.checkpoint) * r.checkpoint if r.checkpoint else 0

    def _next_end(self) -> int | None:
        h = self.ends
        while h:
            t, _, tid, tok = h[0]
            r = self.runs.get(tid)
            if r is not None and r.token == tok and r.placed_at is not None:
                return t
            heapq.heappop(h)
        return None

    def _end_due(self, now: int) -> bool:
        any_ended = False
        while True:
            t = self._next_end()
            if t is None or t > now:
                return any_ended
            _, _, tid, _ = heapq.heappop(self.ends)
            self._unplaced(tid, now, preempted=False)
            self.state.end(tid, now, "finished")
            self._log(now, f"end      {tid}: runtime done")
            any_ended = True

    # ------------------------------------------------------------------ events
    def _apply(self, ev: Event, now: int) -> None:
        st = self.state
        if ev.kind == "submit":
            s = ev.submit
            assert s is not None
            for tid in s.ids:
                st.submit(tid, s.resource, s.user, s.project,
                          s.gpus_milli, at=now)
                if s.runtime_ms is not None:
                    self.runs[tid] = _Run(s.runtime_ms, s.checkpoint_ms)
            n = len(s.ids)
            self._log(now, f"submit   {s.ids[0]}{f' .. {s.ids[-1]}' if n > 1 else ''} "
                           f"to {s.resource} (user {s.user})")
        elif ev.kind in ("finish", "cancel"):
            for tid in ev.tasks:
                t = st.tasks.get(tid)
                if t is None or t.state == "ended":
                    continue
                self._unplaced(tid, now, preempted=False)
                self.runs.pop(tid, None)
                st.end(tid, now, "finished" if ev.kind == "finish" else "cancelled")
                self._log(now, f"{ev.kind:<8} {tid}")
        elif ev.kind == "engine":
            st.set_enabled(ev.enabled, now)
            self._log(now, f"engine   {'enabled' if ev.enabled else 'disabled'}")
        elif ev.kind == "set":
            assert ev.estate is not None
            self.index = EstateIndex.build(ev.estate)
            st.bind(self.index, now)
            changes = ", ".join(f"{k}: {v}" for k, v in ev.changes.items())
            self._log(now, f"set      {changes} (revision {ev.estate.revision[:19]})")

    # ------------------------------------------------------------------ passes
    def _pass(self, now: int) -> PassResult:
        res = run_pass(self.index, self.state, now)
        if res.repeats:
            self.result.passes += 1
        for d in res.decisions:
            self.result.decisions.append((now, d))
            if isinstance(d, Placement):
                self._placed(d.task, now)
                self._log(now, f"place    {d.task} on {d.pool} ({d.resource}, "
                               f"{_PHASE_TEXT[d.phase]})")
            elif isinstance(d, Preemption):
                self._unplaced(d.task, now, preempted=True)
                self._log(now, f"preempt  {d.task} from {d.pool} ({d.resource}): {d.text}")
            elif isinstance(d, Cancellation):
                self.runs.pop(d.task, None)
                self._log(now, f"cancel   {d.task}: {d.text}")
            elif isinstance(d, Alert):
                self._log(now, f"alert    {d.text}")
        if self.want_timeline:
            reasons = res.waiting_reasons()
            for tid, r in reasons.items():
                text = f"{r.kind}: {r.text}"
                if self._reasons.get(tid) != text:
                    self._log(now, f"waits    {tid}: {text}")
            self._reasons = {tid: f"{r.kind}: {r.text}" for tid, r in reasons.items()}
        return res

    def run(self) -> SimResult:
        sc = self.sc
        events = sc.events
        exps = sc.expectations
        ei = xi = 0
        next_engine: int | None = None
        last = max([e.at for e in events] + [x.at for x in exps] + [sc.start])
        now = sc.start
        while True:
            cands = []
            if ei < len(events):
                cands.append(events[ei].at)
            if xi < len(exps):
                cands.append(exps[xi].at)
            e = self._next_end()
            if e is not None:
                cands.append(e)
            if next_engine is not None and self.state.enabled:
                cands.append(next_engine)
            if not cands:
                break
            t = min(cands)
            if t > last:
                break
            now = max(now, t)
            self._end_due(now)
            while ei < len(events) and events[ei].at <= now:
                self._apply(events[ei], now)
                ei += 1
            res = self._pass(now)
            # A runtime of 0, or one that ran out exactly now, ends now and may free room.
            while self._end_due(now):
                res = self._pass(now)
            next_engine = res.next_pass_at
            while xi < len(exps) and exps[xi].at <= now:
                self.result.misses.extend(check(exps[xi], self.index, self.state, now))
                xi += 1
        return self.result


def simulate(scenario: Scenario, timeline: bool = False) -> SimResult:
    return Simulator(scenario, timeline).run()
