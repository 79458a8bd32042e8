"""``kliqued resources``: the compute resources I may submit to, and my group's room."""

from __future__ import annotations

import argparse
from typing import Any

from klique_util.fmt import hours

from ._client import add_client_flags, client, handles_errors, num, print_json, table
from ._common import add_command


def register(subparsers) -> None:
    p = add_command(
        subparsers,
        "resources",
        help="what you may submit to: size, weight, pools, room",
        description="The compute resources (policy/profile) you may send work to: GPUs per "
        "task (fixed, or from the task with its default and max), the time weight "
        "its budget is charged at, its pools in order, what is queued and placed; "
        "then each group's room: GPUs used against its reservation and limit, and "
        "its budget left this period. Computed by the server from your token's "
        "groups. --all adds the resources you may see but not submit to (a group "
        "you administer without being one of its users).",
        examples="  kliqued resources\n  kliqued resources --all\n  kliqued resources --json",
    )
    p.add_argument(
        "--all",
        action="store_true",
        help="every compute resource you may see, not only those you may submit to",
    )
    add_client_flags(p)
    p.set_defaults(handler=run)


def size(r: dict[str, Any]) -> str:
    if r.get("gpus") is not None:
        return num(r["gpus"])
    ft = r.get("from_task") or {}
    return f"task ({num(ft.get('default'))}, max {num(ft.get('max'))})"


def room_line(room: dict[str, Any]) -> str:
    line = (
        f"group {room['group']}: {num(room['used'])} GPUs used of reservation "
        f"{num(room['reservation'])}, limit {num(room['limit'])} "
        f"({num(room['free'])} free)"
    )
    b = room.get("budget")
    if b:
        line += f"; budget {hours(b['hours'])} h/{b['period']}, {hours(b['left_hours'])} h left"
    else:
        line += "; no time budget"
    return line


@handles_errors
def run(args: argparse.Namespace) -> int:
    everything = client(args).resources()
    admin_view = not any(r.get("may_submit") for r in everything)
    shown = everything if args.all or admin_view else [r for r in everything if r.get("may_submit")]
    if args.json:
        print_json({"resources": shown})
        return 0
    if not shown:
        print(
            "no compute resources: your token's principal is in no group's users "
            "(kliqued whoami says who it is)"
        )
        return 0
    rows = [
        [
            r["name"],
            size(r),
            num(r.get("time_weight")),
            ", ".join(r.get("pools") or []),
            r.get("queued"),
            r.get("placed"),
        ]
        + (["yes" if r.get("may_submit") else "no"] if args.all else [])
        for r in shown
    ]
    headers = ["RESOURCE", "GPUS", "WEIGHT", "POOLS", "QUEUED", "PLACED"]
    if args.all:
        headers.append("MAY SUBMIT")
    print(table(headers, rows, right=[2, 4, 5]))
    rooms: dict[str, dict[str, Any]] = {}
    for r in shown:
        if r.get("room"):
            rooms.setdefault(r["room"]["group"], r["room"])
    if rooms:
        print()
        for g in sorted(rooms):
            print(room_line(rooms[g]))
    return 0
