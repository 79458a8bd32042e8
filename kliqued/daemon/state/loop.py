"""The sequencer: the one coroutine that changes the daemon's state, runs the engine and
commits the event log (group commit).

Each cycle:
1. if a pass is due, run it (the engine changes the State at once) and keep its events;
2. take every request waiting (up to an estate change, which goes alone), prepare each in
   order against what the earlier ones will do (validation happens here, so a refused request
   logs nothing);
3. commit the pass's events, then the requests' events, in one transaction (DuckDB work runs
   on the store's writer thread: the event loop keeps serving);
4. apply the requests to the State in log order and answer them: a 2xx is sent only after
   its change is durable.
So the log order is the order the State changed in, and replay rebuilds the same State.

A pass runs every ``pass_interval``, at the engine's ``next_pass_at``, and ``SETTLE_S``
after a submission, cancellation, engine switch or estate change (coalesced: a burst of
requests gets one pass soon after it, not one per request), ``REPORT_SETTLE_S`` after a
worker's report that freed capacity. Long polls waiting for work are *parked* here
(``park``): when a pass places work on their pool, their leases are prepared in the same
cycle, after the pass, and committed with its placements. While a cycle commits, new
requests queue for the next one: the busier the daemon, the larger its batches.

A commit refused for its data (``unstorable``: text DuckDB cannot hold, a value it cannot
convert) is not fatal: one request's data must never stop the daemon. The cycle then commits
the pass's events alone, and each request alone, re-prepared and applied in order
(``_isolate``): the request whose data is refused gets a 422 ``unstorable``, the others go
through.

A commit that fails because the store is away (storefault.py: a full disk, PostgreSQL
unreachable) is ridden out, not fatal. The requests of that batch were not applied (a
request changes the State only after its commit), so they are refused (507 or 503 with
``Retry-After``) and leave no trace. The pass's part is already in the State (the engine
changes it at once), so it is *held*: kept with the sequence numbers it was given, and
committed first when the store is back, before any other change; until then no pass runs
and every write is refused at once, while reads answer from memory (``away``). So the log
still equals the State once the held part is in, and nothing acknowledged is lost or
repeated. PostgreSQL may have committed a batch whose COMMIT lost its answer: the log's last
sequence number then says so, and the batch's requests are applied (their clients saw a 503;
an idempotency key makes their retry find the task). Any other failed commit (an
invalidated database, a log that moved on without this daemon) is fatal: the State may be
ahead of the log, so the process exits and a restart rebuilds from what is durable.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Iterable, Protocol

import duckdb

from klique_util.units import SECOND_MS
from kliqued.ledger import ops as ledger_ops

from kliqued.daemon.state import history
from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.state.prepared import Overlay, Prepared
from kliqued.daemon.errors import ApiError, Deposed, StoreMismatch, Unavailable
from kliqued.daemon.events import Event
from kliqued.daemon.storage.store import Batch, Store
from kliqued.daemon.storage.storefault import RETRY_AFTER_S, StoreFault, classify

log = logging.getLogger(__name__)

SETTLE_S = 0.02
"""Delay from a change to the pass that handles it: long enough to gather a burst."""

REPORT_SETTLE_S = 0.002
"""Delay from a report that frees capacity (a task ended, lost, stopped) to the pass that
fills it: short, so that a pool of short tasks stays busy; reports arriving together (a
worker's batch) still make one pass."""

SLOW_COMMIT_S = 0.1
"""A commit slower than this is logged (DuckDB checkpoints, a slow disk)."""

PrepareFn = Callable[[int, Overlay], Prepared]

_DATA_ERRORS: tuple[type[BaseException], ...] = (
    duckdb.InvalidInputException,
    duckdb.ConversionException,
    duckdb.ConstraintException,
    duckdb.TypeMismatchException,
    UnicodeError,
    TypeError,
    ValueError,
    OverflowError,
)
"""Errors a commit raises for the data it was given (not for the database or the disk):
retrying the batch item by item finds the item, and the rest can be committed."""


def unstorable(exc: BaseException) -> bool:
    """True when ``exc`` is about the batch's data, so the store itself is still sound."""
    return isinstance(exc, _DATA_ERRORS) and not isinstance(
        exc, (duckdb.IOException, duckdb.FatalException, duckdb.InternalException)
    )


def _refusal(exc: BaseException) -> Unavailable:
    """What the requests of a batch that could not be written get: a 503, nothing recorded
    (a deposed leader's clients retry at the new leader)."""
    if isinstance(exc, Deposed):
        return Unavailable(
            "this kliqued no longer leads (another took the lease): nothing "
            "was recorded; retry, at the leader"
        )
    return Unavailable("the event log cannot be written")


@dataclass
class _Held:
    """What a commit failed on while the store was away (module docstring): the pass's
    part, already in the State, to commit when the store is back; the batch's requests,
    refused, to apply only if the log turns out to have the whole batch after all."""

    base: int
    """``d.seq`` before the batch."""
    batch: Batch
    """The pass's rows (``base + 1`` on) and ops (with the evicted records' rows)."""
    evicting: list[Any]
    rows: list[tuple]
    """Rows of the whole batch, requests' included (``base + 1`` on)."""
    prepared: list[tuple["_Request", Prepared]]
    since: float
    """When the store went away (monotonic)."""


@dataclass
class _Request:
    prepare: PrepareFn
    future: asyncio.Future
    barrier: bool
    parked: bool = False


class Observer(Protocol):
    def observe(self, amount: float) -> None: ...


class Meter(Protocol):
    """What the sequencer feeds and ``GET /metrics`` reads: the API's ``metrics.Metrics``,
    made by the composition root (server.py, ha/replica.py) and passed in, since the state
    room imports no room above it (issue 27)."""

    @property
    def pass_seconds(self) -> Observer: ...

    def store_away(self, kind: str) -> None: ...

    def store_back(self) -> None: ...

    def count(self, events: Iterable[Event]) -> None: ...

    def render(self) -> bytes: ...


class Sequencer:
    def __init__(
        self, daemon: Daemon, store: Store, pass_interval_s: float = 1.0, *, metrics: Meter
    ) -> None:
        self.d = daemon
        self.store = store
        self.pass_interval_s = pass_interval_s
        self._pending: list[_Request] = []
        self._wake = asyncio.Event()
        self._stopping = False
        self._next_timer: float | None = None
        self._soon: float | None = None
        self._engine_at: float | None = None
        self._parked: dict[str, list[_Request]] = {}
        self.failed: BaseException | None = None
        self.on_fatal: Callable[[BaseException], None] | None = None
        self.metrics: Meter = metrics
        """This daemon's Prometheus metrics: the pass histogram and the event counters are
        fed here, where passes run and the State takes events in."""
        self.on_commit: Callable[[list[tuple]], None] | None = None
        """Sees each committed batch's rows (the alert dispatcher's non-blocking offer)."""
        self.away: StoreFault | None = None
        """Set while the store is away: writes are refused with its ``refusal``, no pass
        runs, the held part waits (module docstring); health and /metrics show it."""
        self._held: _Held | None = None
        self.between: Callable[[], None] | None = None
        """Called after each cycle, when the State equals the log at ``d.seq`` (the
        snapshots' fork, snapshot.py)."""

    # ------------------------------------------------------------------ requests
    async def submit(self, prepare: PrepareFn, barrier: bool = False) -> Any:
        """Queues a change; returns what its ``apply`` returns once it is durable."""
        if self._stopping or self.failed is not None:
            raise Unavailable("kliqued is shutting down: nothing was recorded; retry later")
        if self.away is not None:
            raise self.away.refusal()
        fut = asyncio.get_running_loop().create_future()
        self._pending.append(_Request(prepare, fut, barrier))
        self._wake.set()
        return await fut

    def park(self, key: str, prepare: PrepareFn) -> _Request:
        """A change to make when ``key`` (a pool) gets work: a long poll's lease. ``unpark``
        (called while the engine places work there, during a pass) queues it into the same
        cycle as the pass, so the placement and the lease are one commit. Its ``future``
        gets what ``apply`` returns; cancel it while ``parked`` to give up."""
        if self._stopping or self.failed is not None:
            raise Unavailable("kliqued is shutting down: nothing was recorded; retry later")
        r = _Request(prepare, asyncio.get_running_loop().create_future(), False, True)
        self._parked.setdefault(key, []).append(r)
        return r

    def unpark(self, key: str) -> None:
        reqs = self._parked.pop(key, None)
        if not reqs:
            return
        for r in reqs:
            r.parked = False
            if not r.future.done():
                self._pending.append(r)
        self._wake.set()

    def unpark_all(self, result: Any) -> None:
        """Answers every parked change with ``result`` (shutting down)."""
        parked, self._parked = self._parked, {}
        for reqs in parked.values():
            for r in reqs:
                r.parked = False
                if not r.future.done():
                    r.future.set_result(result)

    def request_pass(self, delay_s: float = SETTLE_S) -> None:
        t = time.monotonic() + delay_s
        if self._soon is None or t < self._soon:
            self._soon = t
            self._wake.set()

    # ------------------------------------------------------------------ the cycle
    def _due_at(self) -> float | None:
        times = [t for t in (self._next_timer, self._soon, self._engine_at) if t is not None]
        return min(times) if times else None

    async def run(self) -> None:
        self._next_timer = time.monotonic() + self.pass_interval_s
        while True:
            if self._stopping and not self._pending:
                return
            if self.away is not None:
                try:
                    await self._ride_out()
                except Exception as exc:  # not the store being away: fatal, as below
                    self._fail(exc)
                    return
                continue
            due = self._due_at()
            if not self._pending:
                timeout = None if due is None else max(0.0, due - time.monotonic())
                if timeout is None or timeout > 0:
                    try:
                        await asyncio.wait_for(self._wake.wait(), timeout)
                    except asyncio.TimeoutError:
                        pass
            self._wake.clear()
            try:
                await self._cycle()
                if self.between is not None:
                    self.between()
            except Exception as exc:  # a failed commit: see the module docstring
                self._fail(exc)
                return

    def _fail(self, exc: BaseException) -> None:
        """The fatal path: every waiting request refused, the daemon told (it exits, or a
        deposed leader stands by)."""
        self.failed = exc
        if isinstance(exc, Deposed):
            log.warning("kliqued: %s; no longer leading", exc)
        else:
            log.error(
                "kliqued: cannot write the event log (%s: %s); stopping so "
                "that a restart rebuilds the state from what is durable",
                type(exc).__name__,
                exc,
            )
        for r in self._pending:
            if not r.future.done():
                r.future.set_exception(_refusal(exc))
        self._pending.clear()
        if self.on_fatal is not None:
            self.on_fatal(exc)

    # ------------------------------------------------------------------ the store away
    def _go_away(self, fault: StoreFault, held: _Held) -> None:
        self.away, self._held = fault, held
        self.metrics.store_away(fault.kind)
        log.error(
            "kliqued: the store is away: %s; writes are refused (%s), reads answer from "
            "memory, %d event(s) of the engine's pass are held; retrying every %d s",
            fault.text(),
            fault.refusal().status,
            len(held.batch.rows),
            RETRY_AFTER_S,
        )

    async def _ride_out(self) -> None:
        """One round while the store is away: refuse what waits, sleep, try the store. Back:
        the held part committed (or found in the log), writes accepted again, a pass soon.
        Raises (fatal) for anything but the store still being away."""
        away, held = self.away, self._held
        assert away is not None and held is not None
        for r in self._pending:
            if not r.future.done():
                r.future.set_exception(away.refusal())
        self._pending.clear()
        if self._stopping:
            self.away = None  # the held part is lost with the process: the restart's pass
            return  # decides again from the log, which never had it
        try:
            await asyncio.wait_for(self._wake.wait(), RETRY_AFTER_S)
        except asyncio.TimeoutError:
            pass
        self._wake.clear()
        if self._stopping:
            return
        try:
            await self.store.revive()
            logged = await self.store.last_seq_async()
            if logged == held.base + len(held.rows) and len(held.rows) > len(held.batch.rows):
                # PostgreSQL committed the whole batch but its answer was lost
                log.warning(
                    "the batch of events %d..%d was committed after all (its COMMIT's "
                    "answer was lost): applied",
                    held.base + 1,
                    logged,
                )
                self.d.seq = logged
                self._committed(held.rows)
                for r, p in held.prepared:
                    self._apply(r, p, False, False)
            elif logged == held.base + len(held.batch.rows) and held.batch.rows:
                self._committed(held.batch.rows)  # the pass's part alone landed: done
            elif logged == held.base:
                if held.batch.rows or held.batch.ops:
                    await self.store.commit(held.batch)
                    self._committed(held.batch.rows)
            else:
                raise StoreMismatch(
                    f"the log has events up to {logged} but this daemon expected "
                    f"{held.base + len(held.batch.rows)} when the store came back (another "
                    f"daemon wrote meanwhile?): stopping; the restart rebuilds the state"
                )
        except Exception as exc:
            fault = classify(exc, self.store.log.label)
            if fault is None:
                raise
            self.away = fault  # still away (perhaps for another reason now)
            return
        if held.evicting:
            self.d.eviction.drop(self.d, held.evicting, self.d.clock.now())
        self.away, self._held = None, None
        self.metrics.store_back()
        log.warning(
            "kliqued: the store is back after %.1f s (%s); writes accepted again",
            time.monotonic() - held.since,
            away.text(),
        )
        self.request_pass(SETTLE_S)

    async def _cycle(self) -> None:
        d = self.d
        events: list[Event] = []
        batch = Batch()
        due = self._due_at()
        if d.ready and not self._stopping and due is not None and due <= time.monotonic():
            t0 = time.perf_counter()
            now = d.clock.now()
            pev, pops, counts = d.run_pass(now)
            self.metrics.pass_seconds.observe(time.perf_counter() - t0)
            self.metrics.count(pev)  # as the State already shows them
            events.extend(pev)
            batch.ops.extend(pops)
            mono = time.monotonic()
            self._next_timer = mono + self.pass_interval_s
            self._soon = None
            nxt = d.last_result.next_pass_at if d.last_result is not None else None
            self._engine_at = None if nxt is None else mono + max(0, nxt - now) / SECOND_MS
            if counts:
                log.info(
                    "pass: %s (%.1f ms)",
                    ", ".join(f"{n} {k}" for k, n in sorted(counts.items())),
                    (time.perf_counter() - t0) * 1000,
                )
        # Ended records past what memory keeps: their rows in this commit, out of memory
        # once it is durable (history.py).
        evicting = d.eviction.due(d) if d.ready and not self._stopping else []
        if evicting:
            batch.ops.append(
                partial(history.write_records, recs=d.eviction.unstored(evicting), dedupe=False)
            )
        # Requests, in arrival order, up to (and alone if it is) a barrier.
        taken: list[_Request] = []
        while self._pending:
            r = self._pending[0]
            if r.barrier and taken:
                break
            taken.append(self._pending.pop(0))
            if r.barrier:
                break
        if self._pending:
            self._wake.set()
        pass_events, pass_ops = len(events), len(batch.ops)
        prepared: list[tuple[_Request, Prepared]] = []
        closes: list[tuple[str, int, str]] = []
        ov = Overlay()
        now = d.clock.now()
        for r in taken:
            if r.future.done():
                continue  # a parked change given up
            try:
                p = r.prepare(now, ov)
            except ApiError as exc:
                r.future.set_exception(exc)
                continue
            except Exception as exc:  # a bug: the request gets a 500, nothing is logged
                r.future.set_exception(exc)
                continue
            prepared.append((r, p))
            events.extend(p.events)
            batch.ops.extend(p.ops)
            closes.extend(p.closes)
        if closes:
            batch.ops.append(ledger_ops.closes(closes))
        wants_pass = False
        soon = False
        if events or batch.ops:
            base = d.seq
            t0 = time.perf_counter()
            try:
                for i, ev in enumerate(events):
                    d.seq += 1
                    at = d.last_pass_at if i < pass_events and d.last_pass_at is not None else now
                    batch.rows.append(ev.row(d.seq, at))
                await self.store.commit(batch)
                self.metrics.count(events[pass_events:])
                self._committed(batch.rows)
            except BaseException as exc:
                fault = None if unstorable(exc) else classify(exc, self.store.log.label)
                if fault is not None:
                    for r, _ in prepared:
                        if not r.future.done():
                            r.future.set_exception(fault.refusal())
                    d.seq = base + pass_events
                    self._go_away(
                        fault,
                        _Held(
                            base,
                            Batch(batch.rows[:pass_events], batch.ops[:pass_ops]),
                            evicting,
                            batch.rows,
                            prepared,
                            time.monotonic(),
                        ),
                    )
                    return
                if not unstorable(exc):
                    for r, _ in prepared:
                        if not r.future.done():
                            r.future.set_exception(_refusal(exc))
                    raise
                log.warning(
                    "a commit of %d events was refused for its data (%s: %s); "
                    "committing its parts one by one",
                    len(batch.rows),
                    type(exc).__name__,
                    str(exc)[:200],
                )
                d.seq = base
                await self._isolate(
                    events[:pass_events], batch.ops[:pass_ops], [r for r, _ in prepared]
                )
                if evicting:
                    d.eviction.drop(d, evicting, d.clock.now())
                return
            took = time.perf_counter() - t0
            if took > SLOW_COMMIT_S:
                log.warning("slow commit: %.0f ms for %d events", took * 1000, len(batch.rows))
        for r, p in prepared:
            wants_pass, soon = self._apply(r, p, wants_pass, soon)
        if evicting:
            d.eviction.drop(d, evicting, now)
        if wants_pass:
            self.request_pass(REPORT_SETTLE_S if soon else SETTLE_S)

    @staticmethod
    def _apply(r: _Request, p: Any, wants_pass: bool, soon: bool) -> tuple[bool, bool]:
        """Applies a committed request to the live state and answers it; returns whether a
        pass is wanted, and soon (it freed capacity), folded into the cycle's flags."""
        try:
            result = p.apply()
        except Exception as exc:  # durable but not applied: a bug; fail loudly
            r.future.set_exception(exc)
            raise
        if not r.future.done():
            r.future.set_result(result)
        return wants_pass or p.wants_pass, soon or (p.wants_pass and p.frees)

    async def _isolate(
        self, pass_events: list[Event], pass_ops: list[Any], requests: list[_Request]
    ) -> None:
        """After a commit refused for its data: the pass's part (already in the State, so it
        must be durable: its failure is fatal), then each request alone, prepared again
        against the State as the earlier ones left it, committed, applied and answered. A
        request whose own commit is refused gets a 422 and leaves no trace."""
        d = self.d
        if pass_events or pass_ops:
            at = d.last_pass_at if d.last_pass_at is not None else d.clock.now()
            rows = self._rows(pass_events, at)
            await self.store.commit(Batch(rows, list(pass_ops)))
            self._committed(rows)
        wants_pass = soon = False
        for r in requests:
            if r.future.done():
                continue
            now = d.clock.now()
            try:
                p = r.prepare(now, Overlay())
            except Exception as exc:  # an ApiError now, or a bug: a 500, nothing logged
                r.future.set_exception(exc)
                continue
            ops = list(p.ops)
            if p.closes:
                ops.append(ledger_ops.closes(p.closes))
            base = d.seq
            if p.events or ops:
                try:
                    rows = self._rows(p.events, now)
                    await self.store.commit(Batch(rows, ops))
                    self.metrics.count(p.events)
                    self._committed(rows)
                except BaseException as exc:
                    d.seq = base
                    if not unstorable(exc):
                        r.future.set_exception(Unavailable("the event log cannot be written"))
                        raise
                    eid = uuid.uuid4().hex[:12]
                    log.error(
                        "error %s: a request's data cannot be stored (%s: %s); it is "
                        "refused, the daemon goes on",
                        eid,
                        type(exc).__name__,
                        str(exc)[:500],
                    )
                    r.future.set_exception(
                        ApiError(
                            422,
                            "unstorable",
                            f"the request's data cannot be stored; nothing "
                            f"was recorded (error {eid}: the daemon's log has the details)",
                        )
                    )
                    continue
            wants_pass, soon = self._apply(r, p, wants_pass, soon)
        if wants_pass:
            self.request_pass(REPORT_SETTLE_S if soon else SETTLE_S)

    def _committed(self, rows: list[tuple]) -> None:
        if self.on_commit is not None and rows:
            try:
                self.on_commit(rows)
            except Exception:  # an observer's bug must not fail a commit already durable
                log.exception("on_commit observer failed")

    def _rows(self, events: list[Event], at: int) -> list[tuple]:
        """Rows for ``events``, the next sequence numbers assigned."""
        rows = []
        for ev in events:
            self.d.seq += 1
            rows.append(ev.row(self.d.seq, at))
        return rows

    # ------------------------------------------------------------------ shutdown
    async def stop(self) -> None:
        """Takes no new request, commits those already taken, and returns."""
        self._stopping = True
        self.unpark_all([])
        self._wake.set()
