"""The budget meter: exact weighted charges per group, per UTC day.

Charges are integers (time weight in milli x milliseconds), so a month of placements sums with
no drift, and a budget of ``hours_milli`` is ``hours_milli * HOUR_MS`` of the same units
(``klique_util.units``).
Every group is metered whether or not it has a budget, because a budget added in the middle of
a period must count what the group already spent in it (engine.md). Charges are kept per UTC
day: every period kind is a run of whole days, so one set of buckets answers a day, a week or
a month, and a placement across a boundary is split at it for free.

A meter only changes when its group's rate changes (a placement, preemption or end) or the
engine is switched on or off; between those, usage is ``closed + rate * (now - since)``.
"""

from __future__ import annotations

from compiler.compiled import CBudget
from klique_util.units import DAY_MS, HOUR_MS, MILLI, SECOND_MS

from .errors import TimeWentBackwards
from .periods import Period, next_period_start, period_start


_KEEP_DAYS = 40
"""Days of buckets kept: more than the longest period (a month)."""


class Meter:
    """Weighted (budget) and GPU (ledger) time of one group's placed tasks."""

    __slots__ = (
        "rate",
        "weighted_tasks",
        "since",
        "days",
        "gpu_rate",
        "gpu_units",
        "gpu_since",
        "_prior_key",
        "_prior",
    )

    def __init__(self, now: int) -> None:
        self.rate = 0
        """Sum of the time weights (milli) of the group's placed tasks."""
        self.weighted_tasks = 0
        """How many placed tasks have a weight above 0 (the start check's exception)."""
        self.since = now
        self.days: dict[int, int] = {}
        self.gpu_rate = 0
        self.gpu_units = 0
        """Milli-GPU x milliseconds, whatever the engine's state (the ledger)."""
        self.gpu_since = now
        self._prior_key: tuple[int, int] | None = None
        self._prior = 0

    def settle(self, now: int, charging: bool) -> None:
        """Closes the charges up to ``now`` into day buckets; call before changing a rate."""
        if now < self.since:
            raise TimeWentBackwards(f"time went backwards: {now} < {self.since}")
        if charging and self.rate and now > self.since:
            t = self.since
            days = self.days
            while t < now:
                d = t // DAY_MS
                end = min(now, (d + 1) * DAY_MS)
                days[d] = days.get(d, 0) + self.rate * (end - t)
                t = end
            first_kept = now // DAY_MS - _KEEP_DAYS
            if len(days) > _KEEP_DAYS + 2:
                for d in [d for d in days if d < first_kept]:
                    del days[d]
        self.since = now
        self.gpu_units += self.gpu_rate * (now - self.gpu_since)
        self.gpu_since = now

    def change(self, now: int, charging: bool, weight: int, size: int) -> None:
        """A task of this weight and size was placed (+) or left its pool (-)."""
        if now != self.since or now != self.gpu_since:  # else nothing to settle
            self.settle(now, charging)
        self.rate += weight
        self.gpu_rate += size

    def used(self, period: Period, now: int, charging: bool) -> int:
        """Charge units of the period containing ``now``, up to ``now``."""
        ps = period_start(period, now)
        ps_day = ps // DAY_MS
        since_day = self.since // DAY_MS
        total = 0
        if since_day >= ps_day:
            # Buckets before the day of `since` are closed for good, so their sum is cached.
            key = (ps_day, since_day)
            if key != self._prior_key:
                self._prior = sum(v for d, v in self.days.items() if ps_day <= d < since_day)
                self._prior_key = key
            total = self._prior + self.days.get(since_day, 0)
        if charging and self.rate and now > self.since:
            total += self.rate * (now - max(self.since, ps))
        return total

    def credit(self, start: int, end: int, weight: int, size: int, charging: bool) -> None:
        """Takes back what a task of this weight and size was charged over ``[start, end)``,
        a span already settled (``end <= since``): it had ended at ``start``, and the news
        came at ``end`` (its worker was down, its report delayed). ``charging``: the budget
        was charged over the whole span (the engine was on); the ledger's GPU time always
        was. Charges are linear in time, so taking a span back leaves every other charge as
        it was; days older than those kept are past every period and left alone."""
        if end <= start:
            return
        if end > self.since or end > self.gpu_since:
            raise TimeWentBackwards(f"credit past the settled time: {end} > {self.since}")
        if charging and weight:
            days = self.days
            first_kept = self.since // DAY_MS - _KEEP_DAYS
            t = start
            while t < end:
                d = t // DAY_MS
                stop = min(end, (d + 1) * DAY_MS)
                if d >= first_kept and d in days:
                    days[d] = max(0, days[d] - weight * (stop - t))
                t = stop
            self._prior_key = None  # the cached sum of closed days may have changed
        self.gpu_units = max(0, self.gpu_units - size * (end - start))

    @classmethod
    def merged(cls, meters: list["Meter"], now: int, charging: bool) -> "Meter":
        """One meter for the sum of ``meters`` from ``now`` on (an envelope's, from its
        teams'): charges are linear, so the sum of the day buckets is the subtree's."""
        out = cls(now)
        for m in meters:
            m.settle(now, charging)
            out.rate += m.rate
            out.weighted_tasks += m.weighted_tasks
            out.gpu_rate += m.gpu_rate
            out.gpu_units += m.gpu_units
            for d, v in m.days.items():
                out.days[d] = out.days.get(d, 0) + v
        return out

    def gpu_used(self, now: int) -> int:
        return self.gpu_units + self.gpu_rate * (max(now, self.gpu_since) - self.gpu_since)


def budget_units(budget: CBudget) -> int:
    return budget.hours_milli * HOUR_MS


def remaining(meter: Meter, budget: CBudget, now: int, charging: bool) -> int:
    return budget_units(budget) - meter.used(budget.period, now, charging)


def start_ok(meter: Meter, budget: CBudget, weight: int, now: int, charging: bool) -> bool:
    """engine.md's start check for a task of ``weight`` (> 0) of a group with ``budget``.

    ``remaining / (rate + w) >= low_watermark`` in hours is, in integer units,
    ``remaining >= (rate + w) * low_watermark_ms``; the one-task exception applies while the
    group has no placed task with a weight above 0.
    """
    left = remaining(meter, budget, now, charging)
    if left <= 0:
        return False
    if meter.weighted_tasks == 0:
        return True
    return left >= (meter.rate + weight) * budget.low_watermark_s * SECOND_MS


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def next_budget_event(
    meter: Meter, budget: CBudget, now: int, charging: bool, raised: frozenset[int] | set[int]
) -> int | None:
    """The next moment this budget needs a pass on its own: it runs out, or usage crosses an
    alert threshold not yet raised in the period. None when neither happens in this period
    (the period start is a trigger of its own)."""
    if not charging or meter.rate <= 0:
        return None
    used = meter.used(budget.period, now, charging)
    total = budget_units(budget)
    end = next_period_start(budget.period, now)
    best: int | None = None
    if used < total and meter.weighted_tasks:
        best = now + ceil_div(total - used, meter.rate)
    for a in budget.alert_at_milli:
        if a in raised:
            continue
        threshold = budget.hours_milli * a * (HOUR_MS // MILLI)
        if threshold > used:
            t = now + ceil_div(threshold - used, meter.rate)
            if best is None or t < best:
                best = t
            break  # thresholds are sorted: the first unraised one above usage comes first
    if best is not None and best >= end:
        return None
    return best
