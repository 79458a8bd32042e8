"""Phase 4's gate on a flat estate, kept across passes: can any team take anything at all?

Phase 4 (lending.md's rebalance) can move GPUs to a candidate of group ``g`` of size ``s``
only from a pool ``p`` whose ``give(p)`` (``passes.Givers._give``: the highest ``(used(h) -
size(v) - reservation(h)) x factor(h)`` over the tasks ``v`` there that could be victims) is
at least ``g``'s share after the move. Over every pool, ``give`` is at most ``top_give``:
the highest ``(used(h) - its smallest placed task - reservation(h)) x factor(h)`` over the
teams ``h``; and every candidate's share after the move is at least ``low_after``, the lowest
over the teams with queued work of their share after taking their smallest queued task. So
when ``low_after > top_give`` no candidate can take from anyone, and the phase has nothing
to do: the steady pass's case, answered here from two heaps instead of walking 2,000 teams
and every pool's tasks (docs/decisions.md, issue 28's section on the lending pass's speed).

A team's two figures change only when its usage, its placed tasks or its queues change
(``State.taker_dirty``, kept by the state) or the estate does (a new ``TakerBounds``).
"""

from __future__ import annotations

import heapq


class TakerBounds:
    """Per team its share after taking its smallest queued task (``after``) and its highest
    possible give (``give``), with a lazy heap of each: the lowest ``after`` and the highest
    ``give`` on top. An entry is current while it equals the team's figure."""

    __slots__ = ("after", "give", "low", "high", "fresh")

    def __init__(self) -> None:
        self.after: dict[str, int] = {}
        self.give: dict[str, int] = {}
        self.low: list[tuple[int, str]] = []
        self.high: list[tuple[int, str]] = []
        self.fresh = True
        """Nothing computed yet (a new estate): every team is to be looked at."""

    def set(self, team: str, after: int | None, give: int | None) -> None:
        """The team's figures now; None: it has no queued work (``after``) or no placed
        task above size 0 (``give``)."""
        if after is None:
            self.after.pop(team, None)
        elif self.after.get(team) != after:
            self.after[team] = after
            heapq.heappush(self.low, (after, team))
        if give is None:
            self.give.pop(team, None)
        elif self.give.get(team) != give:
            self.give[team] = give
            heapq.heappush(self.high, (-give, team))
        if len(self.low) > 4 * len(self.after) + 64:
            self.low = [(a, t) for t, a in self.after.items()]
            heapq.heapify(self.low)
        if len(self.high) > 4 * len(self.give) + 64:
            self.high = [(-g, t) for t, g in self.give.items()]
            heapq.heapify(self.high)

    def top_give(self) -> int:
        """The highest current ``give`` (-1: none), dropping stale tops."""
        high, give = self.high, self.give
        while high and give.get(high[0][1]) != -high[0][0]:
            heapq.heappop(high)
        return -high[0][0] if high else -1

    def nobody_takes(self) -> bool:
        """Whether ``low_after > top_give``: no team can take anything in phase 4."""
        low, high = self.low, self.high
        after, give = self.after, self.give
        while low and after.get(low[0][1]) != low[0][0]:
            heapq.heappop(low)
        while high and give.get(high[0][1]) != -high[0][0]:
            heapq.heappop(high)
        if not low:
            return True  # no queued work
        top = -high[0][0] if high else -1
        return top < 0 or low[0][0] > top
