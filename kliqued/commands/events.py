"""``kliqued events``: the audit log, as its reader may see it: what happened to a task and
who did it (submitted, placed, preempted and why, cancelled by whom, ended with which exit)."""

from __future__ import annotations

import argparse
import itertools
from typing import Any

from klique_util.fmt import hours
from klique_util.units import from_milli, unit_hours

from ._client import add_client_flags, client, handles_errors, num, print_json, table
from ._common import add_command


def register(subparsers) -> None:
    p = add_command(
        subparsers,
        "events",
        help="the event log: what happened to a task, and who did it",
        description="The event log, oldest first: submissions, placements, preemptions "
        "(with why), cancellations (with who and why), starts and ends reported "
        "by workers (exit code, signal, message), budget alerts. A user sees the "
        "events of their own tasks, and of their admin groups' tasks and "
        "budget alerts; admins and finance see every event. A task id you may "
        "not see is an error, not an empty log.",
        examples="  kliqued events --task t-01M8K8MWK70000\n"
        "  kliqued events --kind preempted --limit 20\n"
        "  kliqued events --since 1200 --json",
    )
    p.add_argument("--task", metavar="ID", help="only this task's events")
    p.add_argument(
        "--kind",
        metavar="KIND",
        help="only this kind (submitted, placed, preempted, cancelled, leased, "
        "started, stopped, ended, alert, ...)",
    )
    p.add_argument(
        "--since",
        type=int,
        default=0,
        metavar="SEQ",
        help="only events after this sequence number (default: from the start)",
    )
    p.add_argument(
        "--limit", type=int, default=200, metavar="N", help="at most N events (default: 200)"
    )
    add_client_flags(p)
    p.set_defaults(handler=run)


@handles_errors
def run(args: argparse.Namespace) -> int:
    k = client(args)
    limit = max(args.limit, 1)
    events = list(
        itertools.islice(
            k.events(task=args.task, kind=args.kind, since=args.since, page_size=min(limit, 1000)),
            limit,
        )
    )
    if args.json:
        print_json({"events": events})
        return 0
    if not events:
        print("no events" + (f" for {args.task}" if args.task else ""))
        return 0
    rows = [
        [
            e["seq"],
            (e.get("at") or "-").replace("T", " "),
            e["kind"],
            e.get("task") or "-",
            e.get("actor") or "-",
            detail(e),
        ]
        for e in events
    ]
    print(table(["SEQ", "AT", "KIND", "TASK", "ACTOR", "DETAIL"], rows, right=[0]))
    return 0


def detail(e: dict[str, Any]) -> str:
    """One line saying what the event did, from its data."""
    data = e.get("data")
    d: dict[str, Any] = data if isinstance(data, dict) else {}
    kind = e["kind"]
    if kind == "submitted":
        return (
            f"{d.get('resource')}"
            + (f" project {d['project']}" if d.get("project") else "")
            + f" via {d.get('channel') or 'api'}"
        )
    if kind == "placed":
        size = d.get("size_milli")
        n = "" if size is None else num(from_milli(size))
        return f"on {d.get('pool')}" + (f", {n} GPU{'' if n == '1' else 's'}" if n else "")
    if kind in ("preempted", "cancelled"):
        return str(d.get("text") or d.get("kind") or "")
    if kind in ("leased", "started", "stopped", "unleased"):
        parts = [
            f"worker {d.get('worker')}" if d.get("worker") else "",
            f"attempt {d.get('epoch')}" if d.get("epoch") else "",
        ]
        if kind == "stopped":
            parts.append(_exit(d))
        return ", ".join(p for p in parts if p)
    if kind == "ended":
        parts = [str(d.get("reason") or d.get("kind") or ""), _exit(d)]
        if d.get("message"):
            parts.append(str(d["message"]))
        return ": ".join(p for p in parts if p)
    if kind == "alert":
        return str(d.get("text") or "")
    if "text" in d:
        return str(d["text"])
    if d.get("used_units") is not None:
        return f"{hours(unit_hours(d['used_units']))} h"
    return ", ".join(f"{k}={v}" for k, v in sorted(d.items()) if isinstance(v, (str, int, float)))[
        :200
    ]


def _exit(d: dict[str, Any]) -> str:
    if d.get("signal"):
        return f"killed by {d['signal']}"
    if d.get("exit_code") is not None:
        return f"exit code {d['exit_code']}"
    return ""
