"""``kliqued demand export``: the work of a window, as a trace ``kliqued plan --what-if``
and ``kliqued simulate --trace`` replay."""

from __future__ import annotations

import argparse
import sys

from klique_util.cli import HelpFormatter

from ._client import add_client_flags, client, handles_errors
from ._common import add_command


def register(subparsers) -> None:
    p = add_command(
        subparsers,
        "demand",
        help="export the demand of a window (what-if input)",
        description="The demand of a window: every task submitted in it, with its submission "
        "time, compute resource, size and the time it was placed (summed over "
        "its attempts), as a trace CSV (docs/gitops.md). For admins and the "
        "read-only planner role.",
        examples="  kliqued demand export --since 14d -o demand.csv\n"
        "  kliqued plan --what-if demand.csv --format markdown",
    )
    sub = p.add_subparsers(dest="demand_command", metavar="<export>")
    p.set_defaults(handler=lambda args: (p.print_help(), 2)[1])
    e = sub.add_parser(
        "export",
        help="write the demand of a window as a trace CSV",
        formatter_class=HelpFormatter,
        description="Columns: id, submit (RFC 3339 UTC), resource, user, project, gpus, "
        "runtime (seconds placed, over every attempt), channel (the principal "
        "that sent it), status (finished, failed, cancelled, running, queued: "
        "for all but finished and failed, runtime is what it ran so far).",
        epilog="examples:\n  kliqued demand export --since 14d -o demand.csv\n"
        "  kliqued demand export --since 2026-11-01T00:00:00Z > demand.csv\n",
    )
    e.add_argument(
        "--since",
        default="14d",
        metavar="WHEN",
        help="a duration back from now (14d, 36h) or an RFC 3339 time (default: 14d)",
    )
    e.add_argument(
        "-o", "--output", metavar="FILE", help="write here (atomically) instead of to stdout"
    )
    add_client_flags(e, json_flag=False)
    e.set_defaults(handler=run_export)


@handles_errors
def run_export(args: argparse.Namespace) -> int:
    k = client(args)
    if args.output:
        d = k.demand_export(args.output, since=args.since)
        print(
            f"wrote {args.output}: {d.tasks:,} tasks since {args.since} "
            f"(revision {d.revision[:19]})",
            file=sys.stderr,
        )
    else:
        sys.stdout.write(k.demand(since=args.since).text)
    return 0
