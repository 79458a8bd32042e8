"""``kliqued schema``: the JSON Schema of an estate file (or, ``--pipeline``, of a pipeline
file), generated from the models."""

from __future__ import annotations

import argparse
import sys

from compiler.schema import estate_schema_text
from klique_util.files import write_atomic
from kliqued.schedule.pipeline import schema_text as pipeline_schema_text

from ._common import add_command


def register(subparsers) -> None:
    p = add_command(
        subparsers,
        "schema",
        help="print the JSON Schema of estate files",
        description="Prints the JSON Schema that editors use to validate estate files as you "
        "type (see the yaml-language-server modeline at the top of each file).",
        examples="  kliqued schema -o schemas/estate.schema.json\n"
        "  kliqued schema --pipeline -o schemas/pipeline.schema.json",
    )
    p.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    p.add_argument(
        "--pipeline",
        action="store_true",
        help="the schema of pipeline files (docs/channels.md) instead",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    text = pipeline_schema_text() if args.pipeline else estate_schema_text()
    if args.output:
        write_atomic(args.output, text)
    else:
        sys.stdout.write(text)
    return 0
