"""``kliqued simulate``: run what-if scenarios on the daemon's engine, in simulated time."""

from __future__ import annotations

import argparse
import sys

from compiler.diagnostics import Diagnostic
from kliqued.engine.periods import format_time

from ._common import DEFAULT_ESTATE, add_command

EXIT_OK = 0
EXIT_MISSES = 1
EXIT_INVALID = 2


def register(subparsers) -> None:
    p = add_command(
        subparsers,
        "simulate",
        help="run scenarios on the engine and check their expectations",
        description="Runs each scenario file (an estate, a timeline of events and expectations; "
        "see spec/scenarios.md) on the same compute policy engine the daemon "
        "runs, in simulated time. Exit 0 when every expectation holds, 1 when "
        "some do not (each miss is listed with its time, key, expected and "
        "found), 2 when a scenario is invalid (with its file and line; nothing "
        "is run).\n\n"
        "With --trace, replays a CSV of submissions (id,submit,resource,user,"
        "project,gpus,runtime) on the estate until every task has ended (or "
        "--until), and reports per group and overall: utilisation per pool, wait "
        "p50/p95/max, preemptions by reason, GPU-hours, budget hours and budget "
        "exhaustions. "
        "The whole trace is checked first: a bad row exits 2 with FILE:LINE and "
        "nothing is run.",
        examples="  kliqued simulate ../shared/scenarios/*.yaml\n"
        "  kliqued simulate --timeline tests/scenarios/reclaim-sparing.yaml\n"
        "  kliqued simulate -q scenarios/budget-raise.yaml   # only misses and errors\n"
        "  kliqued simulate --estate estate --trace philly.csv\n"
        "  kliqued simulate --trace philly.csv --json > report.json\n"
        "  kliqued simulate --trace jobs.csv --start 2026-03-02T00:00:00Z",
    )
    p.add_argument("files", nargs="*", metavar="FILE", help="scenario YAML files")
    p.add_argument(
        "--timeline", action="store_true", help="print every decision with its time and reason"
    )
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="print only misses and errors (with --trace: no progress)",
    )
    t = p.add_argument_group("trace replay")
    t.add_argument(
        "--trace", metavar="FILE", help="replay this CSV trace instead of running scenarios"
    )
    t.add_argument(
        "--estate",
        metavar="DIR",
        default=DEFAULT_ESTATE,
        help="the estate the trace runs on (default: estate)",
    )
    t.add_argument("--json", action="store_true", help="print the report as JSON")
    t.add_argument(
        "--start",
        metavar="TIME",
        help="RFC 3339 time that submit offsets count from (default: the first "
        "row's time if it is one, else 2026-01-05T00:00:00Z, a Monday)",
    )
    t.add_argument(
        "--until",
        metavar="TIME",
        help="stop the replay here (an offset such as 30d, or RFC 3339) even if "
        "work is left (default: the last submission + the longest runtime + "
        "31 days)",
    )
    p.set_defaults(handler=run)


def _print_diags(diags: list[Diagnostic], out) -> None:
    for d in diags:
        out.write(d.render() + "\n")


def run(args: argparse.Namespace, out=None, err=None) -> int:
    from kliqued.sim.runner import simulate
    from kliqued.sim.scenario import ScenarioError, load_scenario

    out = out or sys.stdout
    if getattr(args, "trace", None):
        if args.files:
            (err or sys.stderr).write(
                "kliqued simulate: give scenario files or --trace, not both\n"
            )
            return EXIT_INVALID
        return run_trace(args, out, err or sys.stderr)
    if not args.files:
        (err or sys.stderr).write(
            "kliqued simulate: no scenario files given (or use --trace FILE)\n"
        )
        return EXIT_INVALID
    worst = EXIT_OK
    for path in args.files:
        try:
            sc = load_scenario(path)
        except ScenarioError as exc:
            _print_diags(exc.diagnostics, out)
            out.write(f"{path}: invalid scenario, not run\n")
            worst = max(worst, EXIT_INVALID)
            continue
        res = simulate(sc, timeline=args.timeline)
        if args.timeline:
            out.write(f"--- {path} ({sc.name})\n")
            for line in res.timeline:
                out.write(line + "\n")
        n = sum(sum(len(v) for v in x.checks.values()) for x in sc.expectations)
        if res.ok:
            if not args.quiet:
                out.write(f"{path}: ok ({sc.name}: {n} expectation{'s' if n != 1 else ''} hold)\n")
            continue
        worst = max(worst, EXIT_MISSES)
        for m in res.misses:
            out.write(
                f"{path}:{m.line}: at {sc.offset(m.at)} ({format_time(m.at)}): "
                f"{m.key}: expected {_show(m.expected)}, found {_show(m.found)}\n"
            )
        out.write(f"{path}: {len(res.misses)} of {n} expectations missed ({sc.name})\n")
    return worst


def run_trace(args: argparse.Namespace, out, err) -> int:
    """``--trace``: check the whole trace, replay it, print the report."""
    from compiler.api import compile_dir
    from compiler.units import parse_time
    from klique_util.units import to_ms
    from kliqued.sim.trace import TraceError, load_trace, parse_submit, replay

    start = None
    if args.start:
        try:
            start = to_ms(parse_time(args.start))
        except ValueError as exc:
            err.write(f"kliqued simulate: --start: {exc}\n")
            return EXIT_INVALID
    result = compile_dir(args.estate)
    if result.estate is None:
        _print_diags([d for d in result.diagnostics if d.is_error], err)
        err.write(f"{args.estate}: invalid estate, trace not run\n")
        return EXIT_INVALID
    try:
        trace = load_trace(args.trace, result.estate, start)
    except TraceError as exc:
        _print_diags(exc.diagnostics, err)
        more = exc.count - len(exc.diagnostics)
        if more > 0:
            err.write(f"... and {more} more error{'s' if more != 1 else ''}\n")
        err.write(
            f"{args.trace}: invalid trace ({exc.count} error"
            f"{'s' if exc.count != 1 else ''}), not run\n"
        )
        return EXIT_INVALID
    until = None
    if args.until:
        try:
            until = parse_submit(args.until, trace.start)
        except ValueError as exc:
            err.write(f"kliqued simulate: --until: {exc}\n")
            return EXIT_INVALID
    report = replay(trace, result.estate, progress=None if args.quiet else err, until=until)
    out.write(report.to_json() if args.json else report.render_text())
    return EXIT_OK


def _show(v: object) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(str(x) for x in v) + "]"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)
