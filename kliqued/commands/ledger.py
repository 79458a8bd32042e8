"""``kliqued ledger``: finance's read-only SQL on the usage ledger, and exports."""

from __future__ import annotations

import argparse
import csv
import json
import sys
from datetime import datetime, timezone
from typing import Any

from klique_util.cli import HelpFormatter
from kliqued.sdk import KliqueError

from ._client import add_client_flags, client, handles_errors, print_json, table
from ._common import add_command


def register(subparsers) -> None:
    p = add_command(
        subparsers, "ledger", help="query (read-only SQL) and export the usage ledger",
        description="The usage ledger records every placement interval against the user, "
                    "project and group (with the group's path: business unit, department), "
                    "priced per GPU type (docs/ledger.md). Finance and admins may query it "
                    "with one read-only SELECT, on a consistent snapshot, within a time "
                    "limit, and export intervals as CSV or Parquet; a group admin may too, "
                    "and sees the rows of their groups' subtrees only.",
        examples="  kliqued ledger sql \"SELECT \\\"group\\\", month, round(sum(gpu_hours), 1) "
                 "AS gpu_hours FROM usage_monthly GROUP BY ALL ORDER BY ALL\"\n"
                 "  kliqued ledger sql --csv \"SELECT * FROM usage_priced\" > usage.csv\n"
                 "  kliqued ledger export --from 2026-11-01 --to 2026-12-01 --format parquet "
                 "-o nov.parquet")
    sub = p.add_subparsers(dest="ledger_command", metavar="<sql|export>")
    p.set_defaults(handler=lambda args: (p.print_help(), 2)[1])

    s = sub.add_parser(
        "sql", help="run one read-only SELECT", formatter_class=HelpFormatter,
        description="Runs one SELECT on the ledger's tables and views (ledger, prices, usage, "
                    "usage_priced, usage_by_month, usage_monthly, usage_by_level, "
                    "usage_by_business_unit, usage_by_department, price_periods) and prints "
                    "the rows as a "
                    "table (values as the query returns them), JSON or CSV. Anything but a "
                    "single SELECT on those relations is refused, as are other tables, the "
                    "catalog, file and network functions and functions with side effects; a "
                    "query is stopped 10 s after it reaches the server, and an answer over "
                    "32 MiB is refused. Exit 1 with the reason when it fails.",
        epilog="examples:\n"
               "  kliqued ledger sql \"SELECT \\\"user\\\", round(sum(cost), 2) AS eur FROM "
               "usage_monthly WHERE month = DATE '2026-11-01' GROUP BY ALL ORDER BY eur DESC "
               "LIMIT 10\"\n"
               "  kliqued ledger sql \"SELECT month, business_unit, round(cost, 2) AS eur FROM "
               "usage_by_business_unit ORDER BY ALL\"\n"
               "  kliqued ledger sql --json \"SELECT * FROM prices\"\n")
    s.add_argument("sql", metavar="SELECT", help="the query (quote it)")
    s.add_argument("--limit", type=int, default=10000, metavar="N",
                   help="at most N rows (default: 10000; the server's maximum is 100000)")
    fmt = s.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true", help="print CSV with a header")
    add_client_flags(s, json_flag=False)
    fmt.add_argument("--json", action="store_true", help="print the server's JSON")
    s.set_defaults(handler=run_sql)

    e = sub.add_parser(
        "export", help="export intervals as CSV or Parquet", formatter_class=HelpFormatter,
        description="Writes the ledger intervals that overlap [--from, --to) with their price "
                    "and cost to a file, whole intervals (not clipped to the range). The file "
                    "appears complete or not at all. Parquet is made on this machine from the "
                    "server's CSV.",
        epilog="examples:\n"
               "  kliqued ledger export --from 2026-11-01 --to 2026-12-01 -o nov.csv\n"
               "  kliqued ledger export --from 2026-10-01T00:00:00Z --to 2026-11-01T00:00:00Z "
               "--format parquet -o oct.parquet\n")
    e.add_argument("--from", dest="start", required=True, metavar="TIME",
                   help="start, RFC 3339 UTC or a date (2026-11-01 = midnight UTC)")
    e.add_argument("--to", dest="end", required=True, metavar="TIME",
                   help="end (exclusive), same forms")
    e.add_argument("--format", choices=("csv", "parquet"), default=None,
                   help="csv or parquet (default: from the file's extension, else csv)")
    e.add_argument("-o", "--output", required=True, metavar="FILE", help="the file to write")
    add_client_flags(e, json_flag=False)
    e.set_defaults(handler=run_export)


@handles_errors
def run_sql(args: argparse.Namespace) -> int:
    res = client(args).ledger_sql(args.sql, limit=args.limit)
    if args.json:
        print_json(res)
        return 0
    if args.csv:
        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow(res["columns"])
        w.writerows([["" if v is None else v for v in r] for r in res["rows"]])
    else:
        print(render_table(res))
    n = len(res["rows"])
    more = " (truncated: raise --limit or aggregate)" if res.get("truncated") else ""
    print(f"{n} row{'s' if n != 1 else ''} in {res.get('elapsed_ms', 0):g} ms{more}",
          file=sys.stderr)
    return 0


NUMERIC = ("DECIMAL", "DOUBLE", "FLOAT", "BIGINT", "INTEGER", "HUGEINT", "SMALLINT", "TINYINT",
           "UBIGINT", "UINTEGER", "USMALLINT", "UTINYINT", "UHUGEINT")


def sql_cell(value: Any) -> str:
    """A value as the query returned it: a DOUBLE in Python's shortest exact form (3.49, not
    3.5; 0.0004, not 0), a DECIMAL's exact text as the server sent it, NULL as NULL. Unlike
    the other commands' tables, nothing is rounded for display: the query decides that with
    ``round()``."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return repr(value) if isinstance(value, float) else str(value)


def render_table(res: dict) -> str:
    """The answer of ``POST /v1/ledger/sql`` as a plain-text table, numbers right-aligned."""
    types = res.get("types", [])
    numeric = [i for i, t in enumerate(types) if t.split("(")[0] in NUMERIC]
    return table(res["columns"], [[sql_cell(v) for v in r] for r in res["rows"]],
                 right=numeric)


def parse_when(text: str, flag: str) -> str:
    """An RFC 3339 UTC time or a plain date, as the API's RFC 3339 text."""
    t = text.strip()
    try:
        if len(t) == 10:
            return datetime.strptime(t, "%Y-%m-%d").strftime("%Y-%m-%dT00:00:00Z")
        dt = datetime.fromisoformat(t.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise KliqueError(None, "invalid-request",
                          f"{flag} {text!r} is not a time: write 2026-11-01 or "
                          "2026-11-01T00:00:00Z") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


@handles_errors
def run_export(args: argparse.Namespace) -> int:
    fmt = args.format or ("parquet" if args.output.endswith(".parquet") else "csv")
    start, end = parse_when(args.start, "--from"), parse_when(args.end, "--to")
    path = client(args).ledger_export(start, end, args.output, format=fmt)
    print(f"wrote {path} ({fmt}, intervals overlapping [{start}, {end}))", file=sys.stderr)
    return 0
