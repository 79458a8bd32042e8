"""``kliqued queue``: the queue of a compute resource, in order."""

from __future__ import annotations

import argparse

from ._client import add_client_flags, client, handles_errors, num, print_json, reason, table
from ._common import add_command


def register(subparsers) -> None:
    p = add_command(
        subparsers,
        "queue",
        help="the queue of a compute resource, in order",
        description="The tasks waiting in a compute resource, first in line first, with who "
        "sent them, their size and why each waits. Users of the resource's group "
        "and its admins may look.",
        examples="  kliqued queue llm-research/h100-8x\n  kliqued queue vision/standard --json",
    )
    p.add_argument("resource", metavar="POLICY/PROFILE", help="the compute resource")
    add_client_flags(p)
    p.set_defaults(handler=run)


@handles_errors
def run(args: argparse.Namespace) -> int:
    q = client(args).queue(args.resource)
    if args.json:
        print_json(q)
        return 0
    items = q.get("queue", [])
    if not items:
        print(f"{q.get('resource', args.resource)}: nothing waiting")
        return 0
    total = q.get("queued", len(items))
    shown = f", the first {len(items)} shown" if total > len(items) else ""
    print(f"{q.get('resource', args.resource)}: {total} waiting{shown}")
    print(
        table(
            ["POS", "ID", "USER", "GPUS", "SUBMITTED", "WAITING"],
            [
                [
                    i.get("position"),
                    i["id"],
                    i.get("user"),
                    num(i.get("gpus")),
                    (i.get("submitted_at") or "-").replace("T", " "),
                    reason(i.get("waiting_reason")),
                ]
                for i in items
            ],
            right=[0, 3],
        )
    )
    return 0
