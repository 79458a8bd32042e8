"""``kliqued pipeline``: run a pipeline file, see how it stands, cancel it, resume it."""

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
        "pipeline",
        help="run a pipeline of steps (a DAG of tasks)",
        description="A pipeline file (YAML, schemas/pipeline.schema.json) lists steps, each "
        "a task on a compute resource, with the steps it needs, retries, "
        "parameters and values passed on (a step writes KEY=VALUE lines to "
        "the file named by $KLIQUE_OUTPUTS; later steps name them as "
        "${steps.STEP.outputs.KEY}). Steps are sent when the steps they need "
        'finished, as you. See docs/channels.md, "Pipelines".',
        examples="  kliqued pipeline run nightly.yaml --param dataset=imagenet\n"
        "  kliqued pipeline run nightly.yaml --project rlhf\n"
        "  kliqued pipeline status p-01M8K8MWK70000\n"
        "  kliqued pipeline status\n"
        "  kliqued pipeline cancel p-01M8K8MWK70000\n"
        "  kliqued pipeline resume p-01M8K8MWK70000",
    )
    sub = p.add_subparsers(dest="pipeline_cmd", metavar="<run|status|cancel|resume>")
    r = sub.add_parser("run", help="start a pipeline file")
    r.add_argument("file", metavar="FILE")
    r.add_argument("--param", action="append", metavar="KEY=VALUE", help="a parameter (repeatable)")
    r.add_argument(
        "--project",
        metavar="NAME",
        help="the project the steps' use is recorded against, for the steps that name none "
        "(overrides the file's `project`)",
    )
    add_client_flags(r)
    st = sub.add_parser("status", help="a pipeline's steps (without an id: your pipelines)")
    st.add_argument("id", nargs="?", metavar="ID")
    add_client_flags(st)
    c = sub.add_parser("cancel", help="cancel a pipeline and its running steps")
    c.add_argument("id", metavar="ID")
    add_client_flags(c)
    rs = sub.add_parser(
        "resume",
        help="resume a pipeline paused because its token stopped "
        "working (it then runs on your token)",
    )
    rs.add_argument("id", metavar="ID")
    add_client_flags(rs)
    p.set_defaults(handler=run)


def _show(pr: dict) -> None:
    print(
        f"{pr['id']}  {pr['name']}  {pr['state']}" + (f": {pr['text']}" if pr.get("text") else "")
    )
    print(
        table(
            ["STEP", "STATE", "TASK", "TRIES", "NOTE"],
            [
                [
                    s["name"],
                    s["state"],
                    s.get("task") or "-",
                    s["attempts"],
                    s.get("text") or s.get("task_state") or "",
                ]
                for s in pr["steps"]
            ],
        )
    )


@handles_errors
def run(args: argparse.Namespace) -> int:
    cmd = getattr(args, "pipeline_cmd", None)
    if cmd is None:
        print("kliqued pipeline: give run, status, cancel or resume (see --help)", file=sys.stderr)
        return 2
    k = client(args)
    if cmd == "run":
        try:
            pr = k.run_pipeline(args.file, params(args.param), project=args.project)
        except argparse.ArgumentTypeError as exc:
            print(f"kliqued pipeline run: {exc}", file=sys.stderr)
            return 2
        except KliqueError as exc:
            return show_refusal(exc)
    elif cmd == "cancel":
        pr = k.cancel_pipeline(args.id)
    elif cmd == "resume":
        pr = k.resume_pipeline(args.id)
    elif args.id is None:
        items = k.pipelines()
        if args.json:
            print_json({"pipelines": items})
        else:
            print(
                table(
                    ["ID", "NAME", "OWNER", "STATE", "STARTED"],
                    [[x["id"], x["name"], x["owner"], x["state"], x["started_at"]] for x in items],
                )
                if items
                else "no pipelines"
            )
        return 0
    else:
        pr = k.pipeline(args.id)
    if args.json:
        print_json(pr)
    else:
        _show(pr)
    return 0 if cmd != "status" or pr["state"] != "failed" else 1
