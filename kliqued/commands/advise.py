"""``kliqued advise``: estate changes that would have shortened the waits of the weeks
behind us, each checked with the what-if on the same demand (issue 31; docs/advisor.md)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys

from klique_util import advice_file

from ._common import add_command

DEFAULT_MAX_GROUPS = 3


def register(subparsers) -> None:
    p = add_command(
        subparsers,
        "advise",
        help="estate changes that would have shortened real waits, checked by what-if",
        description="Replays a window of real demand (a demand file, or the daemon's own "
        "with --against) on the estate, finds the groups whose p95 wait was long "
        "because of their own limit or budget while the pools they may use had "
        "room, proposes changes (a limit, a department's limit, a budget), replays "
        "each on the same demand, and keeps those that lower that group's p95 wait "
        "without raising another group's by more than 10%. Writes a Markdown "
        "report (waits and utilisation before and after, who must approve) and the "
        "kept changes as a patch for the estate's repository (git apply). Exit 0 "
        "with advice or none; 1 when the inputs cannot be read.",
        examples="  kliqued advise --estate estate/ --demand demand.csv\n"
        "  kliqued advise --against $KLIQUE_URL --since 14d --patch advice.patch "
        "-o advice.md\n"
        "  kliqued advise --demand demand.csv --group ai-lab   # a department's subtree\n"
        "  kliqued advise --against $KLIQUE_URL --publish /var/lib/klique   # for the dashboard",
    )
    p.add_argument(
        "--estate",
        default="estate",
        metavar="DIR",
        help="the estate directory to advise on (default: estate)",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--demand", metavar="FILE", help="a demand file (kliqued demand export)")
    src.add_argument(
        "--against",
        metavar="URL",
        help="read the demand from this daemon (GET /v1/demand; admins, planner role)",
    )
    p.add_argument(
        "--since",
        metavar="WHEN",
        help="with --against: the window, a duration back from now or an RFC 3339 time "
        "(default: 14d)",
    )
    p.add_argument(
        "--token",
        metavar="TOKEN",
        help="with --against: a role:planner (or admin) token (default: KLIQUE_TOKEN, else "
        "the CI job's own ID token: KLIQUE_ID_TOKEN, or GitHub Actions' with id-token: "
        "write; else the config context)",
    )
    p.add_argument(
        "--audience",
        metavar="AUD",
        help="the audience a GitHub Actions ID token is asked for: the daemon's "
        "settings.identity.workloads audience (default: KLIQUE_AUDIENCE or klique)",
    )
    p.add_argument("--context", metavar="NAME", help="with --against: a config context")
    p.add_argument(
        "--group",
        metavar="NAME",
        help="advise only on this group's subtree (a department head's view)",
    )
    p.add_argument(
        "--wait-threshold",
        default="1h",
        metavar="DURATION",
        help="groups whose p95 wait is above this are looked at (default: 1h)",
    )
    p.add_argument(
        "--max-groups",
        type=int,
        default=DEFAULT_MAX_GROUPS,
        metavar="N",
        help=f"look at the N longest-waiting groups (default: {DEFAULT_MAX_GROUPS}); each "
        "change costs a replay of the demand",
    )
    p.add_argument("--patch", metavar="FILE", help="write the kept changes' patch here")
    p.add_argument(
        "-o", "--output", metavar="FILE", help="write the report here instead of to stdout"
    )
    p.add_argument("--json", action="store_true", help="print the advice as JSON instead")
    p.add_argument(
        "--publish",
        metavar="DIR",
        help="also write the advice to DIR/advice.json for the dashboard: DIR is the "
        "daemon's directory (where its DuckDB file is); a department head then sees the "
        "advice for their subtree on the Policy page",
    )
    p.set_defaults(handler=run)


def _fail(message: str) -> int:
    print(f"kliqued advise: {message}", file=sys.stderr)
    return 1


def run(args: argparse.Namespace) -> int:
    from compiler.units import parse_duration
    from klique_util.files import write_atomic
    from kliqued.advise import advise, render_markdown
    from kliqued.advise.check import AdviseError
    from kliqued.advise.edit import EditError
    from kliqued.sdk import Client, KliqueError
    from kliqued.whatif import DemandError, read_demand, read_demand_text

    from ._client import ci_token

    if args.since is not None and not args.against:
        return _fail("--since needs --against (a demand file is already a window)")
    if args.max_groups < 1:
        return _fail(f"--max-groups must be at least 1, found {args.max_groups}")
    try:
        threshold = parse_duration(args.wait_threshold)
    except ValueError as exc:
        return _fail(f"--wait-threshold: {exc}")
    try:
        if args.demand:
            rows, source = read_demand(args.demand), args.demand
        else:
            token = ci_token(args.token, args.audience)
            c = Client.from_config(url=args.against, token=token, context=args.context)
            d = c.demand(args.since or "14d")
            rows = read_demand_text(d.text, d.source)
            source = f"{c.url}, last {args.since or '14d'}"
        advice, patch = advise(rows, args.estate, source, threshold, args.group, args.max_groups)
    except (DemandError, AdviseError, EditError) as exc:
        return _fail(str(exc))
    except KliqueError as exc:
        return _fail(exc.message)
    if args.patch:
        write_atomic(args.patch, patch)
        kept = len(advice.kept)
        print(f"kliqued advise: wrote {args.patch}: {kept} change(s)", file=sys.stderr)
    report = render_markdown(advice)
    if args.publish:
        if not os.path.isdir(args.publish):
            return _fail(
                f"--publish {args.publish}: no such directory (the daemon's directory, "
                "where its DuckDB file is)"
            )
        path = os.path.join(args.publish, advice_file.FILE)
        write_atomic(path, advice_file.dumps(published(advice, report, patch)))
        print(f"kliqued advise: published {path}", file=sys.stderr)
    if args.json:
        text = json.dumps(_json(advice), indent=2) + "\n"
    else:
        text = report
    if args.output:
        write_atomic(args.output, text)
        print(f"kliqued advise: wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _json(advice) -> dict:
    def fig(f) -> dict | None:
        return None if f is None else f.to_json()

    return {
        "source": advice.source,
        "estate": advice.estate,
        "subtree": advice.subtree,
        "proposals": [
            {
                "change": {
                    "policy": p.change.policy,
                    "field": p.change.field,
                    "before": p.change.before,
                    "after": p.change.after,
                    "file": p.change.file,
                    "line": p.change.line,
                    "why": p.change.why,
                },
                "for": p.target,
                "before": fig(p.before),
                "after": fig(p.after),
                "accepted": p.accepted,
                "kept": p in advice.kept,
                "verdict": p.verdict,
                "approvers": [a.user for a in p.approvers],
                "patch": p.patch,
            }
            for p in advice.proposals
        ],
    }


def published(advice, report: str, patch: str) -> advice_file.PublishedAdvice:
    """The advice as the dashboard reads it (klique_util/advice_file.py)."""

    def p95(f) -> float | None:
        return None if f is None else f.wait_p95_s

    changes = tuple(
        advice_file.PublishedChange(
            policy=p.change.policy,
            group=p.change.group,
            target=p.target,
            label=p.change.label,
            why=p.change.why,
            status="kept" if p in advice.kept else ("helps" if p.accepted else "dropped"),
            verdict=p.verdict,
            p95_before_s=p95(p.before),
            p95_after_s=p95(p.after),
            worst_other=None
            if p.worst_other is None
            else f"{p.worst_other[0]} {p.worst_other[1]:+.0%}",
            approvers=tuple(dict.fromkeys(a.user for a in p.approvers)),
        )
        for p in advice.proposals
    )
    now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    return advice_file.PublishedAdvice(
        generated_at=now,
        source=advice.source,
        estate=str(advice.estate),
        subtree=advice.subtree,
        changes=changes,
        report=report,
        patch=patch,
    )
