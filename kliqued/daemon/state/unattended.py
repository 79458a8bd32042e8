"""The loop of the unattended channels: schedules that are due run, pipelines move on, and
those whose token stopped working are paused (binding.py: an expiry has no event of its own).

It only looks; every change goes through the sequencer as a request prepared against the
state of its own moment (``schedules.prepare_run``, ``pipelines.prepare_advance``), so a look
that races another (or a restart) cannot run a due time twice or send a step twice. Its
clock is the daemon's (``Daemon.clock``): tests give it any time.
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import Callable

from kliqued.daemon.state import pipelines, schedules
from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.state.prepared import Overlay, Prepared
from kliqued.daemon.state.loop import Sequencer

log = logging.getLogger(__name__)

TICK_S = 0.25
"""How often it looks: a step starts within this of its dependencies' end (the cron's
resolution is a minute)."""


class Unattended:
    def __init__(
        self,
        d: Daemon,
        seq: Sequencer,
        now: Callable[[], int] | None = None,
        tick_s: float = TICK_S,
    ) -> None:
        self.d, self.seq, self.tick_s = d, seq, tick_s
        self.now = now or d.clock.now
        self.revision: str | None = None
        """The estate revision the schedules were last checked against."""

    async def tick(self) -> int:
        """One look at every active schedule and running pipeline; returns how many
        requests it made."""
        d, made = self.d, 0
        if not d.ready:
            return 0
        now = self.now()
        if d.estate.revision != self.revision:  # access may have changed: stop at once
            self.revision = d.estate.revision
            for s in d.schedules.active():
                if schedules.denied(d, s) is not None:
                    await self.seq.submit(partial(self._recheck, s.id))
                    made += 1
        for s in d.schedules.active():
            if d.tokens.ended(s.token, now) is not None:  # an expiry has no event: paused
                await self.seq.submit(partial(self._lapsed, s.id, now))  # at this look
                made += 1
                continue
            nxt = s.next_due()
            if nxt is None or nxt > now:
                continue
            dec = s.due(now)
            if dec.run is None and dec.missed == 0:
                continue
            await self.seq.submit(partial(self._run, s.id, now))
            made += 1
        for pr in d.pipelines.running():
            if d.tokens.ended(pr.token, now) is not None:
                await self.seq.submit(partial(self._lapsed_pipeline, pr.id, now))
                made += 1
            elif pipelines.pending(d, pr):
                await self.seq.submit(partial(self._advance, pr.id, now))
                made += 1
        return made

    def _run(self, sid: str, now: int, t: int, ov: Overlay) -> Prepared:
        """``now``: the loop's time, which decided the schedule is due (the sequencer's
        ``t`` is the wall clock's)."""
        return schedules.prepare_run(self.d, sid, now, t, ov)

    def _lapsed(self, sid: str, at: int, now: int, ov: Overlay) -> Prepared:
        return schedules.prepare_lapsed(self.d, sid, at, now, ov)

    def _lapsed_pipeline(self, pid: str, at: int, now: int, ov: Overlay) -> Prepared:
        return pipelines.prepare_lapsed(self.d, pid, at, now, ov)

    def _recheck(self, sid: str, now: int, ov: Overlay) -> Prepared:
        return schedules.prepare_recheck(self.d, sid, now, ov)

    def _advance(self, pid: str, at: int, now: int, ov: Overlay) -> Prepared:
        return pipelines.prepare_advance(self.d, pid, now, ov, at)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.tick()
            except Exception as exc:  # shutting down (Unavailable), or a bug: keep looking
                if stop.is_set():
                    return
                log.warning("schedules and pipelines: %s: %s", type(exc).__name__, exc)
            try:
                await asyncio.wait_for(stop.wait(), self.tick_s)
            except asyncio.TimeoutError:
                pass
