"""``kliqued cancel``: cancel tasks."""

from __future__ import annotations

import argparse

from kliqued.sdk import KliqueError

from ._client import add_client_flags, client, fail, handles_errors, print_json
from ._common import add_command


def register(subparsers) -> None:
    p = add_command(
        subparsers,
        "cancel",
        help="cancel queued or placed tasks",
        description="Cancels tasks: a queued task leaves its queue, a placed one is stopped "
        "and its GPUs freed. Cancelling a task that already ended changes "
        "nothing. The owner, the group's admins and platform admins may cancel. "
        "Exit 1 if any could not be cancelled.",
        examples="  kliqued cancel t-01M8K8MWK70000\n"
        "  kliqued cancel t-01M8K8MWK70000 --reason 'wrong data set'\n"
        "  kliqued cancel t-01M8K8MWK70000 t-01M8K8MWGH0000 --json",
    )
    p.add_argument("ids", nargs="+", metavar="ID", help="task ids")
    p.add_argument(
        "--reason",
        metavar="TEXT",
        help="why: the task's owner reads it in `kliqued status` and `logs`",
    )
    add_client_flags(p)
    p.set_defaults(handler=run)


@handles_errors
def run(args: argparse.Namespace) -> int:
    k = client(args)
    out, rc = [], 0
    for tid in args.ids:
        try:
            t = k.cancel(tid, args.reason)
        except KliqueError as exc:
            rc = fail(f"{tid}: {exc.message}")
            continue
        out.append(t)
        if not args.json:
            if t.get("end_reason") == "cancelled":
                print(f"{t['id']}  cancelled")
            else:
                print(f"{t['id']}  already ended ({t.get('end_reason')}): nothing to cancel")
    if args.json:
        print_json({"tasks": out})
    return rc
