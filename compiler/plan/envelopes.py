"""The departments' envelopes a plan touches, before and after.

A department head approving "give team X 4 more GPUs" asks what it does to the department as
a whole: how much of the reservation is still shared, how far the teams' limits together
over-subscribe the department's limit, and what the budget is. The figures come from the
compiled estate's own fields (``envelope``, ``below``, ``shared_reservation_milli``), so the
plan shows exactly what the compiler decided.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..compiled import CompiledEstate, CPolicy
from .approvals import touched_groups
from .model import EnvelopeFigures, EnvelopeRow, ObjectChange


def figures(est: CompiledEstate, env: CPolicy) -> EnvelopeFigures:
    below = [p for n in env.below if (p := est.policy(n)) is not None]
    return EnvelopeFigures(
        group=env.group,
        reservation_milli=env.reservation_milli,
        shared_milli=env.shared_reservation_milli,
        team_limits_milli=sum(p.limit_milli for p in below),
        limit_milli=env.limit_milli,
        budget_hours_milli=env.budget.hours_milli if env.budget else None,
        budget_period=env.budget.period if env.budget else None,
        teams=tuple(env.below),
    )


def _policies_of_groups(est: CompiledEstate | None, groups: Iterable[str]) -> list[CPolicy]:
    if est is None:
        return []
    wanted = set(groups)
    return [p for p in est.policies if p.group in wanted]


def _envelopes_of(est: CompiledEstate | None, groups: Iterable[str]) -> set[str]:
    """The envelopes a change to these groups' policies moves: each policy's own when it is
    one, and every envelope above it."""
    out: set[str] = set()
    for pol in _policies_of_groups(est, groups):
        out.update(pol.levels[1:])
        if pol.envelope:
            out.add(pol.name)
    return out


def envelope_rows(
    changes: Sequence[ObjectChange], base: CompiledEstate | None, head: CompiledEstate | None
) -> tuple[EnvelopeRow, ...]:
    """Rows for the envelopes that a policy or group change touches, on either side, in
    the head's declaration order (then the base's, for an envelope that is gone)."""
    touched: set[str] = set()
    for c in changes:
        if c.kind not in ("policy", "group"):
            continue  # pools, profiles and prices change no envelope's figures
        # Both sides: a team moved from one department to another changes both.
        in_head, in_base = touched_groups(c, base, head)
        touched |= _envelopes_of(head, in_head) | _envelopes_of(base, in_base)
    # A renamed envelope is one row under its new name, its base figures under the old.
    old_of = {c.name: c.old_name for c in changes if c.kind == "policy" and c.old_name}
    renamed = set(old_of.values())
    touched |= {new for new, old in old_of.items() if old in touched}
    order = [p.name for p in (head.policies if head else [])]
    order += [
        p.name
        for p in (base.policies if base else [])
        if p.name not in order and p.name not in renamed
    ]
    rows = []
    for name in order:
        if name not in touched:
            continue
        b = base.policy(old_of.get(name, name)) if base else None
        h = head.policy(name) if head else None
        rows.append(
            EnvelopeRow(
                name,
                figures(base, b) if base is not None and b is not None and b.envelope else None,
                figures(head, h) if head is not None and h is not None and h.envelope else None,
            )
        )
    return tuple(rows)
