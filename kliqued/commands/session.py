"""``kliqued session``: interactive servers (JupyterLab, VS Code, a shell) run as tasks and
reached through the control plane."""

from __future__ import annotations

import argparse
import sys

from ._client import add_client_flags, client, handles_errors, print_json, table
from ._common import add_command

KINDS = ("wall", "cpu", "gpu", "network")


def register(subparsers) -> None:
    p = add_command(
        subparsers,
        "session",
        help="interactive servers (jupyter, vscode, shell) as tasks",
        description="A session runs an interactive server as a task on a compute resource, "
        "as you; you reach it through the control plane at its URL (your token, "
        "or the one-time link of `session open` in a browser), never on the "
        "worker directly. The profile's idle limits (set by IT) stop it when "
        "idle; --idle-* may lower them, never raise them. See docs/channels.md, "
        '"Sessions".',
        examples="  kliqued session start --resource team-a/one --app jupyter\n"
        "  kliqued session start --resource team-a/one --app shell --idle-cpu 15m\n"
        "  kliqued session list\n"
        "  kliqued session open t-01M8K8MWK70000\n"
        "  kliqued session stop t-01M8K8MWK70000",
    )
    sub = p.add_subparsers(dest="session_cmd", metavar="<start|list|show|open|stop>")
    s = sub.add_parser("start", help="start a session")
    s.add_argument("--resource", required=True, metavar="POLICY/PROFILE")
    s.add_argument(
        "--app",
        choices=["jupyter", "vscode", "shell"],
        default="jupyter",
        help="the server to run (default: jupyter)",
    )
    s.add_argument("--project", metavar="NAME")
    s.add_argument("--gpus", type=float, metavar="N")
    for kind in KINDS:
        s.add_argument(
            f"--idle-{kind}",
            metavar="DURATION",
            help=f"a lower idle limit `{kind}` than the profile's",
        )
    s.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="-- CMD ...",
        help="your own server instead of the app's (it listens on "
        "127.0.0.1:$KLIQUE_SESSION_PORT under $KLIQUE_SESSION_PREFIX)",
    )
    add_client_flags(s)
    ls = sub.add_parser("list", help="the sessions you may see")
    add_client_flags(ls)
    for name, what in (
        ("show", "one session"),
        ("open", "a one-time link (2 minutes) that opens it in a browser"),
        ("stop", "stop a session (its GPUs are freed)"),
    ):
        c = sub.add_parser(name, help=what)
        c.add_argument("id", metavar="ID")
        add_client_flags(c)
    p.set_defaults(handler=run)


def _row(s: dict) -> list:
    idle = ", ".join(f"{k} {v}" for k, v in s["idle"].items()) or "-"
    return [s["id"], s["user"], s["app"] or "-", s["resource"], s["state"], idle, s["url"]]


HEAD = ["ID", "USER", "APP", "RESOURCE", "STATE", "IDLE LIMITS", "URL"]


@handles_errors
def run(args: argparse.Namespace) -> int:
    cmd = getattr(args, "session_cmd", None)
    if cmd is None:
        print("kliqued session: give start, list, show, open or stop (see --help)", file=sys.stderr)
        return 2
    k = client(args)
    if cmd == "start":
        command = list(args.command or [])
        if command[:1] == ["--"]:
            command = command[1:]
        idle = {kind: v for kind in KINDS if (v := getattr(args, f"idle_{kind}")) is not None}
        s = k.start_session(
            args.resource,
            args.app,
            command=command or None,
            project=args.project,
            gpus=args.gpus,
            idle=idle,
        )
        if args.json:
            print_json(s)
        else:
            limits = ", ".join(f"{k} {v}" for k, v in s["idle"].items()) or "none"
            print(f"{s['id']}  {s['state']}; idle limits: {limits}")
            print(
                f"url: {s['url']} (with your token; in a browser: kliqued session open {s['id']})"
            )
        return 0
    if cmd == "list":
        items = k.sessions()
        if args.json:
            print_json({"sessions": items})
        elif items:
            print(table(HEAD, [_row(s) for s in items]))
        else:
            print("no sessions")
        return 0
    if cmd == "open":
        url = k.session_link(args.id)
        if args.json:
            print_json({"url": url})
        else:
            print(url)
        return 0
    s = k.stop_session(args.id) if cmd == "stop" else k.session(args.id)
    if args.json:
        print_json(s)
    else:
        print(table(HEAD, [_row(s)]))
    return 0
