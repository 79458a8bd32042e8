"""``kliqued simulate``: run what-if scenarios on the daemon's engine, in simulated time."""

from __future__ import annotations

import argparse
import sys

from compiler.diagnostics import Diagnostic
from kliqued.engine.periods import format_time

from ._common import add_command

EXIT_OK = 0
EXIT_MISSES = 1
EXIT_INVALID = 2


def register(subparsers) -> None:
    p = add_command(
        subparsers, "simulate", help="run scenarios on the engine and check their expectations",
        description="Runs each scenario file (an estate, a timeline of events and expectations; "
                    "see spec/scenarios.md) on the same compute policy engine the daemon "
                    "runs, in simulated time. Exit 0 when every expectation holds, 1 when "
                    "some do not (each miss is listed with its time, key, expected and "
                    "found), 2 when a scenario is invalid (with its file and line; nothing "
                    "is run).",
        examples="  kliqued simulate ../shared/scenarios/*.yaml\n"
                 "  kliqued simulate --timeline tests/scenarios/reclaim-sparing.yaml\n"
                 "  kliqued simulate -q scenarios/budget-raise.yaml   # only misses and errors")
    p.add_argument("files", nargs="+", metavar="FILE", help="scenario YAML files")
    p.add_argument("--timeline", action="store_true",
                   help="print every decision with its time and reason")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="print only misses and errors")
    p.set_defaults(handler=run)


def _print_diags(diags: list[Diagnostic], out) -> None:
    for d in diags:
        out.write(d.render() + "\n")


def run(args: argparse.Namespace, out=None) -> int:
    from kliqued.sim.runner import simulate
    from kliqued.sim.scenario import ScenarioError, load_scenario

    out = out or sys.stdout
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
                out.write(f"{path}: ok ({sc.name}: {n} expectation"
                          f"{'s' if n != 1 else ''} hold)\n")
            continue
        worst = max(worst, EXIT_MISSES)
        for m in res.misses:
            out.write(f"{path}:{m.line}: at {sc.offset(m.at)} ({format_time(m.at)}): "
                      f"{m.key}: expected {_show(m.expected)}, found {_show(m.found)}\n")
        out.write(f"{path}: {len(res.misses)} of {n} expectations missed ({sc.name})\n")
    return worst


def _show(v: object) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(str(x) for x in v) + "]"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)
