"""``kliqued checkpoint``: inside a task, mark that its work up to now is saved.

It touches the file the worker names in ``$KLIQUE_CHECKPOINT_FILE`` (klique_util/
taskfiles.py), so it needs no URL, no token and no network; the worker relays the time to
the control plane, where a preemption's lost work then counts from it (docs/lending.md)."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone

from klique_util.taskfiles import NotInTask, checkpoint

from ._common import add_command


def register(subparsers) -> None:
    p = add_command(
        subparsers,
        "checkpoint",
        help="inside a task: mark its work up to now as saved",
        description="Run inside a Klique task's command, right after it saved a checkpoint: "
        "the task's worker tells the control plane, and a preemption from now on "
        "loses only the work done after this moment (settings.lending.victims: "
        "least_lost_work also takes such tasks first). Needs no URL or token: it "
        "touches the file the worker names in $KLIQUE_CHECKPOINT_FILE (a shell "
        'task may `touch "$KLIQUE_CHECKPOINT_FILE"` itself).',
        examples="  python train.py --save ckpt.pt && kliqued checkpoint\n"
        "  torchrun ... # and in train.py: kliqued.sdk.checkpoint()",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        at = checkpoint()
    except NotInTask as exc:
        print(f"kliqued checkpoint: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(
            f"kliqued checkpoint: cannot mark the checkpoint in {exc.filename}: "
            f"{exc.strerror} (the worker's state directory must be writable by the task)",
            file=sys.stderr,
        )
        return 1
    when = datetime.fromtimestamp(at, timezone.utc).isoformat(timespec="milliseconds")
    print(f"checkpoint marked at {when.replace('+00:00', 'Z')}")
    return 0
