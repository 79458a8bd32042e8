"""``kliqued status``: one task in detail, or your tasks as a table."""

from __future__ import annotations

import argparse
import itertools
import json
import shlex

from klique_util.fmt import hours

from ._client import (
    ago,
    add_client_flags,
    client,
    handles_errors,
    num,
    print_json,
    reason,
    table,
    when,
)
from ._common import add_command, positive_int

STATES = ("active", "queued", "placed", "ended", "all")


def register(subparsers) -> None:
    p = add_command(
        subparsers,
        "status",
        help="a task in detail, or your tasks as a table",
        description="With a task id: where the task is (queued with its place in line and "
        "why it waits and its earliest start, placed on which pool, or ended and "
        "why), its preemptions "
        "and its command. Without: the tasks you may see (yours, and your groups' "
        "if you are a group admin), queued and placed ones by default.",
        examples="  kliqued status\n"
        "  kliqued status t-01M8K8MWK70000\n"
        "  kliqued status --state all --resource llm-research/h100\n"
        "  kliqued status --json",
    )
    p.add_argument("id", nargs="?", metavar="ID", help="a task id")
    p.add_argument(
        "--state",
        choices=STATES,
        default="active",
        help="which tasks to list (default: active = queued and placed)",
    )
    p.add_argument("--resource", metavar="POLICY/PROFILE", help="only this compute resource")
    p.add_argument("--user", metavar="NAME", help="only this user's tasks (group admins)")
    p.add_argument(
        "--group",
        metavar="NAME",
        help="only this group's tasks (a department or business unit: its teams')",
    )
    p.add_argument(
        "--limit",
        type=positive_int,
        default=200,
        metavar="N",
        help="list the newest N tasks, newest first (default: 200)",
    )
    add_client_flags(p)
    p.set_defaults(handler=run)


@handles_errors
def run(args: argparse.Namespace) -> int:
    k = client(args)
    if args.id:
        task = k.task(args.id)
        if args.json:
            print_json(task)
        else:
            print(detail(task))
        return 0
    named: dict[str, list[str | None]] = {"active": ["queued", "placed"], "all": [None]}
    states = named.get(args.state, [args.state])
    tasks = []
    for state in states:
        it = k.tasks(
            state=state,
            resource=args.resource,
            user=args.user,
            group=args.group,
            page_size=min(args.limit, 1000),
            newest_first=True,
        )
        tasks += list(itertools.islice(it, args.limit))
    # newest first, as squeue, sacct and the dashboard list them (ids grow with submission)
    tasks.sort(key=lambda t: t["id"], reverse=True)
    tasks = tasks[: args.limit]
    if args.json:
        print_json({"tasks": tasks})
        return 0
    if not tasks:
        print(
            "no tasks"
            + ("" if args.state == "all" else f" ({args.state}); --state all lists ended ones too")
        )
        return 0
    rows = []
    for t in tasks:
        where = (
            f"#{t['position']}"
            if t["state"] == "queued" and t.get("position")
            else t.get("pool") or "-"
        )
        why = reason(t.get("waiting_reason")) if t.get("waiting_reason") else ended(t) or "-"
        start = (t.get("forecast") or {}).get("start_at")
        if start:  # issue 31: the earliest start the estate knows
            why += f" (earliest {start.replace('T', ' ')})"
        rows.append(
            [
                t["id"],
                t["resource"],
                t["user"],
                t["state"],
                where,
                num(t.get("gpus")),
                (t.get("submitted_at") or "-").replace("T", " "),
                why,
            ]
        )
    print(
        table(
            ["ID", "RESOURCE", "USER", "STATE", "WHERE", "GPUS", "SUBMITTED", "REASON"],
            rows,
            right=[5],
        )
    )
    return 0


def ended(t: dict) -> str | None:
    """Why it ended, with who ended it (``end.text``; a server before it: ``end_reason``)."""
    end = t.get("end") or {}
    return end.get("text") or t.get("end_reason")


def detail(t: dict) -> str:
    lines = [
        f"task      {t['id']}",
        f"state     {t['state']}" + (f" ({ended(t)})" if ended(t) else ""),
        f"resource  {t['resource']}  (group {t['group']}, policy {t['policy']}, "
        f"profile {t['profile']})",
        f"user      {t['user']}"
        + (f"  project {t['project']}" if t.get("project") else "")
        + (f"  via {t['channel']}" if t.get("channel") else ""),
        f"gpus      {num(t.get('gpus'))}",
    ]
    if t["state"] == "queued":
        lines.append(f"position  {t.get('position') or '-'}")
        lines.append(f"waiting   {reason(t.get('waiting_reason'))}")
        if t.get("forecast"):
            lines.append(f"earliest  {t['forecast']['text']}")
    if t.get("pool"):
        lines.append(f"pool      {t['pool']}")
    if t["state"] == "placed" and t.get("waiting_reason"):  # no worker took it yet
        lines.append(f"waiting   {reason(t.get('waiting_reason'))}")
    lines.append(f"submitted {when(t.get('submitted_at'))}")
    if t.get("placed_at"):
        lines.append(f"placed    {when(t['placed_at'])}")
    if t.get("ended_at"):
        lines.append(f"ended     {when(t['ended_at'])}")
    if t.get("worker"):  # issue 5: the worker that ran it, its exit, its GPU-hours
        lines.append(
            f"worker    {t['worker']} (attempt {t.get('epoch') or 1})"
            + (f", started {when(t['started_at'])}" if t.get("started_at") else "")
        )
    if t.get("exit_code") is not None or t.get("signal"):
        lines.append(f"exit      {t.get('signal') or t.get('exit_code')}")
    if t.get("gpu_hours") is not None and t["state"] == "ended" or t.get("gpu_hours"):
        lines.append(f"gpu-hours {hours(t['gpu_hours'])}")
    lines += lending_lines(t)
    if t.get("preemptions"):
        lp = t.get("last_preemption") or {}
        lines.append(
            f"preempted {t['preemptions']}x, last {when(lp.get('at'))}: "
            f"{lp.get('text') or lp.get('kind')}"
        )
    if t.get("command"):
        lines.append("command   " + shlex.join(t["command"]))
    if t.get("payload") is not None:
        lines.append(f"payload   {json.dumps(t['payload'], ensure_ascii=False)}")
    if t.get("labels"):
        lines.append("labels    " + ", ".join(f"{k}={v}" for k, v in sorted(t["labels"].items())))
    lines.append(f"revision  {t.get('revision') or '-'}")
    return "\n".join(lines)


def lending_lines(t: dict) -> list[str]:
    """lending.md "What the product shows": a placed task's protection end (borrowed work is
    not taken back before it) and the work a preemption now would lose, and the GPU-hours
    its preemptions have lost so far. Nothing from a server before them."""
    out = []
    if t.get("protected_until"):
        out.append(
            f"protected {when(t['protected_until'])}: not taken back for another group before then"
        )
    lost_now = t.get("lost_work_s")
    so_far = t.get("lost_gpu_hours_so_far")
    if lost_now is not None or so_far:
        parts = []
        if lost_now is not None:
            parts.append(
                f"{ago(float(lost_now))} if preempted now (since its last "
                "checkpoint, else its placement)"
            )
        if so_far is not None:
            parts.append(f"{hours(so_far)} GPU-hours lost by its preemptions so far")
        out.append("lost work " + "; ".join(parts))
    return out
