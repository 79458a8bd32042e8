"""What the advisor proposes, as typed records every renderer reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from compiler.plan.whatif import Figures, WhatIf

Field = Literal["limit", "budget"]


@dataclass(frozen=True, slots=True)
class Change:
    """One estate value changed: a policy's ``limit`` (GPUs) or its budget's ``hours``."""

    policy: str
    group: str
    field: Field
    before: float
    after: float
    file: str
    line: int
    why: str
    """What in the replayed weeks suggested it (a budget that ran out, work at the limit)."""

    @property
    def label(self) -> str:
        what = "limit" if self.field == "limit" else "budget hours"
        return f"{self.policy}: {what} {self.before:g} -> {self.after:g}"


@dataclass(frozen=True, slots=True)
class Approver:
    user: str
    group: str
    role: str
    """``group``: an admin of the changed policy's group; ``above``: of a group above it."""


@dataclass(frozen=True)
class Proposal:
    """A change and what the what-if says it does on the same weeks' demand."""

    change: Change
    target: str
    """The group whose waits it is for."""
    before: Figures | None
    after: Figures | None
    accepted: bool
    verdict: str
    """Why it is kept or dropped, in words."""
    worst_other: tuple[str, float] | None = None
    """The other group whose p95 wait rose most, and by how much (a fraction)."""
    whatif: WhatIf | None = None
    patch: str = ""
    approvers: tuple[Approver, ...] = ()


@dataclass(frozen=True)
class Advice:
    """The baseline (the demand on the estate as it is) and every proposal tried."""

    source: str
    estate: str
    baseline: WhatIf
    proposals: tuple[Proposal, ...] = field(default_factory=tuple)
    subtree: str | None = None
    """Only this group's subtree was advised on (a department head's view)."""
    kept: tuple[Proposal, ...] = ()
    """The accepted proposals, one per policy value (the one that lowered the wait most):
    what the patch holds."""
    together: WhatIf | None = None
    """The kept changes replayed together, against the estate as it is."""
