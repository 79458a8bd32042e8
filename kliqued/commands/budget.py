"""``kliqued budget``: use against reservation, limit and time budget, per policy, as the
organisation's tree (business unit > department > team), with who is waiting."""

from __future__ import annotations

import argparse

from klique_util.fmt import hours, percent
from klique_util.tree import policy_tree

from ._client import add_client_flags, client, handles_errors, num, print_json, table, when
from ._common import add_command


def register(subparsers) -> None:
    p = add_command(
        subparsers,
        "budget",
        help="use, time budget left, burn rate, run-out and waiting work per policy, as a tree",
        description="For each policy you may see, as the organisation's tree (a department's "
        "policy, an envelope, above its teams' policies, indented): GPUs in use "
        "against its reservation and limit; when it has a time budget, the budget "
        "hours used and left in the period, the burn rate (budget hours per hour "
        "at the current placements) and when the budget runs out at that rate; "
        "and the tasks waiting in its subtree. An envelope's figures are its whole "
        "subtree's. With settings.lending.order: fair, each "
        "policy's share (borrowed GPUs / lend_weight) and lend_weight too. "
        "Below the table, each team with waiting work and why its first "
        "task waits (the level that holds it back: the team's own limit, the "
        "department's, a budget, the pools). With a policy name: that policy in "
        "detail, with its alerts and waiting teams, and for an envelope the tree "
        "of its subtree.",
        examples="  kliqued budget                   # every policy you may see, as a tree\n"
        "  kliqued budget digital           # a department: its envelope and teams\n"
        "  kliqued budget customer-ai       # one team in detail\n"
        "  kliqued budget --json",
    )
    p.add_argument("policy", nargs="?", metavar="POLICY", help="one policy in detail")
    add_client_flags(p)
    p.set_defaults(handler=run)


@handles_errors
def run(args: argparse.Namespace) -> int:
    k = client(args)
    if args.policy:
        pol = k.policy(args.policy)
        if args.json:
            print_json(pol)
            return 0
        print(detail(pol))
        if pol.get("envelope"):
            below = [p for p in k.policies() if args.policy in (p.get("levels") or [])[1:]]
            print()
            print(tree_table([pol, *below]))
        return 0
    policies = k.policies()
    if args.json:
        print_json({"policies": policies})
        return 0
    print(tree_table(policies))
    notes = waiting_notes(policies)
    if notes:
        print("\nwaiting")
        print("\n".join(notes))
    return 0


tree = policy_tree
"""The policies in the organisation's tree order (``klique_util.tree``: the dashboard's too)."""


def tree_table(policies: list[dict]) -> str:
    """One row per policy, in tree order; with ``order: fair`` (the policies carry a
    ``share``) two more columns: the share of borrowed GPUs and the ``lend_weight``."""
    fair = any("share" in p for p in policies)
    rows = []
    for depth, p in tree(policies):
        b = p.get("budget")
        name = "  " * depth + p["name"]
        gpus = f"{num(p.get('used'))}/{num(p.get('reservation'))}/{num(p.get('limit'))}"
        lend = [num(p.get("share")), num(p.get("lend_weight"))] if fair else []
        if b:
            rows.append(
                [
                    name,
                    gpus,
                    *lend,
                    f"{hours(b.get('hours'))} h/{b.get('period')}",
                    hours(b.get("used_hours")),
                    hours(b.get("left_hours")),
                    hours(b.get("burn_rate")),
                    short(b.get("runout_at")),
                    waiting(p.get("waiting")),
                ]
            )
        else:
            rows.append([name, gpus, *lend, "none", "-", "-", "-", "-", waiting(p.get("waiting"))])
    lend_head = ["SHARE", "WEIGHT"] if fair else []
    shift = len(lend_head)
    return table(
        [
            "POLICY",
            "GPUS USED/RES/LIMIT",
            *lend_head,
            "BUDGET",
            "USED H",
            "LEFT H",
            "BURN H/H",
            "RUN-OUT",
            "WAITING",
        ],
        rows,
        right=[*range(2, 2 + shift), 3 + shift, 4 + shift, 5 + shift],
    )


def waiting(w: dict | None) -> str:
    """``3 (12 GPUs)``: tasks waiting in the subtree and the GPUs they ask for; ``-``."""
    if not w or not w.get("tasks"):
        return "-"
    return f"{w['tasks']} ({gpus_text(w.get('gpus'))})"


def gpus_text(value: float | None) -> str:
    return f"{num(value)} GPU{'' if value == 1 else 's'}"


def waiting_notes(policies: list[dict]) -> list[str]:
    """One line per team with waiting work (each once, however many levels above it are
    listed): how much, and why its first task waits."""
    seen: dict[str, dict] = {}
    for p in policies:
        for g in (p.get("waiting") or {}).get("groups") or []:
            seen.setdefault(g["group"], g)
    return [f"  {g['group']}: {team_waiting(g)}" for _, g in sorted(seen.items())]


def team_waiting(g: dict) -> str:
    n = g.get("tasks", 0)
    text = f"{n} task{'' if n == 1 else 's'} ({gpus_text(g.get('gpus'))})"
    r = g.get("reason")
    return f"{text}, the first: {r.get('text') or r.get('kind')}" if r else text


def short(text: str | None) -> str:
    return "-" if not text else text.replace("T", " ")[:16] + "Z"


def detail(p: dict) -> str:
    place = f"  (group {p.get('group')}" + (f", {p['path']})" if p.get("path") else ")")
    lines = [f"policy       {p['name']}{place}"]
    if p.get("envelope"):
        shared = p.get("shared_reservation")
        lines.append(
            f"envelope     over {', '.join(p.get('below') or []) or '-'}; "
            + (
                f"shared reservation {num(shared)} (any policy below may use it)"
                if shared
                else "no shared reservation (the policies below reserve all of it)"
            )
        )
    if len(p.get("levels") or []) > 1:
        lines.append(f"counted at   {' > '.join(p['levels'])} (each limit and budget holds)")
    lines.append(
        f"GPUs in use  {num(p.get('used'))} of limit {num(p.get('limit'))}, "
        f"reservation {num(p.get('reservation'))}, borrowed {num(p.get('borrowed'))}"
        + (f"; at most {num(p['user_limit'])} per user" if p.get("user_limit") else "")
    )
    if "share" in p:  # order: fair (lending.md)
        lines.append(
            f"fair share   {num(p['share'])} (borrowed {num(p.get('borrowed'))} / "
            f"lend_weight {num(p.get('lend_weight'))}); idle GPUs go to the "
            f"lowest share first"
        )
    b = p.get("budget")
    if not b:
        lines.append("budget       none (reservation and limit only)")
    else:
        used, total = float(b.get("used_hours") or 0), float(b.get("hours") or 0)
        pct = f" ({percent(used, total)})" if total else ""
        lines += [
            f"budget       {hours(b.get('hours'))} budget hours per {b.get('period')}",
            f"period       from {when(b.get('period_start'))}",
            f"used         {hours(used)} h{pct}",
            f"left         {hours(b.get('left_hours'))} h",
            f"burn rate    {hours(b.get('burn_rate'))} budget hours per hour",
            "runs out     "
            + (when(b["runout_at"]) if b.get("runout_at") else "not at this rate before the reset"),
            f"resets       {when(b.get('resets_at'))}",
        ]
        for a in b.get("alerts") or []:
            lines.append(f"alert        {when(a.get('at'))}: {a.get('text')}")
    w = p.get("waiting")
    if w is not None:
        teams = w.get("groups") or []
        lines.append(
            "waiting      "
            + (
                "nothing"
                if not w.get("tasks")
                else f"{team_waiting({**w, 'reason': None})} in "
                f"{len(teams)} team{'' if len(teams) == 1 else 's'}"
            )
        )
        lines += [f"  {g['group']}: {team_waiting(g)}" for g in teams]
    return "\n".join(lines)
