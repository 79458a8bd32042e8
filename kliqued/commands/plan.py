"""``kliqued plan``: what an estate change does, like ``terraform plan``, read from git."""

from __future__ import annotations

import argparse
import functools
import os
import sys

from compiler.compiled import CompiledEstate
from compiler.errors import GitSourceError, LiveStateError
from compiler.plan import make_plan, render_github, render_json, render_markdown, render_text
from compiler.plan.gitsource import normalise_estate_path, open_repo, read_sides
from compiler.plan.live import LiveState, parse_live_state
from compiler.plan.model import Running
from compiler.plan.whatif import WhatIf
from compiler.units import parse_duration, parse_time
from klique_util.files import write_atomic
from klique_util.units import to_ms
from kliqued.sdk import Client, KliqueError
from kliqued.whatif import DemandError, what_if
from kliqued.whatif.demand import DemandTask, read_demand, read_demand_text

from ._client import SEVERAL_URLS, ci_token, urls
from ._common import DEFAULT_ESTATE, add_command

FORMATS = ["text", "markdown", "json", "github"]


def register(subparsers) -> None:
    p = add_command(
        subparsers,
        "plan",
        help="show what an estate change does, before it is merged",
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
        "  kliqued plan --against $KLIQUE_URL --token $PLANNER_TOKEN  # live counts\n"
        "  kliqued plan --against $KLIQUE_URL   # in CI: the job's own ID token, no secret\n"
        "  kliqued plan --what-if demand.csv     # last weeks' work on both sides\n"
        "  kliqued plan --what-if-from $KLIQUE_URL --since 14d --format markdown",
    )
    p.add_argument(
        "--base",
        metavar="REV",
        help="revision to compare with (default: the merge base of HEAD with main, "
        "else origin/main, else master)",
    )
    p.add_argument(
        "--head",
        metavar="REV",
        help="revision to plan (default: the working tree, files as on disk)",
    )
    p.add_argument(
        "--estate-path",
        default=DEFAULT_ESTATE,
        metavar="PATH",
        help="the estate directory, relative to the repository root (default: estate)",
    )
    p.add_argument(
        "--format",
        choices=FORMATS,
        default="text",
        help="text (terminal), markdown (PR comment), json, github (annotations)",
    )
    p.add_argument(
        "--repo",
        metavar="DIR",
        help="the git repository (default: the one containing the current directory)",
    )
    live = p.add_argument_group(
        "against the running system",
        "--against reads the daemon's live counts (GET /v1/plan/state, a role:planner "
        "token), so each change says how many tasks it preempts, cancels or leaves over a "
        "limit",
    )
    live.add_argument(
        "--against",
        metavar="URL",
        action="append",
        help=f"the daemon, e.g. https://klique.example.com:8443; {SEVERAL_URLS}",
    )
    live.add_argument(
        "--token",
        metavar="TOKEN",
        help="a role:planner (or admin) token (default: KLIQUE_TOKEN, else the CI job's own "
        "ID token: KLIQUE_ID_TOKEN, or GitHub Actions' with id-token: write; else the config "
        "context)",
    )
    live.add_argument(
        "--audience",
        metavar="AUD",
        help="the audience a GitHub Actions ID token is asked for: the daemon's "
        "settings.identity.workloads audience (default: KLIQUE_AUDIENCE or klique)",
    )
    live.add_argument(
        "--context", metavar="NAME", help="a context of the client config file for the token"
    )
    wi = p.add_argument_group(
        "what if (real demand replayed on both sides)",
        "replays the work of a window (kliqued demand export) on the base and the head from "
        "the same empty start, on the daemon's engine in simulated time, and compares per "
        "group and per pool: waits, long waits, GPU-hours, utilisation, preemptions, budget "
        "exhaustions, cost; the demand the head cannot take is named",
    )
    src = wi.add_mutually_exclusive_group()
    src.add_argument(
        "--what-if", metavar="DEMAND", help="a demand file (kliqued demand export -o FILE)"
    )
    src.add_argument(
        "--what-if-from",
        metavar="URL",
        action="append",
        help="read the demand from the daemon (GET /v1/demand, a role:planner "
        "token); also tells a stale base, as --against does; "
        f"{SEVERAL_URLS}",
    )
    wi.add_argument(
        "--since",
        metavar="WHEN",
        default=None,
        help="with --what-if-from: the window, a duration back from now or an "
        "RFC 3339 time (default: 14d)",
    )
    wi.add_argument(
        "--wait-threshold",
        metavar="DURATION",
        default="1h",
        help="a task that waited longer than this for its first placement waits long (default: 1h)",
    )
    p.add_argument(
        "--at",
        metavar="TIME",
        help="the plan's time, RFC 3339 UTC (default: now, or the daemon's with "
        "--against): a price that takes effect before it reprices usage "
        "already recorded",
    )
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write the plan here (atomically) instead of to stdout; the exit code is the same",
    )
    p.set_defaults(handler=run)


def _replay(
    rows: list[DemandTask],
    source: str,
    threshold_s: int,
    base: CompiledEstate,
    head: CompiledEstate,
) -> WhatIf:
    return what_if(rows, base, head, source, threshold_s)


def _colour(args: argparse.Namespace) -> bool:
    return (
        args.format == "text"
        and not args.output
        and sys.stdout.isatty()
        and not os.environ.get("NO_COLOR")
    )


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
    c = Client.from_config(
        url=_urls(args.against, "--against"), token=_token(args), context=args.context
    )
    try:
        return parse_live_state(c.plan_state(), c.url)
    except LiveStateError as exc:
        raise LiveStateError(f"{c.url}/v1/plan/state: {exc}") from None


def _token(args: argparse.Namespace) -> str | None:
    return ci_token(args.token, args.audience)


def _urls(values: list[str], flag: str) -> str:
    """The daemons a flag names; a blank one (``--against "$UNSET"``) is an error rather
    than the client config's URL, which the user did not ask for."""
    given = urls(values)
    if given is None:
        raise ValueError(f"{flag}: no URL given")
    return given


def _demand(args: argparse.Namespace) -> tuple[list[DemandTask], str, Running | None]:
    """The demand rows, where they came from, and the revision the daemon runs (read with
    the demand from ``--what-if-from``)."""
    if args.what_if:
        return read_demand(args.what_if), args.what_if, None
    c = Client.from_config(
        url=_urls(args.what_if_from, "--what-if-from"), token=_token(args), context=args.context
    )
    d = c.demand(args.since or "14d")
    running = Running(c.url, d.revision, d.commit) if d.revision else None
    return read_demand_text(d.text, d.source), f"{c.url}, last {args.since or '14d'}", running


def _threshold(text: str) -> int:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise ValueError(f"--wait-threshold: {exc}") from None


def run(args: argparse.Namespace) -> int:
    try:
        estate_path = normalise_estate_path(args.estate_path)
        repo = open_repo(args.repo)
        with repo:
            base, head = read_sides(repo, args.base, args.head, estate_path)
    except GitSourceError as exc:
        print(f"kliqued plan: {exc}", file=sys.stderr)
        return 1
    hook = None
    running = None
    try:
        now_ms = _at(args.at)
        threshold = _threshold(args.wait_threshold)
        if args.since is not None and not args.what_if_from:
            raise ValueError("--since needs --what-if-from (a demand file is already a window)")
        live = _live(args) if args.against else None
        if args.what_if or args.what_if_from:
            rows, source, running = _demand(args)
            hook = functools.partial(_replay, rows, source, threshold)
    except (ValueError, KliqueError, LiveStateError, DemandError) as exc:
        print(f"kliqued plan: {getattr(exc, 'message', exc)}", file=sys.stderr)
        return 1
    if live is not None:
        running = None  # --against's own reading says what runs
    plan = make_plan(base, head, estate_path, now_ms, live, running, hook)
    if args.format == "text":
        text = render_text(plan, colour=_colour(args))
    else:
        text = {"markdown": render_markdown, "json": render_json, "github": render_github}[
            args.format
        ](plan)
    if args.output:
        write_atomic(args.output, text)
        print(f"kliqued plan: wrote {args.output}: {plan.summary_line}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return plan.exit_code
