"""``kliqued schedule``: cron schedules that run a command or a pipeline as their owner."""

from __future__ import annotations

import argparse
import sys

from kliqued.sdk import KliqueError

from ._client import add_client_flags, client, handles_errors, print_json, table
from ._common import add_command
from ._unattended import params, show_refusal


def register(subparsers) -> None:
    p = add_command(
        subparsers,
        "schedule",
        help="run a command or a pipeline on a cron schedule",
        description="A schedule sends its command to a compute resource (or runs a pipeline "
        "file) at each time of a standard 5-field cron expression, as the user "
        "who made it: their identity, their access checked at each run. A run "
        "while the previous one still runs is allowed, skipped (forbid) or "
        "replaces it (replace). Due times the daemon was down for run once "
        "(run-once, within --deadline) or not at all (skip). See "
        'docs/channels.md, "Schedules".',
        examples="  kliqued schedule create --cron '0 2 * * *' --resource team-a/one -- "
        "python train.py\n"
        "  kliqued schedule create --cron '30 6 * * 1-5' --timezone Europe/Paris "
        "--concurrency forbid --resource team-a/one -- ./report.sh\n"
        "  kliqued schedule create --cron '0 3 * * *' --pipeline nightly.yaml "
        "--param dataset=imagenet\n"
        "  kliqued schedule list\n"
        "  kliqued schedule show s-01M8K8MWK70000\n"
        "  kliqued schedule pause s-01M8K8MWK70000",
    )
    sub = p.add_subparsers(dest="schedule_cmd", metavar="<create|list|show|pause|resume|delete>")
    c = sub.add_parser("create", help="create a schedule (the command after --)")
    c.add_argument(
        "--cron",
        required=True,
        metavar="EXPR",
        help="5 fields: minute hour day-of-month month day-of-week",
    )
    c.add_argument(
        "--timezone",
        default="UTC",
        metavar="TZ",
        help="the IANA zone the cron is read in (default: UTC)",
    )
    c.add_argument(
        "--resource", metavar="POLICY/PROFILE", help="the compute resource the command runs on"
    )
    c.add_argument("--pipeline", metavar="FILE", help="run this pipeline file instead")
    c.add_argument(
        "--param", action="append", metavar="KEY=VALUE", help="a pipeline parameter (repeatable)"
    )
    c.add_argument(
        "--concurrency",
        choices=["allow", "forbid", "replace"],
        default="allow",
        help="a run while the previous still runs (default: allow)",
    )
    c.add_argument(
        "--missed",
        choices=["run-once", "skip"],
        default="run-once",
        help="due times the daemon was down for (default: run-once)",
    )
    c.add_argument(
        "--deadline",
        metavar="DURATION",
        help="run-once: how late a missed run may still start, e.g. 2h (default: any)",
    )
    c.add_argument("--name", help="a note")
    c.add_argument(
        "--project",
        metavar="NAME",
        help="the project the use is recorded against (a pipeline: for its steps naming none)",
    )
    c.add_argument("--gpus", type=float, metavar="N")
    c.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...")
    add_client_flags(c)
    ls = sub.add_parser("list", help="the schedules you may see")
    add_client_flags(ls)
    for name, what in (
        ("show", "a schedule with its next and last runs"),
        ("pause", "no run until resumed"),
        ("resume", "run again from the next due time"),
        ("delete", "delete a schedule (its running tasks go on)"),
    ):
        s = sub.add_parser(name, help=what)
        s.add_argument("id", metavar="ID")
        add_client_flags(s)
    p.set_defaults(handler=run)


def _line(s: dict) -> list:
    what = (
        f"pipeline {s['pipeline']['name']}"
        if s.get("pipeline")
        else f"{s['resource']}: {' '.join(s.get('command') or [])}"
    )
    nxt = s["next_runs"][0] if s["next_runs"] else "-"
    state = s["state"] + (f" ({s['reason']})" if s.get("reason") else "")
    return [s["id"], s["owner"], f"{s['cron']} {s['timezone']}", state, nxt, what]


def _show(s: dict) -> None:
    print(table(["ID", "OWNER", "CRON", "STATE", "NEXT", "RUNS"], [_line(s)]))
    print(
        f"concurrency: {s['concurrency']}  missed: {s['missed']}"
        + (f" (deadline {s['deadline_s']} s)" if s.get("deadline_s") else "")
    )
    if s["next_runs"]:
        print("next runs: " + ", ".join(s["next_runs"]))
    if s["last_runs"]:
        print("last runs:")
        print(
            table(
                ["DUE", "OUTCOME", "TASK", "NOW", "NOTE"],
                [
                    [
                        r["due"],
                        r["outcome"],
                        r.get("task") or r.get("pipeline") or "-",
                        r.get("state") or "-",
                        r.get("text") or "",
                    ]
                    for r in s["last_runs"]
                ],
            )
        )


@handles_errors
def run(args: argparse.Namespace) -> int:
    cmd = getattr(args, "schedule_cmd", None)
    if cmd is None:
        print(
            "kliqued schedule: give create, list, show, pause, resume or delete (see --help)",
            file=sys.stderr,
        )
        return 2
    k = client(args)
    if cmd == "create":
        command = list(args.command or [])
        if command[:1] == ["--"]:
            command = command[1:]
        if bool(args.pipeline) == bool(command):
            print(
                "kliqued schedule create: give a command after -- (with --resource), or "
                "--pipeline FILE",
                file=sys.stderr,
            )
            return 2
        if command and not args.resource:
            print(
                "kliqued schedule create: --resource POLICY/PROFILE is required with a command",
                file=sys.stderr,
            )
            return 2
        try:
            s = k.create_schedule(
                args.cron,
                args.resource,
                command or None,
                pipeline=args.pipeline,
                params=params(args.param),
                timezone=args.timezone,
                concurrency=args.concurrency,
                missed=args.missed,
                deadline=args.deadline,
                name=args.name,
                project=args.project,
                gpus=args.gpus,
            )
        except argparse.ArgumentTypeError as exc:
            print(f"kliqued schedule create: {exc}", file=sys.stderr)
            return 2
        except KliqueError as exc:
            return show_refusal(exc)
        if args.json:
            print_json(s)
        else:
            print(f"{s['id']}  created; next run {s['next_runs'][0] if s['next_runs'] else '-'}")
        return 0
    if cmd == "list":
        items = k.schedules()
        if args.json:
            print_json({"schedules": items})
        elif items:
            print(
                table(["ID", "OWNER", "CRON", "STATE", "NEXT", "RUNS"], [_line(s) for s in items])
            )
        else:
            print("no schedules")
        return 0
    if cmd == "delete":
        k.delete_schedule(args.id)
        if args.json:
            print_json({"id": args.id, "deleted": True})
        else:
            print(f"{args.id}  deleted")
        return 0
    s = {"show": k.schedule, "pause": k.pause_schedule, "resume": k.resume_schedule}[cmd](args.id)
    if args.json:
        print_json(s)
    elif cmd == "show":
        _show(s)
    else:
        print(f"{s['id']}  {s['state']}")
    return 0
