"""``kliqued budget``: use against reservation, limit and time budget, per policy."""

from __future__ import annotations

import argparse

from klique_util.fmt import hours, percent

from ._client import add_client_flags, client, handles_errors, num, print_json, table, when
from ._common import add_command


def register(subparsers) -> None:
    p = add_command(
        subparsers, "budget", help="use, time budget left, burn rate and run-out per policy",
        description="For each policy you may see: GPUs in use against its reservation and "
                    "limit, and, when it has a time budget, the budget hours used and left in "
                    "the period, the burn rate (budget hours per hour at the current "
                    "placements), when the budget runs out at that rate and when it resets. "
                    "With a policy name: that policy in detail, with its alerts.",
        examples="  kliqued budget\n"
                 "  kliqued budget llm-research\n"
                 "  kliqued budget --json")
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
        else:
            print(detail(pol))
        return 0
    policies = k.policies()
    if args.json:
        print_json({"policies": policies})
        return 0
    rows = []
    for p in policies:
        b = p.get("budget")
        gpus = f"{num(p.get('used'))}/{num(p.get('reservation'))}/{num(p.get('limit'))}"
        if b:
            rows.append([p["name"], p.get("group"), gpus,
                         f"{hours(b.get('hours'))} h/{b.get('period')}",
                         hours(b.get("used_hours")), hours(b.get("left_hours")),
                         hours(b.get("burn_rate")),
                         short(b.get("runout_at")), short(b.get("resets_at"))])
        else:
            rows.append([p["name"], p.get("group"), gpus, "none", "-", "-", "-", "-", "-"])
    print(table(["POLICY", "GROUP", "GPUS USED/RES/LIMIT", "BUDGET", "USED H", "LEFT H",
                 "BURN H/H", "RUN-OUT", "RESETS"], rows, right=[4, 5, 6]))
    return 0


def short(text: str | None) -> str:
    return "-" if not text else text.replace("T", " ")[:16] + "Z"


def detail(p: dict) -> str:
    lines = [f"policy       {p['name']}  (group {p.get('group')})",
             f"GPUs in use  {num(p.get('used'))} of limit {num(p.get('limit'))}, reservation "
             f"{num(p.get('reservation'))}, borrowed {num(p.get('borrowed'))}"]
    b = p.get("budget")
    if not b:
        lines.append("budget       none (reservation and limit only)")
        return "\n".join(lines)
    used, total = float(b.get("used_hours") or 0), float(b.get("hours") or 0)
    pct = f" ({percent(used, total)})" if total else ""
    lines += [f"budget       {hours(b.get('hours'))} budget hours per {b.get('period')}",
              f"period       from {when(b.get('period_start'))}",
              f"used         {hours(used)} h{pct}",
              f"left         {hours(b.get('left_hours'))} h",
              f"burn rate    {hours(b.get('burn_rate'))} budget hours per hour",
              "runs out     " + (when(b["runout_at"]) if b.get("runout_at")
                                   else "not at this rate before the reset"),
              f"resets       {when(b.get('resets_at'))}"]
    for a in b.get("alerts") or []:
        lines.append(f"alert        {when(a.get('at'))}: {a.get('text')}")
    return "\n".join(lines)
