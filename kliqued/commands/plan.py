"""``kliqued plan``: what an estate change does, like ``terraform plan``, read from git."""

from __future__ import annotations

import argparse
import os
import sys

from compiler.plan import make_plan, render_github, render_json, render_markdown, render_text
from compiler.errors import GitSourceError, LiveStateError
from compiler.plan.gitsource import normalise_estate_path, open_repo, read_sides
from compiler.plan.live import LiveState, parse_live_state
from compiler.units import parse_time
from klique_util.files import write_atomic
from klique_util.units import to_ms
from kliqued.sdk import Client, KliqueError

from ._common import DEFAULT_ESTATE, add_command

FORMATS = ["text", "markdown", "json", "github"]


def register(subparsers) -> None:
    p = add_command(
        subparsers, "plan", help="show what an estate change does, before it is merged",
        description="Compiles the estate at two git revisions (read from git objects, no "
                    "checkout) and shows what changed, object by object and attribute by "
                    "attribute with file:line, and its impact on work: reservation headroom "
                    "per pool set, compute resources created or removed, budgets, time "
                    "weights, capacity; who must approve each change (the admins of the "
                    "groups it touches and every group above them, IT for pools, profiles, "
                    "prices and settings) and the departments' envelopes before and after. "
                    "Exit 0: no changes; 2: changes; 1: a revision is "
                    "invalid, an impact is an error, or git failed.",
        examples="  kliqued plan                          # working tree vs merge base with main\n"
                 "  kliqued plan --base main --head HEAD  # two commits\n"
                 "  kliqued plan --format markdown -o plan.md   # a pull-request comment\n"
                 "  kliqued plan --format github          # annotations in GitHub Actions\n"
                 "  kliqued plan --repo ../estate-repo --estate-path clusters/estate\n"
                 "  kliqued plan --against $KLIQUE_URL --token $PLANNER_TOKEN  # live counts")
    p.add_argument("--base", metavar="REV",
                   help="revision to compare with (default: the merge base of HEAD with main, "
                        "else origin/main, else master)")
    p.add_argument("--head", metavar="REV",
                   help="revision to plan (default: the working tree, files as on disk)")
    p.add_argument("--estate-path", default=DEFAULT_ESTATE, metavar="PATH",
                   help="the estate directory, relative to the repository root "
                        "(default: estate)")
    p.add_argument("--format", choices=FORMATS, default="text",
                   help="text (terminal), markdown (PR comment), json, github (annotations)")
    p.add_argument("--repo", metavar="DIR",
                   help="the git repository (default: the one containing the current "
                        "directory)")
    live = p.add_argument_group(
        "against the running system",
        "--against reads the daemon's live counts (GET /v1/plan/state, a role:planner "
        "token), so each change says how many tasks it preempts, cancels or leaves over a "
        "limit")
    live.add_argument("--against", metavar="URL",
                      help="the daemon, e.g. https://klique.example.com:8443")
    live.add_argument("--token", metavar="TOKEN",
                      help="a role:planner (or admin) token (default: KLIQUE_TOKEN or the "
                           "config context)")
    live.add_argument("--context", metavar="NAME",
                      help="a context of the client config file for the token")
    p.add_argument("--at", metavar="TIME",
                   help="the plan's time, RFC 3339 UTC (default: now, or the daemon's with "
                        "--against): a price that takes effect before it reprices usage "
                        "already recorded")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="write the plan here (atomically) instead of to stdout; the exit code "
                        "is the same")
    p.set_defaults(handler=run)


def _colour(args: argparse.Namespace) -> bool:
    return (args.format == "text" and not args.output and sys.stdout.isatty()
            and not os.environ.get("NO_COLOR"))


def _at(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return to_ms(parse_time(text))
    except ValueError as exc:
        raise ValueError(f"--at: {exc}") from None


def _live(args: argparse.Namespace) -> LiveState:
    """The daemon's live counts; a missing role or an unreachable daemon fails the plan
    (exit 1) rather than silently planning without them."""
    c = Client.from_config(url=args.against, token=args.token, context=args.context)
    try:
        return parse_live_state(c.plan_state(), c.url)
    except LiveStateError as exc:
        raise LiveStateError(f"{c.url}/v1/plan/state: {exc}") from None


def run(args: argparse.Namespace) -> int:
    try:
        estate_path = normalise_estate_path(args.estate_path)
        repo = open_repo(args.repo)
        with repo:
            base, head = read_sides(repo, args.base, args.head, estate_path)
    except GitSourceError as exc:
        print(f"kliqued plan: {exc}", file=sys.stderr)
        return 1
    try:
        now_ms = _at(args.at)
        live = _live(args) if args.against else None
    except (ValueError, KliqueError, LiveStateError) as exc:
        print(f"kliqued plan: {getattr(exc, 'message', exc)}", file=sys.stderr)
        return 1
    plan = make_plan(base, head, estate_path, now_ms, live)
    if args.format == "text":
        text = render_text(plan, colour=_colour(args))
    else:
        text = {"markdown": render_markdown, "json": render_json,
                "github": render_github}[args.format](plan)
    if args.output:
        write_atomic(args.output, text)
        print(f"kliqued plan: wrote {args.output}: {plan.summary_line}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return plan.exit_code
