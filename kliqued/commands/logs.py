"""``kliqued logs``: a task's log, as its worker uploaded it."""

from __future__ import annotations

import argparse
import sys
import time

from ._client import add_client_flags, client, handles_errors, reason
from ._common import add_command
from .status import ended


def register(subparsers) -> None:
    p = add_command(
        subparsers,
        "logs",
        help="a task's log (its stdout and stderr, from its worker)",
        description="Prints the log of a task: what its command wrote to stdout and stderr, "
        "uploaded by the worker that ran it every few seconds and before its end "
        "is reported. A task that ran more than once (preempted, or its worker "
        "lost) has one log per attempt: all are printed, each under a header, "
        "unless --attempt picks one. --follow keeps printing the latest attempt "
        "until the task ends. Readable by the task's user, its group's admins "
        "and admins. Once the task has ended, why it ended follows on stderr "
        "(stdout stays the task's own output).",
        examples="  kliqued logs t-01M8K8MWK70000\n"
        "  kliqued logs t-01M8K8MWK70000 --follow\n"
        "  kliqued logs t-01M8K8MWK70000 --attempt 1",
    )
    p.add_argument("id", metavar="ID", help="a task id")
    p.add_argument(
        "--attempt",
        type=int,
        metavar="N",
        help="only attempt N (the lease epoch; default: every attempt)",
    )
    p.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="keep printing the latest attempt until the task ends",
    )
    p.add_argument(
        "--interval",
        type=float,
        default=1.0,
        metavar="S",
        help="seconds between reads with --follow (default: 1)",
    )
    add_client_flags(p, json_flag=False)
    p.set_defaults(handler=run)


def _write(data: bytes) -> None:
    sys.stdout.buffer.write(data)
    sys.stdout.flush()


def _ending(task_id: str, task: dict) -> None:
    """The log is followed by why the task ran again and why it ended, on stderr so that
    stdout stays the task's own output: ``==> t-... preempted 1x, last: reclaimed by
    vision`` and ``==> t-... ended: failed: exit code 3: CUDA out of memory``."""
    notes = []
    if task.get("preemptions"):
        last = task.get("last_preemption") or {}
        notes.append(
            f"preempted {task['preemptions']}x, last: {last.get('text') or last.get('kind') or '-'}"
        )
    text = ended(task) if task.get("state") == "ended" else None
    if text:
        notes.append(f"ended: {text}")
    if notes:
        sys.stdout.flush()
        for note in notes:
            print(f"==> {task_id} {note}", file=sys.stderr)


def not_yet(task: dict) -> str | None:
    """Why a task has no log yet, for a task that has not started: ``no log yet: queued
    (waiting: ...)`` or ``no log yet: placed on POOL, not started yet``; None otherwise."""
    state = task.get("state")
    if state == "queued":
        why = task.get("waiting_reason")
        return "no log yet: queued" + (f" ({reason(why)})" if why else "")
    if state == "placed" and not task.get("started_at"):
        return f"no log yet: placed on {task.get('pool') or '-'}, not started yet"
    return None


@handles_errors
def run(args: argparse.Namespace) -> int:
    k = client(args)
    first = k.task_log(args.id, 0, args.attempt)
    epochs = [args.attempt] if args.attempt else (first["epochs"] or [first["epoch"]])
    several = len(epochs) > 1
    offset = 0
    epoch = epochs[-1]
    for e in epochs:
        page = first if e == first["epoch"] else k.task_log(args.id, 0, e)
        if several:
            _write(f"==> {args.id} attempt {e} <==\n".encode())
        _write(page["data"])
        offset = page["next_offset"]
        while page["data"] and page["next_offset"] < page["size"]:
            page = k.task_log(args.id, page["next_offset"], e)
            _write(page["data"])
            offset = page["next_offset"]
        epoch = e
    if not first["size"] and not first["epochs"]:
        note = not_yet(k.task(args.id))
        if note:  # on stderr: stdout stays the task's own output
            print(f"==> {args.id} {note}", file=sys.stderr)
    if not args.follow:
        _ending(args.id, k.task(args.id))
        return 0
    while True:
        task = k.task(args.id)
        page = k.task_log(args.id, offset, epoch)
        _write(page["data"])
        offset = page["next_offset"]
        if page["data"]:
            continue
        latest = task.get("epoch") or epoch
        if latest > epoch and not args.attempt:
            epoch, offset = latest, 0
            _write(f"==> {args.id} attempt {epoch} <==\n".encode())
            continue
        if task["state"] == "ended" and page["complete"]:
            _ending(args.id, task)
            return 0
        time.sleep(args.interval)
