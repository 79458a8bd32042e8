"""The advice as Markdown: what the weeks showed, each change tried with its what-if
figures and verdict, who must approve, and the kept changes' patch (a pull request's
body)."""

from __future__ import annotations

from compiler.plan.whatif import Figures, PoolFigures, WhatIf
from kliqued.sim.report import fmt_duration

from .model import Advice, Proposal


def _p95(f: Figures | None) -> str:
    return fmt_duration(f.wait_p95_s) if f is not None else "-"


def _p50(f: Figures | None) -> str:
    return fmt_duration(f.wait_p50_s) if f is not None else "-"


def _util(f: object) -> str:
    if isinstance(f, PoolFigures) and f.utilisation is not None:
        return f"{f.utilisation:.1%}"
    return "-"


def _groups_table(w: WhatIf, after: bool) -> list[str]:
    head = "| group | tasks | wait p50 | wait p95 |"
    if after:
        head = "| group | wait p50 before -> after | wait p95 before -> after |"
    out = [head, "| --- | ---: | ---: |" + ("" if after else " ---: |")]
    for r in w.groups:
        b = r.base if isinstance(r.base, Figures) else None
        h = r.head if isinstance(r.head, Figures) else None
        name = "**all**" if r.name == "all" else r.name
        if after:
            out.append(f"| {name} | {_p50(b)} -> {_p50(h)} | {_p95(b)} -> {_p95(h)} |")
        else:
            out.append(f"| {name} | {b.tasks if b else 0:,} | {_p50(b)} | {_p95(b)} |")
    return out


def _pools_table(w: WhatIf, after: bool) -> list[str]:
    out = [
        "| pool | utilisation" + (" before -> after |" if after else " |"),
        "| --- | ---: |",
    ]
    for r in w.pools:
        cell = f"{_util(r.base)} -> {_util(r.head)}" if after else _util(r.base)
        out.append(f"| {r.name} | {cell} |")
    return out


def _who(p: Proposal) -> str:
    """Each approver once, with the nearest group that makes them one."""
    seen: dict[str, str] = {}
    for a in p.approvers:
        seen.setdefault(
            a.user, f"{a.user} ({'admin of ' if a.role == 'group' else 'above: '}{a.group})"
        )
    return ", ".join(seen.values()) or "IT"


def render_markdown(a: Advice) -> str:
    b = a.baseline
    lines = [
        "# Klique advice",
        "",
        f"Demand: {a.source} ({b.tasks:,} tasks, {b.start} to {b.end_base} replayed); estate "
        f"`{a.estate}`" + (f"; only the subtree of `{a.subtree}`" if a.subtree else "") + ".",
        "Rule: a change is kept when its group's p95 wait (to the first placement) falls, "
        "no other group's rises by more than 10% and no other group is left with tasks "
        "never placed; each is checked by replaying the same demand (`kliqued plan "
        "--what-if`).",
        "",
        "## The weeks as they ran on the estate",
        "",
        *_groups_table(b, after=False),
        "",
        *_pools_table(b, after=False),
        "",
        "## Changes tried",
        "",
    ]
    if not a.proposals:
        lines.append(
            "None: no group waited longer than the threshold on its own limit or budget "
            "while the pools it may use had room (waits on busy pools are capacity's)."
        )
    else:
        lines += [
            "| change | for | why | its p95 wait | worst other p95 | verdict | approvers |",
            "| --- | --- | --- | ---: | ---: | --- | --- |",
        ]
        for p in a.proposals:
            worst = (
                f"{p.worst_other[0]} {p.worst_other[1]:+.0%}" if p.worst_other is not None else "-"
            )
            mark = "**kept**" if p in a.kept else ("helps" if p.accepted else "dropped")
            lines.append(
                f"| {p.change.label} | {p.target} | {p.change.why} | "
                f"{_p95(p.before)} -> {_p95(p.after)} | {worst} | {mark}: {p.verdict} | "
                f"{_who(p)} |"
            )
    if a.together is not None:
        lines += [
            "",
            "## The kept changes together",
            "",
            "Replayed together on the same demand, against the estate as it is (the "
            f"last task ends at {a.together.end_base} as it is, {a.together.end_head} with "
            "the changes: utilisation is over each side's own span, so work that ends "
            "sooner reads as a busier estate):",
            "",
            *_groups_table(a.together, after=True),
            "",
            *_pools_table(a.together, after=True),
        ]
    return "\n".join(lines) + "\n"
