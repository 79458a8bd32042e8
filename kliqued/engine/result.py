"""A pass's decisions, with lazy views of what is costly to list at every pass.

Placements, preemptions, cancellations and alerts are listed in the order they were decided.
The waiting reason of every queued task and every policy's budget are views computed on
demand from the state as the pass left it (engine.md's reasons and "seen before it hits"):
listing 100,000 reasons at every pass would cost more than the pass. They stay valid until the
state next changes; after that they raise :class:`StaleResult` rather than answer for a state
the pass did not decide.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .decisions import Alert, BudgetStatus, Cancellation, Placement, Preemption, Reason
from .errors import StaleResult
from .reasons import budget_status, waiting_reason, waiting_reasons

if TYPE_CHECKING:
    from .index import EstateIndex
    from .state import State


class PassResult:
    __slots__ = ("index", "_state", "now", "decisions", "next_pass_at", "repeats", "_version")

    def __init__(
        self,
        index: "EstateIndex",
        state: "State",
        now: int,
        decisions: list[Placement | Preemption | Cancellation | Alert],
        next_pass_at: int | None,
        repeats: int,
    ) -> None:
        self.index = index
        self._state = state
        self.now = now
        self.decisions: list[Placement | Preemption | Cancellation | Alert] = decisions
        """Everything decided, in order."""
        self.next_pass_at = next_pass_at
        """The latest time the next pass must run (a budget runs out or crosses an alert
        threshold, a period starts); None when nothing is due by time alone. Events (a
        submission, an end, an estate change) call for a pass of their own."""
        self.repeats = repeats
        """How many times the pass ran at this moment (0: nothing to do)."""
        self._version = state.version

    @property
    def placements(self) -> list[Placement]:
        return [d for d in self.decisions if isinstance(d, Placement)]

    @property
    def preemptions(self) -> list[Preemption]:
        return [d for d in self.decisions if isinstance(d, Preemption)]

    @property
    def cancellations(self) -> list[Cancellation]:
        return [d for d in self.decisions if isinstance(d, Cancellation)]

    @property
    def alerts(self) -> list[Alert]:
        return [d for d in self.decisions if isinstance(d, Alert)]

    @property
    def changed(self) -> bool:
        return bool(self.decisions)

    def _check(self) -> "State":
        if self._state.version != self._version:
            raise StaleResult("the state changed after this pass")
        return self._state

    def waiting_reason(self, task_id: str) -> Reason | None:
        return waiting_reason(self.index, self._check(), task_id, self.now)

    def waiting_reasons(self) -> dict[str, Reason]:
        return waiting_reasons(self.index, self._check(), self.now)

    def budget(self, policy: str) -> BudgetStatus | None:
        return budget_status(self.index, self._check(), policy, self.now)

    def budgets(self) -> dict[str, BudgetStatus]:
        st = self._check()
        out = {}
        for gi in self.index.groups.values():
            if gi.budget is not None:
                s = budget_status(self.index, st, gi.policy, self.now)
                if s is not None:
                    out[gi.policy] = s
        return out
