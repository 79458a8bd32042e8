"""Each candidate replayed with the what-if on the same weeks' demand, and kept only if it
helps: its group's p95 wait falls, no other group's p95 wait rises by more than
``MAX_RISE`` (10%), and no other group has tasks it never placed that it placed before.
The base is replayed once (``what_if``'s ``runs``); the kept changes, at most one per
policy value (the one that lowered the wait most), are then replayed together.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from compiler.api import compile_files, read_dir
from compiler.compiled import CompiledEstate
from compiler.plan.approvals import group_chain
from compiler.plan.whatif import Figures, WhatIf
from kliqued.whatif import what_if
from kliqued.whatif.compare import Side
from kliqued.whatif.demand import DemandTask

from .edit import EditError, compiled, edited, patch
from .model import Advice, Approver, Proposal
from .propose import propose

MAX_RISE = 0.10
GRACE_S = 60.0
"""The least p95 wait a rise is measured against (see ``judge``)."""


class AdviseError(ValueError):
    """The estate cannot be read or compiled: the message says where."""


def _row(w: WhatIf, name: str) -> tuple[Figures | None, Figures | None]:
    for r in w.groups:
        if r.name == name:
            b = r.base if isinstance(r.base, Figures) else None
            h = r.head if isinstance(r.head, Figures) else None
            return b, h
    return None, None


def judge(w: WhatIf, target: str) -> tuple[bool, str, tuple[str, float] | None]:
    """The issue's rule on one what-if: kept, why, and the worst rise of another group."""
    before, after = _row(w, target)
    if before is None or after is None or before.wait_p95_s is None:
        return False, f"{target} has no waits to compare", None
    if after.wait_p95_s is None or after.wait_p95_s >= before.wait_p95_s:
        return False, f"{target}'s p95 wait does not fall", None
    worst: tuple[str, float] | None = None
    for r in w.groups:
        if r.name in ("all", target):
            continue
        b, h = r.base, r.head
        if not isinstance(b, Figures) or not isinstance(h, Figures):
            continue
        if h.never_placed > b.never_placed:
            return (
                False,
                f"{r.name} would leave {h.never_placed - b.never_placed} more tasks never placed",
                worst,
            )
        if b.wait_p95_s is not None and h.wait_p95_s is not None:
            # A group that did not wait is measured against a minute: a few seconds more
            # is no harm, an hour is (a fraction of nothing would be infinite).
            rise = (h.wait_p95_s - b.wait_p95_s) / max(b.wait_p95_s, GRACE_S)
            if worst is None or rise > worst[1]:
                worst = (r.name, rise)
    if worst is not None and worst[1] > MAX_RISE:
        return False, f"{worst[0]}'s p95 wait would rise {worst[1]:.0%} (more than 10%)", worst
    return True, f"{target}'s p95 wait falls; no other group's rises more than 10%", worst


def _approvers(estate: CompiledEstate, group: str) -> tuple[Approver, ...]:
    return tuple(Approver(a.user, a.group or "", a.role) for a in group_chain(estate, group))


def advise(
    rows: Sequence[DemandTask],
    estate_dir: str | Path,
    source: str,
    threshold_s: int,
    subtree: str | None = None,
    max_groups: int = 3,
) -> tuple[Advice, str]:
    """The advice on ``rows`` (a demand: the weeks to learn from) for the estate in
    ``estate_dir``; and the patch of the kept changes together ("" when none)."""
    root = Path(estate_dir)
    try:
        files = read_dir(root)
    except Exception as exc:  # the compiler's reader says what is wrong with the path
        raise AdviseError(f"{root}: {exc}") from None
    res = compile_files(files)
    if res.estate is None:
        first = next((d for d in res.diagnostics if d.is_error), None)
        raise AdviseError(f"{root}: the estate does not compile: {first} (kliqued validate)")
    base = res.estate
    groups: set[str] | None = None
    if subtree is not None:
        if base.group(subtree) is None:
            names = ", ".join(sorted(g.name for g in base.groups))
            raise AdviseError(f"--group {subtree}: no such group; the estate has {names}")
        groups = {g.name for g in base.groups if g.name == subtree or subtree in g.ancestors}
    runs: dict[tuple[str, int], Side] = {}
    baseline = what_if(rows, base, base, source, threshold_s, cache=runs)
    proposals: list[Proposal] = []
    for target, change in propose(base, res.sources, baseline, threshold_s, groups, max_groups):
        try:
            new_files = edited(files, [change])
            head = compiled(new_files)
        except EditError as exc:
            proposals.append(Proposal(change, target, None, None, False, str(exc)))
            continue
        w = what_if(rows, base, head, source, threshold_s, cache=runs)
        ok, verdict, worst = judge(w, target)
        before, after = _row(w, target)
        proposals.append(
            Proposal(
                change,
                target,
                before,
                after,
                ok,
                verdict,
                worst,
                w,
                patch(files, new_files, root),
                _approvers(base, change.group),
            )
        )
    chosen = _best_per_value(proposals)
    together: WhatIf | None = None
    text = ""
    if chosen:
        all_files = edited(files, [p.change for p in chosen])
        text = patch(files, all_files, root)
        together = what_if(rows, base, compiled(all_files), source, threshold_s, cache=runs)
    advice = Advice(
        source,
        str(root),
        baseline,
        tuple(proposals),
        subtree,
        tuple(chosen),
        together,
    )
    return advice, text


def _best_per_value(proposals: list[Proposal]) -> list[Proposal]:
    """The kept proposals, one per (policy, field): the one whose target's p95 fell most."""
    best: dict[tuple[str, str], Proposal] = {}
    for p in proposals:
        if not p.accepted or p.after is None or p.after.wait_p95_s is None:
            continue
        key = (p.change.policy, p.change.field)
        cur = best.get(key)
        if cur is None or (
            cur.after is not None and p.after.wait_p95_s < (cur.after.wait_p95_s or 0)
        ):
            best[key] = p
    return list(best.values())
