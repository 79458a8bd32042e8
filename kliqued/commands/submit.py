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
        "its id, its state, its place in line and why it waits. With --dry-run nothing "
        "is sent: it prints what the engine would do now (placed where and whom it "
        "would take GPUs from, or why it would wait), the budget with it, its cost "
        "per hour and its earliest start. The command comes "
        "after `--`. A retry of the same submission is safe: each carries an "
        "idempotency key. Exit 1 when the server refuses it (the message says "
        "why).",
        examples="  kliqued submit --resource llm-research/h100 --project rlhf -- python train.py\n"
        "  kliqued submit -r climate/batch -p ocean-2040 --gpus 2 -l run=42 -- ./sim.sh\n"
        "  kliqued submit -r vision/standard -p inspection --payload '{\"nb\": true}'\n"
        "  kliqued submit -r vision/standard -p satellite --json -- python eval.py\n"
        "  kliqued submit --dry-run -r llm-research/h100 -p rlhf -- python train.py",
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
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="store nothing: show what the engine would do with the task now",
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
    task_args = dict(
        command=cmd or None,
        payload=payload,
        gpus=args.gpus,
        project=args.project,
        labels=labels,
        user=args.user,
    )
    if args.dry_run:
        answer = client(args).dry_run(args.resource, **task_args)
        if args.json:
            print_json(answer)
        else:
            print(describe_dry_run(answer))
        return 0
    task = client(args).submit(args.resource, **task_args, idempotency_key=args.idempotency_key)
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


def _at(text: str | None) -> str:
    """``2026-12-08T00:00:00Z`` as ``2026-12-08 00:00:00Z``."""
    return (text or "-").replace("T", " ")


def describe_dry_run(a: dict) -> str:
    """What ``--dry-run`` prints: the outcome, then the victims, budgets, cost, forecast."""
    head = f"dry run: {a['resource']} ({a['gpus']} GPUs) as {a['user']}"
    lines = [head + ("" if a.get("settled", True) else "  (a pass is due: may change)")]
    if a["outcome"] == "placed":
        lines.append(f"would be placed now on pool {a['pool']} (phase {a['phase']})")
        for v in a.get("victims") or []:
            who = v.get("task") or f"a task of {v['group']}"
            prot = (
                f"protection ended {_at(v['protected_until'])}"
                if v.get("protected_until")
                else "no protection"
            )
            lines.append(
                f"  would {'reclaim' if v['kind'] == 'reclaimed' else 'rebalance'} {who} "
                f"({v['gpus']} GPUs on {v['pool']}, loses {v['lost_work_s']:g} s of work, {prot})"
            )
    else:
        lines.append(f"would wait: {reason(a.get('waiting_reason'))}")
        lines.append(f"place in line: {a['position']}")
    for b in a.get("budgets") or []:
        lines.append(
            f"budget {b['group']}: {b['left_hours']:g} of {b['hours']:g} h left this "
            f"{b['period']}, {b['burn_rate']:g} -> {b['burn_rate_with']:g} h/h with it, "
            f"runs out {_at(b['runout_with_at']) if b['runout_with_at'] else 'not before the reset'}"
            f"; start check {b['start_check']}"
        )
    if a.get("cost_per_hour") is not None:
        lines.append(f"cost: {a['cost_per_hour']:g} {a['currency']}/h at {a['price_pool']}'s price")
    f = a.get("forecast") or {}
    lines.append(f"earliest start: {f.get('text', '-')}")
    return "\n".join(lines)
