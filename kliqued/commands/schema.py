"""``kliqued schema``: the JSON Schema of an estate file, generated from the models."""

from __future__ import annotations

import argparse
import sys

from compiler.schema import estate_schema_text
from klique_util.files import write_atomic

from ._common import add_command


def register(subparsers) -> None:
    p = add_command(
        subparsers, "schema", help="print the JSON Schema of estate files",
        description="Prints the JSON Schema that editors use to validate estate files as you "
                    "type (see the yaml-language-server modeline at the top of each file).",
        examples="  kliqued schema -o schemas/estate.schema.json")
    p.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    text = estate_schema_text()
    if args.output:
        write_atomic(args.output, text)
    else:
        sys.stdout.write(text)
    return 0
