"""``kliqued trace``: turn public GPU cluster traces into traces for ``kliqued simulate``."""

from __future__ import annotations

import argparse
import sys

from klique_util.files import write_atomic

from ._common import DEFAULT_ESTATE, add_command

EXIT_OK = 0
EXIT_INVALID = 2


def register(subparsers) -> None:
    p = add_command(
        subparsers,
        "trace",
        help="convert public GPU cluster traces for trace replay",
        description="Tools for traces: CSV files of submissions that `kliqued simulate "
        "--trace` replays on an estate.",
        examples="  kliqued trace convert --from chronus-philly "
        "../shared/traces/chronus-philly/trace_job_Philly_MIX1.csv -o philly.csv\n"
        "  kliqued trace convert --help",
    )
    sub = p.add_subparsers(dest="trace_command", metavar="<subcommand>")
    c = add_command(
        sub,
        "convert",
        help="map a public trace onto the estate's compute resources and users",
        description="Reads a public trace (chronus-philly: the Chronus copy of the Microsoft "
        "Philly trace; alibaba-openb: Alibaba's openb_pod_list) and writes a "
        "trace CSV (id,submit,resource,user,project,gpus,runtime) for the estate. "
        "By default the trace's users (Philly's virtual clusters; for Alibaba, "
        "pods drawn at random with --seed into one trace user per group) go "
        "round-robin to the estate's groups that have a policy and users, sorted "
        "by name; each job goes to the group's compute resource whose profile "
        "fits its GPUs (from_task, else the same fixed size, else the smallest "
        "larger one), and runs as the group's users in turn. Jobs that fit no "
        "profile (0 GPUs without a 0-GPU profile, above the group's limit) are "
        "dropped and counted. --mapping sets trace users' targets explicitly "
        "(docs/simulation.md). Prints a summary; writes the file atomically. "
        "Exit 2 on bad input.",
        examples="  kliqued trace convert --from chronus-philly "
        "../shared/traces/chronus-philly/trace_job_Philly_MIX1.csv -o philly.csv\n"
        "  kliqued trace convert --from alibaba-openb --seed 7 "
        "../shared/traces/alibaba-openb/openb_pod_list_default.csv -o openb.csv\n"
        "  kliqued trace convert --from chronus-philly IN.csv --mapping map.yaml "
        "-o out.csv\n"
        "  kliqued simulate --estate estate --trace philly.csv",
    )
    c.add_argument("input", metavar="IN", help="the public trace's CSV file")
    c.add_argument(
        "--from",
        dest="source",
        required=True,
        choices=["chronus-philly", "alibaba-openb"],
        help="the trace's format",
    )
    c.add_argument(
        "--estate",
        metavar="DIR",
        default=DEFAULT_ESTATE,
        help="the estate to map onto (default: estate)",
    )
    c.add_argument(
        "--mapping",
        metavar="FILE",
        help="YAML: users: {<trace user>: <compute resource> | <group> | "
        "{resource|group: ..., user: ...}}",
    )
    c.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the random assignment of Alibaba pods (default: 1)",
    )
    c.add_argument(
        "-o", "--output", metavar="OUT", required=True, help="where to write the trace CSV"
    )
    c.set_defaults(handler=run_convert)
    p.set_defaults(handler=lambda args: (p.print_help(), EXIT_INVALID)[1])


def run_convert(args: argparse.Namespace, out=None, err=None) -> int:
    from compiler.api import compile_dir
    from compiler.diagnostics import render_all
    from kliqued.sim.convert import DEFAULT_SEED, ConvertError, convert

    out = out or sys.stdout
    err = err or sys.stderr
    result = compile_dir(args.estate)
    if result.estate is None:
        err.write(render_all(result.errors) + "\n")
        err.write(f"{args.estate}: invalid estate, nothing written\n")
        return EXIT_INVALID
    if args.seed is not None and args.source != "alibaba-openb":
        err.write("note: --seed only matters for alibaba-openb (Philly names its users)\n")
    try:
        conv = convert(
            args.source,
            args.input,
            result.estate,
            args.mapping,
            DEFAULT_SEED if args.seed is None else args.seed,
        )
    except ConvertError as exc:
        for d in exc.diagnostics:
            err.write(d.render() + "\n")
        err.write("nothing written\n")
        return EXIT_INVALID
    write_atomic(args.output, conv.csv_text())
    out.write(conv.summary(args.output))
    return EXIT_OK
