"""``kliqued compile``: the estate as the canonical JSON that the daemon and engine run."""

from __future__ import annotations

import argparse
import sys

from compiler.api import compile_dir
from compiler.compiled import CompiledEstate
from compiler.hierarchy import compiled_demands
from compiler.units import milli_str
from klique_util.files import write_atomic

from ._common import DEFAULT_ESTATE, add_command, print_diagnostics


def register(subparsers) -> None:
    p = add_command(
        subparsers,
        "compile",
        help="compile an estate to canonical JSON",
        description="Validates an estate and writes the compiled estate: defaults applied, "
        "pools_by resolved, compute resources listed, and a content digest as its "
        "revision. The same estate gives the same bytes whatever its file split or "
        "key order. Nothing is written when the estate is invalid.",
        examples="  kliqued compile estate -o compiled.json\n"
        "  kliqued compile --summary        # what the estate holds, in short",
    )
    p.add_argument(
        "estate",
        nargs="?",
        default=DEFAULT_ESTATE,
        metavar="DIR",
        help="estate directory or file (default: estate)",
    )
    p.add_argument("-o", "--output", metavar="FILE", help="write the JSON here (default: stdout)")
    p.add_argument("--strict", action="store_true", help="treat warnings as errors")
    p.add_argument("--summary", action="store_true", help="print a summary instead of JSON")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    result = compile_dir(args.estate)
    if args.strict:
        result = result.strict()
    if result.diagnostics:
        print_diagnostics(result.diagnostics, stream=sys.stderr)
    if result.estate is None:
        print("nothing written: the estate is invalid", file=sys.stderr)
        return 1
    if args.summary:
        print(summary(result.estate))
    if args.output:
        write_atomic(args.output, result.estate.canonical_json())
        print(f"wrote {args.output} ({result.estate.revision})", file=sys.stderr)
    elif not args.summary:
        sys.stdout.write(result.estate.canonical_json())
    return 0


def summary(est: CompiledEstate) -> str:
    """A terminal-sized overview: what IT declared and what users can send work to."""
    lines = [f"revision {est.revision}", ""]
    lines.append(f"pools ({len(est.pools)}):")
    for pool in est.pools:
        cap = milli_str(pool.capacity_milli)
        scale = " (autoscaled max)" if pool.autoscale else ""
        labels = ",".join(f"{k}={v}" for k, v in sorted(pool.labels.items()))
        lines.append(
            f"  {pool.name:<24} {pool.kind:<11} {cap:>6} x {pool.gpu_type}{scale}"
            + (f"  [{labels}]" if labels else "")
        )
    total = sum(pool.capacity_milli for pool in est.pools)
    lines.append(f"  {'total':<24} {'':<11} {milli_str(total):>6} GPUs")
    lines.append("")
    lines.append(f"profiles ({len(est.profiles)}):")
    for prof in est.profiles:
        ft = prof.from_task
        size = (
            milli_str(prof.gpus_milli)
            if prof.gpus_milli is not None
            else f"task ({milli_str(ft.default_milli)}..{milli_str(ft.max_milli)})"
            if ft
            else "?"
        )
        weight = milli_str(prof.time_weight_milli)
        lines.append(
            f"  {prof.name:<24} gpus {size:<12} weight {weight:<5} pools {' > '.join(prof.pools)}"
        )
    lines.append("")
    lines.append(f"policies ({len(est.policies)}):")
    for pol in est.policies:
        budget = (
            f"{milli_str(pol.budget.hours_milli)} h/{pol.budget.period}"
            if pol.budget
            else "no budget"
        )
        envelope = (
            f"  (envelope: {milli_str(pol.shared_reservation_milli)} shared)"
            if pol.envelope
            else ""
        )
        lines.append(
            f"  {pol.name:<24} reservation {milli_str(pol.reservation_milli):>4}  "
            f"limit {milli_str(pol.limit_milli):>4}  {budget}{envelope}"
        )
    # An envelope's reservation holds its teams' reservations: count only its shared part.
    reserved = sum(compiled_demands(est)[0].values())
    lines.append(
        f"  reserved {milli_str(reserved)} of {milli_str(total)} GPUs; "
        f"{milli_str(total - reserved)} unreserved for lending"
    )
    lines.append("")
    lines.append(
        f"compute resources ({len(est.compute_resources)}): "
        + ", ".join(c.name for c in est.compute_resources)
    )
    return "\n".join(lines)
