"""The plan as data: what changed between two estates, and what that does to running work.

Every renderer is a pure function of a ``Plan``, so the four formats can never disagree on
what the plan is, and the exit code is decided here, once, not per format.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ..diagnostics import Diagnostic, Position
from .whatif import WhatIf

Action = Literal["create", "update", "delete", "rename"]
Severity = Literal["error", "warn", "info"]

SEVERITY_ORDER: dict[str, int] = {"error": 0, "warn": 1, "info": 2}
KIND_ORDER: dict[str, int] = {
    "settings": 0,
    "pool": 1,
    "profile": 2,
    "policy": 3,
    "group": 4,
    "price": 5,
    "estate": 6,
}
"""The order of the estate's sections in estate.md: a reviewer reads a plan top down the
same way they read the estate."""

SYMBOL: dict[str, str] = {"create": "+", "delete": "-", "update": "~", "rename": "~"}

EXIT_NO_CHANGES = 0
EXIT_INVALID = 1
EXIT_CHANGES = 2


@dataclass(frozen=True)
class AttrChange:
    """One attribute as IT writes it (``capacity``, ``labels.country``), already formatted
    for display (``64``, ``"de"``, ``15m``, ``[a, b]``): every renderer shows the same text."""

    path: tuple[str, ...]
    op: Literal["+", "-", "~"]
    before: str | None
    after: str | None
    pos: Position | None
    before_value: Any = None
    """The typed value (a number, string, bool or list, as the estate writes it): what the
    JSON plan holds, where ``before``/``after`` are the text people read."""
    after_value: Any = None

    @property
    def name(self) -> str:
        return ".".join(self.path)


@dataclass(frozen=True)
class ObjectChange:
    kind: str
    """settings, pool, profile, policy, group or price; ``estate`` for a difference of the
    canonical form outside those sections (``diff._rest``)."""
    name: str
    """The head's name; for a delete, the base's. Prices: ``gpu_type@effective_from``."""
    action: Action
    pos: Position | None
    """Where the object is in the head (a delete: in the base)."""
    attrs: tuple[AttrChange, ...] = ()
    old_name: str | None = None
    """Only for a rename: the base's name (the head's ``renamed_from``)."""
    before: dict[str, Any] | None = None
    """The compiled base object (JSON form), for machine readers of the JSON plan."""
    after: dict[str, Any] | None = None

    @property
    def address(self) -> str:
        return self.kind if self.kind in ("settings", "estate") else f"{self.kind}.{self.name}"

    @property
    def symbol(self) -> str:
        return SYMBOL[self.action]

    def sort_key(self) -> tuple[int, str]:
        return (KIND_ORDER.get(self.kind, 99), self.name)


@dataclass(frozen=True)
class Impact:
    severity: Severity
    kind: str
    """A stable identifier of the rule that found it, e.g. ``reservation-headroom``."""
    message: str
    details: dict[str, Any] = field(default_factory=dict)
    subject: tuple[str, str] | None = None
    """(kind, name) of the object the impact is about, to find its place in the sources."""
    side: Literal["base", "head"] = "head"
    """Which revision the subject lives in (a removed object: the base)."""
    pos: Position | None = None
    rank: int = 0
    """Order within a kind, most pressing first (e.g. the tightest headroom)."""

    def sort_key(self) -> tuple[int, str, int, str]:
        return (SEVERITY_ORDER[self.severity], self.kind, self.rank, self.message)


@dataclass(frozen=True)
class Approver:
    """One admin whose approval a change needs, and why (organisation.md: the admins of the
    groups a change touches and of the groups above them; IT for shared objects)."""

    user: str
    group: str | None
    """The group they administer that makes them an approver; None for ``settings.approvers``."""
    role: Literal["group", "above", "it"]
    """``group``: admin of the changed group; ``above``: of a group above it; ``it``: an
    approver of shared objects (pools, profiles, prices, settings)."""
    handle: str | None = None
    """Their forge handle (``settings.forge_handles``), when the estate names one."""

    @property
    def text(self) -> str:
        """``ursula @ursula-nw (digital)``, ``trent (northwind, IT)``, ``ian (IT)``."""
        who = f"{self.user} {self.handle}" if self.handle else self.user
        why = [w for w in (self.group, "IT" if self.role == "it" else None) if w]
        return f"{who} ({', '.join(why)})"


@dataclass(frozen=True)
class Approval:
    """The approvals one change needs."""

    address: str
    """The change's address (``policy.team-a``)."""
    approvers: tuple[Approver, ...]
    """Nearest first: the changed group's admins, then each group above, then IT."""


@dataclass(frozen=True)
class EnvelopeFigures:
    """A department's envelope at one revision, in integer thousandths like the compiled
    estate: what a department head compares before and after a change."""

    group: str
    reservation_milli: int
    shared_milli: int
    """The part of the reservation no team below holds: any team may use it."""
    team_limits_milli: int
    """The sum of the limits of the nearest policies below."""
    limit_milli: int
    budget_hours_milli: int | None
    budget_period: str | None
    teams: tuple[str, ...]

    @property
    def oversubscription(self) -> float | None:
        """Sum of team limits / the envelope's limit; None for a limit of 0."""
        return self.team_limits_milli / self.limit_milli if self.limit_milli else None


@dataclass(frozen=True)
class EnvelopeRow:
    """An envelope (the policy of a group with groups below it) that a change touches."""

    name: str
    before: EnvelopeFigures | None
    """None: not an envelope in the base (new, or its group had nothing below it)."""
    after: EnvelopeFigures | None


@dataclass(frozen=True)
class Revision:
    """One side of the plan."""

    label: str
    """What the user asked for (``main``, ``HEAD~1``, ``working tree``)."""
    commit: str | None
    """The full commit id; None for the working tree."""
    estate_revision: str | None
    """The compiled estate's content digest; None when the estate did not compile."""
    valid: bool = True
    exists: bool = True
    """False when the estate path is absent at this revision (an empty estate)."""
    diagnostics: tuple[Diagnostic, ...] = ()

    @property
    def short(self) -> str:
        if self.commit is None:
            return self.label
        return f"{self.label} ({self.commit[:7]})"


@dataclass(frozen=True)
class Running:
    """The revision a daemon runs, as ``--against`` or ``--what-if-from`` read it."""

    source: str
    """The daemon's URL."""
    revision: str
    """Its estate revision (``sha256:...``)."""
    commit: str | None = None
    """The git commit it was read from, when the daemon follows a branch."""


def is_stale(base: Revision, running: Running | None) -> bool:
    """The one rule for a stale base: the daemon read runs another estate revision."""
    return running is not None and running.revision != (base.estate_revision or "")


@dataclass(frozen=True)
class Plan:
    base: Revision
    head: Revision
    estate_path: str
    changes: tuple[ObjectChange, ...] = ()
    impacts: tuple[Impact, ...] = ()
    touched: tuple[Any, ...] = ()
    """The head's changed line ranges (``touched.Hunk``), to report errors caused by the
    change on the lines it touched as well as where they show."""
    live: Any = None
    """The running system's state the impacts were counted against (``LiveState``), or
    None when the plan compares the two revisions only."""
    approvals: tuple[Approval, ...] = ()
    """Per change, in the order of ``changes``: whose approval it needs."""
    envelopes: tuple[EnvelopeRow, ...] = ()
    """The departments' envelopes the changes touch, before and after."""
    running: Running | None = None
    """What the daemon runs, when the plan read it: a base that differs is a stale plan
    (the ``stale-base`` impact)."""
    whatif: WhatIf | None = None
    """Real demand replayed on both sides, or None."""

    @property
    def drift(self) -> bool:
        """The daemon runs another revision than the base: the plan compares the head with
        an estate that is not the one in force."""
        return self.base.valid and is_stale(self.base, self.running)

    @property
    def approvers(self) -> list[Approver]:
        """Every approver of the plan once (first mention wins), for the summary line."""
        seen: dict[str, Approver] = {}
        for a in self.approvals:
            for p in a.approvers:
                seen.setdefault(p.user, p)
        return sorted(seen.values(), key=lambda p: p.user)

    @property
    def valid(self) -> bool:
        return self.base.valid and self.head.valid

    @property
    def add(self) -> int:
        return sum(c.action == "create" for c in self.changes)

    @property
    def change(self) -> int:
        return sum(c.action in ("update", "rename") for c in self.changes)

    @property
    def remove(self) -> int:
        return sum(c.action == "delete" for c in self.changes)

    @property
    def summary_line(self) -> str:
        if not self.valid:
            return "Plan failed: " + (
                "the head estate is invalid."
                if not self.head.valid
                else "the base estate is invalid."
            )
        if not self.changes:
            return "No changes."
        return f"Plan: {self.add} to add, {self.change} to change, {self.remove} to remove."

    def impacts_of(self, severity: str) -> list[Impact]:
        return [i for i in self.impacts if i.severity == severity]

    @property
    def error_count(self) -> int:
        """Errors of the plan: error impacts, and the errors of a revision that does not
        compile (a failed plan has no impacts, yet it is not error-free)."""
        invalid = [r for r in (self.base, self.head) if not r.valid]
        return len(self.impacts_of("error")) + sum(
            d.is_error for r in invalid for d in r.diagnostics
        )

    @property
    def exit_code(self) -> int:
        """0: nothing to apply; 2: changes to review; 1: something must be fixed first."""
        if not self.valid or any(i.severity == "error" for i in self.impacts):
            return EXIT_INVALID
        return EXIT_CHANGES if self.changes else EXIT_NO_CHANGES
