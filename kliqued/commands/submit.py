"""``kliqued submit``: send a task to a compute resource."""

from __future__ import annotations

import argparse
import json

from kliqued.sdk import KliqueError

from ._client import add_client_flags, client, handles_errors, print_json, reason
from ._common import add_command


def register(subparsers) -> None:
    p = add_command(
        subparsers,
        "submit",
        help="send a task to a compute resource",
        description="Sends a task to a compute resource (policy/profile) as you, and prints "
        "its id, its state, its place in line and why it waits. The command comes "
        "after `--`. A retry of the same submission is safe: each carries an "
        "idempotency key. Exit 1 when the server refuses it (the message says "
        "why).",
        examples="  kliqued submit --resource llm-research/h100 --project rlhf -- python train.py\n"
        "  kliqued submit -r climate/batch -p ocean-2040 --gpus 2 -l run=42 -- ./sim.sh\n"
        "  kliqued submit -r vision/standard -p inspection --payload '{\"nb\": true}'\n"
        "  kliqued submit -r vision/standard -p satellite --json -- python eval.py",
    )
    p.add_argument(
        "--resource",
        "-r",
        required=True,
        metavar="POLICY/PROFILE",
        help="the compute resource, e.g. llm-research/h100",
    )
    p.add_argument(
        "--gpus", type=float, metavar="N", help="GPUs, for profiles whose size comes from the task"
    )
    p.add_argument(
        "--project",
        "-p",
        metavar="P",
        help="the project to record the use against (required when the group lists "
        "projects; `kliqued submit` without it names them)",
    )
    p.add_argument(
        "--label", "-l", action="append", default=[], metavar="K=V", help="a label (repeatable)"
    )
    p.add_argument("--payload", metavar="JSON", help="a JSON payload instead of or with a command")
    p.add_argument(
        "--idempotency-key",
        metavar="KEY",
        help="reuse a key to make a retried submission return the first answer",
    )
    p.add_argument("--user", metavar="NAME", help=argparse.SUPPRESS)  # admins, for a user
    p.add_argument(
        "cmd", nargs=argparse.REMAINDER, metavar="-- CMD...", help="the command and its arguments"
    )
    add_client_flags(p)
    p.set_defaults(handler=run)


@handles_errors
def run(args: argparse.Namespace) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    labels = {}
    for item in args.label:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise KliqueError(None, "invalid-request", f"a label is KEY=VALUE, found {item!r}")
        labels[key] = value
    payload = None
    if args.payload is not None:
        try:
            payload = json.loads(args.payload)
        except ValueError as exc:
            raise KliqueError(None, "invalid-request", f"--payload is not JSON: {exc}") from None
    if not cmd and payload is None:
        raise KliqueError(
            None,
            "invalid-request",
            "nothing to run: give a command after `--` (kliqued submit "
            "--resource R -- python train.py) or a --payload",
        )
    task = client(args).submit(
        args.resource,
        command=cmd or None,
        payload=payload,
        gpus=args.gpus,
        project=args.project,
        labels=labels,
        idempotency_key=args.idempotency_key,
        user=args.user,
    )
    if args.json:
        print_json(task)
    else:
        print(describe(task))
    return 0


def describe(task: dict) -> str:
    """`t-01J... queued on llm-research/h100: 3rd in line, waiting: group at limit`."""
    head = f"{task['id']}  {task['state']}  on {task['resource']}"
    if task["state"] == "queued":
        pos = task.get("position")
        lines = [head + (f", position {pos} in line" if pos else "")]
        lines.append(f"waiting: {reason(task.get('waiting_reason'))}")
        return "\n".join(lines)
    if task["state"] == "placed":
        return head + f", placed on pool {task.get('pool')}"
    return head + f", ended: {task.get('end_reason')}"
