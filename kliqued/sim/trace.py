"""Trace replay: a CSV of submissions run at scale on the daemon's engine, in simulated time.

A trace is a scenario without expectations (scenarios.md): one row per task,
``id,submit,resource,user,project,gpus,runtime``. The whole file is read and checked before any
simulated time passes (every problem with its ``FILE:LINE``, nothing half-run), with the same
submission rule the daemon uses (``engine.check_submission``). The replay then runs on the
simulator's loop (:class:`~kliqued.sim.runner.Driver`) until every task has ended, and a
:class:`~kliqued.sim.report.Collector` turns what happened into the report.
"""

from __future__ import annotations

import csv
import time
from decimal import Decimal, InvalidOperation
from typing import TextIO

from compiler.compiled import CompiledEstate
from compiler.diagnostics import Diagnostic, Position, error
from compiler.units import parse_time, to_milli
from klique_util.units import HOUR_S, MINUTE_S, SECOND_MS, to_ms

from kliqued.engine import EstateIndex, Placement, Preemption, SubmissionError, check_submission
from kliqued.engine.periods import period_start

from .records import Trace, TraceTask  # the trace's records
from .report import Collector, Report
from .runner import Driver
from .scenario import DEFAULT_START, parse_offset

COLUMNS = ("id", "submit", "resource", "user", "project", "gpus", "runtime")
"""Required, in any order; ``checkpoint`` is optional; other columns are ignored."""
OPTIONAL_COLUMNS = ("checkpoint",)
MAX_ERRORS = 50
"""Diagnostics kept for a bad file: after that only the count grows."""


class TraceError(Exception):
    """The trace is invalid; ``diagnostics`` lists the problems (at most ``MAX_ERRORS``) and
    ``count`` how many there were in all."""

    def __init__(self, diagnostics: list[Diagnostic], count: int | None = None) -> None:
        super().__init__("\n".join(d.render() for d in diagnostics))
        self.diagnostics = diagnostics
        self.count = len(diagnostics) if count is None else count


# ------------------------------------------------------------------------ values


def _seconds_ms(text: str) -> int | None:
    """``12``, ``12.5`` (seconds, at most millisecond precision) as ms; None if not a number."""
    try:
        d = Decimal(text)
    except InvalidOperation:
        return None
    if not d.is_finite():
        return None
    if d < 0:
        raise ValueError(f"must be >= 0, found {text}")
    ms = d * SECOND_MS
    if ms != ms.to_integral_value():
        raise ValueError(f"more precise than a millisecond: {text}")
    return int(ms)


def parse_duration_ms(text: str) -> int:
    """Seconds (``90``, ``1.5``) or a duration (``15m``, ``2h30m``), as milliseconds."""
    text = text.strip()
    if not text:
        raise ValueError("empty")
    ms = _seconds_ms(text)
    if ms is not None:
        return ms
    return parse_offset(text) * SECOND_MS


def is_time(text: str) -> bool:
    return "T" in text.upper() and "-" in text


def parse_submit(text: str, start: int) -> int:
    """An offset from ``start`` (seconds or a duration) or an RFC 3339 time, as ms."""
    text = text.strip()
    if is_time(text):
        return to_ms(parse_time(text))
    return start + parse_duration_ms(text)


# ------------------------------------------------------------------------ loading


def load_trace(path: str, estate: CompiledEstate, start: int | None = None) -> Trace:
    """The trace at ``path``, every row checked against ``estate``; raises TraceError.

    ``start`` is the time offsets count from; without it, the first row's time when that is
    an RFC 3339 time, else scenarios' default start (a Monday)."""
    diags: list[Diagnostic] = []
    count = 0

    def err(line: int, message: str, hint: str | None = None) -> None:
        nonlocal count
        count += 1
        if len(diags) < MAX_ERRORS:
            diags.append(error("trace", message, Position(path, line), hint))

    try:
        fh = open(path, encoding="utf-8-sig", newline="")
    except OSError as exc:
        raise TraceError(
            [error("trace", f"cannot read: {exc.strerror or exc}", Position(path))]
        ) from None
    index = EstateIndex.build(estate)
    tasks: list[TraceTask] = []
    starts = [start]
    with fh:
        try:
            _read(fh, index, starts, tasks, err)
        except UnicodeDecodeError as exc:
            err(0, f"not UTF-8 text ({exc.reason} at byte {exc.start})")
        except csv.Error as exc:
            err(0, f"not a CSV file: {exc}")
    if count:
        raise TraceError(diags, count)
    t0 = starts[0] if starts[0] is not None else to_ms(parse_time(DEFAULT_START))
    return Trace(path, t0, tasks)


def _read(
    fh: TextIO, index: EstateIndex, starts: list[int | None], out: list[TraceTask], err
) -> None:
    """Reads every row into ``out``; ``starts[0]`` is the start, set from the first row
    when it is None."""
    reader = csv.reader(fh)
    header = next(reader, None)
    if header is None:
        err(1, "empty file: expected a header line " + ",".join(COLUMNS))
        return
    names = [h.strip() for h in header]
    col: dict[str, int] = {}
    for i, n in enumerate(names):
        if n in col and n in COLUMNS + OPTIONAL_COLUMNS:
            err(1, f"column {n!r} appears twice")
        col.setdefault(n, i)
    missing = [c for c in COLUMNS if c not in col]
    if missing:
        err(
            1,
            f"missing column{'s' if len(missing) > 1 else ''} "
            f"{', '.join(repr(m) for m in missing)}",
            f"the header names {', '.join(COLUMNS)} (in any order)",
        )
        return
    i_id, i_sub, i_res, i_user, i_proj, i_gpus, i_run = (col[c] for c in COLUMNS)
    i_ck = col.get("checkpoint")
    width = len(names)
    seen: dict[str, int] = {}
    last_at: int | None = None
    last_line = 0
    resources = index.resources
    t0 = starts[0]
    for row in reader:
        line = reader.line_num
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        if len(row) != width:
            err(line, f"expected {width} fields as in the header, found {len(row)}")
            continue
        tid = row[i_id].strip()
        ok = True
        if not tid:
            err(line, "id: empty")
            ok = False
        elif tid in seen:
            err(line, f"id: task id {tid!r} is already used (line {seen[tid]})")
            ok = False
        else:
            seen[tid] = line
        sub = row[i_sub].strip()
        at: int | None = None
        if t0 is None:
            # The first row fixes the start: its own time when it is absolute.
            try:
                t0 = to_ms(parse_time(sub)) if is_time(sub) else to_ms(parse_time(DEFAULT_START))
            except ValueError:
                t0 = to_ms(parse_time(DEFAULT_START))
            starts[0] = t0
        try:
            at = parse_submit(sub, t0)
        except ValueError as exc:
            err(
                line,
                f"submit: unparsable time {sub!r}: {exc}",
                "seconds from the start (120, 7.5), a duration (2h30m) or an RFC 3339 time",
            )
            ok = False
        if at is not None:
            if at < t0:
                err(line, f"submit: {sub} is before the start of the replay")
                ok = False
            elif last_at is not None and at < last_at:
                err(
                    line,
                    f"rows out of time order: submit {sub} is earlier than the row "
                    f"before (line {last_line})",
                    "sort the trace by submit time",
                )
                ok = False
            else:
                last_at, last_line = at, line
        run_text = row[i_run].strip()
        runtime: int | None = None
        try:
            runtime = parse_duration_ms(run_text)
        except ValueError as exc:
            err(
                line,
                f"runtime: unparsable duration {run_text!r}: {exc}",
                "seconds (3600, 90.5) or a duration (1h, 2h30m)",
            )
            ok = False
        ckpt: int | None = None
        if i_ck is not None and row[i_ck].strip():
            try:
                ckpt = parse_duration_ms(row[i_ck]) or None
            except ValueError as exc:
                err(line, f"checkpoint: unparsable duration {row[i_ck].strip()!r}: {exc}")
                ok = False
        gpus_text = row[i_gpus].strip()
        gpus: int | None = None
        if gpus_text:
            try:
                gpus = to_milli(gpus_text, "gpus")
            except ValueError as exc:
                err(line, f"gpus: {exc}")
                ok = False
        resource = row[i_res].strip()
        user = row[i_user].strip()
        project = row[i_proj].strip() or None
        try:
            check_submission(index, resource, user, project, gpus)
        except SubmissionError as exc:
            err(line, f"{exc.field}: {exc}")
            ok = False
        if ok:
            assert at is not None and runtime is not None
            out.append(
                TraceTask(
                    line,
                    tid,
                    at,
                    resource,
                    user,
                    project,
                    gpus,
                    runtime,
                    ckpt,
                    resources[resource].group,
                )
            )


# ------------------------------------------------------------------------ progress


class Progress:
    """A progress bar on a terminal (redrawn about 10 times a second), otherwise a line at
    every 10%; silent for the first second, so short replays print nothing."""

    def __init__(self, stream: TextIO | None, total: int, label: str = "replay") -> None:
        self.stream = stream
        self.total = max(1, total)
        self.label = label
        self.tty = bool(stream is not None and getattr(stream, "isatty", lambda: False)())
        self.t0 = time.perf_counter()
        self.last_draw = 0.0
        self.next_tenth = 1
        self.shown = False

    def update(self, done: int, events: int, sim_now: str) -> None:
        if self.stream is None:
            return
        now = time.perf_counter()
        wall = now - self.t0
        if wall < 1.0:
            return
        frac = min(1.0, done / self.total)
        rate = events / wall if wall > 0 else 0.0
        if self.tty:
            if now - self.last_draw < 0.1:
                return
            self.last_draw = now
            width = 30
            fill = int(frac * width)
            self.stream.write(
                f"\r{self.label} [{'#' * fill}{'.' * (width - fill)}] "
                f"{frac * 100:5.1f}%  {events:,} events, {rate:,.0f} events/s, "
                f"at {sim_now} "
            )
            self.stream.flush()
            self.shown = True
        else:
            tenth = int(frac * 10)
            if tenth >= self.next_tenth and tenth < 10:
                self.next_tenth = tenth + 1
                self.stream.write(
                    f"{self.label}: {tenth * 10}% ({events:,} events, "
                    f"{rate:,.0f} events/s, at {sim_now})\n"
                )
                self.stream.flush()
                self.shown = True

    def finish(self, events: int) -> None:
        if self.stream is None or not self.shown:
            return
        wall = time.perf_counter() - self.t0
        rate = events / wall if wall > 0 else 0.0
        if self.tty:
            self.stream.write("\r\033[K")
        self.stream.write(
            f"{self.label}: done, {events:,} events in {wall:.1f} s ({rate:,.0f} events/s)\n"
        )
        self.stream.flush()


# ------------------------------------------------------------------------ the replay


class Replay(Driver):
    """One trace on one estate, from its start until every task has ended."""

    def __init__(
        self,
        trace: Trace,
        estate: CompiledEstate,
        *,
        progress: TextIO | None = None,
        until: int | None = None,
    ) -> None:
        super().__init__(estate, trace.start)
        self.trace = trace
        self.until = trace.default_until() if until is None else until
        self.stopped_at_horizon = False
        self.collector = Collector(self.index, self.state, trace.start)
        self.progress = Progress(progress, 2 * len(trace.tasks))
        self.submitted = 0
        self.finished = 0
        self.moments = 0

    # hooks: what the report needs
    def on_decision(self, now: int, d: object) -> None:
        if isinstance(d, Placement):
            self.collector.placed(d, now)
        elif isinstance(d, Preemption):
            self.collector.preempted(d, now)

    def on_runtime_end(self, tid: str, now: int) -> None:
        self.finished += 1
        self.collector.ended(tid, now)

    def run(self) -> Report:
        tasks = self.trace.tasks
        n = len(tasks)
        pos = 0
        stall_since: list[int | None] = [None]
        periods = sorted(self.index.budget_periods)
        state = self.state
        col = self.collector
        prog = self.progress

        def next_event() -> int | None:
            return tasks[pos].at if pos < n else None

        def apply(now: int) -> None:
            nonlocal pos
            while pos < n and tasks[pos].at <= now:
                t = tasks[pos]
                self.submit(
                    t.id,
                    t.resource,
                    t.user,
                    t.project,
                    t.gpus_milli,
                    t.runtime_ms,
                    t.checkpoint_ms,
                    now,
                )
                col.submitted(t.id, t.group, now)
                pos += 1
            self.submitted = pos

        def after(now: int) -> None:
            self.moments += 1
            if self.moments & 255 == 0:
                prog.update(
                    self.submitted + self.finished,
                    self.submitted + self.finished,
                    self._offset(now),
                )

        def stop(t: int, engine_only: bool) -> bool:
            # engine_only: no submission is left and nothing is placed (every placed task has
            # a runtime, so it would have an end to wait for).
            if engine_only and not any(q.live for q in state.queues.values()):
                return True  # every task has ended
            if t > self.until:
                self.stopped_at_horizon = True
                return True
            # Only the engine's own moments are left: the queued tasks can only be helped by a
            # budget period starting. Once a new period of every kind in use has started
            # without anything placed, nothing ever will.
            if not engine_only:
                stall_since[0] = None
                return False
            if stall_since[0] is None:
                stall_since[0] = self.now
                return False
            since = stall_since[0]
            return all(period_start(k, self.now) > since for k in periods)

        self.drive(next_event, apply, after, stop)
        end = self.until if self.stopped_at_horizon else col.last_activity
        prog.finish(self.submitted + self.finished)
        return col.report(
            self.trace,
            end,
            self.passes,
            self.moments,
            self.until if self.stopped_at_horizon else None,
        )

    def _offset(self, t: int) -> str:
        s = (t - self.start) // SECOND_MS
        return f"+{s // HOUR_S}h{s % HOUR_S // MINUTE_S:02d}m"


def replay(
    trace: Trace, estate: CompiledEstate, progress: TextIO | None = None, until: int | None = None
) -> Report:
    return Replay(trace, estate, progress=progress, until=until).run()
