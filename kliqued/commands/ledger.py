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
        subparsers,
        "ledger",
        help="query (read-only SQL) and export the usage ledger",
        description="The usage ledger records every placement interval against the user, "
        "project and group (with the group's path: business unit, department), "
        "priced per GPU type (docs/ledger.md). Finance and admins may query it "
        "with one read-only SELECT, on a consistent snapshot, within a time "
        "limit, and export intervals as CSV or Parquet; a group admin may too, "
        "and sees the rows of their groups' subtrees only.",
        examples='  kliqued ledger sql "SELECT \\"group\\", month, round(sum(gpu_hours), 1) '
        'AS gpu_hours FROM usage_monthly GROUP BY ALL ORDER BY ALL"\n'
        '  kliqued ledger sql --csv "SELECT * FROM usage_priced" > usage.csv\n'
        "  kliqued ledger export --from 2026-11-01 --to 2026-12-01 --format parquet "
        "-o nov.parquet",
    )
    sub = p.add_subparsers(dest="ledger_command", metavar="<sql|export|statement|feed|partitions>")
    p.set_defaults(handler=lambda args: (p.print_help(), 2)[1])

    s = sub.add_parser(
        "sql",
        help="run one read-only SELECT",
        formatter_class=HelpFormatter,
        description="Runs one SELECT on the ledger's tables and views (ledger, prices, usage, "
        "usage_priced, usage_by_month, usage_monthly, usage_by_level, "
        "usage_by_business_unit, usage_by_department, price_periods; the cloud, "
        "capacity and idle views of docs/ledger.md) and prints "
        "the rows as a "
        "table (values as the query returns them), JSON or CSV. Anything but a "
        "single SELECT on those relations is refused, as are other tables, the "
        "catalog, file and network functions and functions with side effects; a "
        "query is stopped 10 s after it reaches the server, and an answer over "
        "32 MiB is refused. Exit 1 with the reason when it fails.",
        epilog="examples:\n"
        '  kliqued ledger sql "SELECT \\"user\\", round(sum(cost), 2) AS eur FROM '
        "usage_monthly WHERE month = DATE '2026-11-01' GROUP BY ALL ORDER BY eur DESC "
        'LIMIT 10"\n'
        '  kliqued ledger sql "SELECT month, business_unit, round(cost, 2) AS eur FROM '
        'usage_by_business_unit ORDER BY ALL"\n'
        '  kliqued ledger sql --json "SELECT * FROM prices"\n',
    )
    s.add_argument("sql", metavar="SELECT", help="the query (quote it)")
    s.add_argument(
        "--limit",
        type=int,
        default=10000,
        metavar="N",
        help="at most N rows (default: 10000; the server's maximum is 100000)",
    )
    fmt = s.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true", help="print CSV with a header")
    add_client_flags(s, json_flag=False)
    fmt.add_argument("--json", action="store_true", help="print the server's JSON")
    s.set_defaults(handler=run_sql)

    e = sub.add_parser(
        "export",
        help="export intervals as CSV or Parquet",
        formatter_class=HelpFormatter,
        description="Writes the ledger intervals that overlap [--from, --to) (or the month "
        "--period) with their price and cost to a file, whole intervals (not "
        "clipped to the range). With --format focus, writes one billing period "
        "(--period, a UTC month) as a FOCUS 1.2 cost and usage dataset: one row "
        "per interval's piece in that month (docs/ledger.md). The file appears "
        "complete or not at all. Parquet is made on this machine from the "
        "server's CSV.",
        epilog="examples:\n"
        "  kliqued ledger export --from 2026-11-01 --to 2026-12-01 -o nov.csv\n"
        "  kliqued ledger export --from 2026-10-01T00:00:00Z --to 2026-11-01T00:00:00Z "
        "--format parquet -o oct.parquet\n"
        "  kliqued ledger export --format focus --period 2026-11 -o nov-focus.csv\n"
        "  kliqued ledger export --format focus --period 2026-11 -o nov-focus.parquet\n",
    )
    e.add_argument(
        "--from",
        dest="start",
        metavar="TIME",
        help="start, RFC 3339 UTC or a date (2026-11-01 = midnight UTC)",
    )
    e.add_argument("--to", dest="end", metavar="TIME", help="end (exclusive), same forms")
    e.add_argument(
        "--period",
        metavar="YYYY-MM",
        help="a UTC month, instead of --from and --to (required for focus)",
    )
    e.add_argument(
        "--format",
        choices=("csv", "parquet", "focus"),
        default=None,
        help="csv, parquet or focus (default: from the file's extension, else "
        "csv); focus is written as Parquet when the file ends in .parquet",
    )
    e.add_argument("-o", "--output", required=True, metavar="FILE", help="the file to write")
    add_client_flags(e, json_flag=False)
    e.set_defaults(handler=run_export)

    st = sub.add_parser(
        "statement",
        help="a group's chargeback statement for a month",
        formatter_class=HelpFormatter,
        description="The chargeback statement of a group's subtree (a team, a department or a "
        "business unit) for one UTC month: lines by team, project, user, GPU type "
        "and price in force, to the cent, the total and the budgets used. The "
        "lines add up to the total, which is the ledger's exact total rounded half "
        "up to the cent (docs/ledger.md). Printed as a table, or written as CSV "
        "or a printable HTML page (print it to PDF from a browser).",
        epilog="examples:\n"
        "  kliqued ledger statement --group ml --period 2026-11\n"
        "  kliqued ledger statement --group ml --period 2026-11 -o ml-2026-11.html\n"
        "  kliqued ledger statement --group north --period 2026-11 --format csv "
        "-o north.csv\n",
    )
    st.add_argument("--group", required=True, help="a team, department or business unit")
    st.add_argument("--period", required=True, metavar="YYYY-MM", help="the month")
    st.add_argument(
        "--format",
        choices=("table", "csv", "html", "json"),
        default=None,
        help="default: from -o's extension (.csv, .html, .json), else a table",
    )
    st.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write to FILE (whole or not at all) instead of printing",
    )
    add_client_flags(st, json_flag=False)
    st.set_defaults(handler=run_statement)

    fd = sub.add_parser(
        "feed",
        help="pull closed intervals after a cursor (for billing systems)",
        formatter_class=HelpFormatter,
        description="The billing feed: closed intervals in the order they closed, after "
        "--cursor (none: from the start), as CSV on stdout; the cursor to pass "
        "next time is printed on stderr (`cursor: N`). No interval comes twice "
        "and none is missed, across daemon restarts.",
        epilog="examples:\n"
        "  kliqued ledger feed > first.csv\n"
        "  kliqued ledger feed --cursor 1532 --limit 10000 > next.csv\n",
    )
    fd.add_argument("--cursor", default=None, help="the cursor of the previous pull")
    fd.add_argument(
        "--limit",
        type=int,
        default=1000,
        metavar="N",
        help="at most N rows (default 1000, at most 10000)",
    )
    add_client_flags(fd, json_flag=True)
    fd.set_defaults(handler=run_feed)

    pt = sub.add_parser(
        "partitions",
        help="write months as FOCUS Parquet partitions (month=YYYY-MM/)",
        formatter_class=HelpFormatter,
        description="Writes each month from --from to --to (inclusive) as "
        "DIR/month=YYYY-MM/focus.parquet: a FOCUS 1.2 dataset partitioned by "
        "month, which DuckDB (read_parquet('DIR/*/*.parquet', hive_partitioning "
        "= true)), Spark and Trino read as one table. Re-running a month replaces "
        "its file whole (run it daily for the current month).",
        epilog="examples:\n"
        "  kliqued ledger partitions --from 2026-01 --to 2026-11 -o /srv/billing/gpu\n",
    )
    pt.add_argument("--from", dest="start", required=True, metavar="YYYY-MM")
    pt.add_argument("--to", dest="end", required=True, metavar="YYYY-MM")
    pt.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="DIR",
        help="the directory (created with its parents if missing)",
    )
    add_client_flags(pt, json_flag=False)
    pt.set_defaults(handler=run_partitions)


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
    print(
        f"{n} row{'s' if n != 1 else ''} in {res.get('elapsed_ms', 0):g} ms{more}", file=sys.stderr
    )
    return 0


NUMERIC = (
    "DECIMAL",
    "DOUBLE",
    "FLOAT",
    "BIGINT",
    "INTEGER",
    "HUGEINT",
    "SMALLINT",
    "TINYINT",
    "UBIGINT",
    "UINTEGER",
    "USMALLINT",
    "UTINYINT",
    "UHUGEINT",
)


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
    return table(res["columns"], [[sql_cell(v) for v in r] for r in res["rows"]], right=numeric)


def parse_when(text: str, flag: str) -> str:
    """An RFC 3339 UTC time or a plain date, as the API's RFC 3339 text."""
    t = text.strip()
    try:
        if len(t) == 10:
            return datetime.strptime(t, "%Y-%m-%d").strftime("%Y-%m-%dT00:00:00Z")
        dt = datetime.fromisoformat(t.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise KliqueError(
            None,
            "invalid-request",
            f"{flag} {text!r} is not a time: write 2026-11-01 or 2026-11-01T00:00:00Z",
        ) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def month_range(period: str) -> tuple[str, str]:
    """``2026-11`` as the RFC 3339 bounds of that UTC month."""
    from kliqued.ledger.focus import next_month, parse_period

    try:
        first = parse_period(period)
    except ValueError as exc:
        raise KliqueError(None, "invalid-request", f"--period: {exc}") from None
    return f"{first:%Y-%m-%d}T00:00:00.000Z", f"{next_month(first):%Y-%m-%d}T00:00:00.000Z"


@handles_errors
def run_export(args: argparse.Namespace) -> int:
    container = "parquet" if args.output.endswith(".parquet") else "csv"
    fmt = args.format or container
    if fmt == "focus":
        if not args.period or args.start or args.end:
            raise KliqueError(
                None,
                "invalid-request",
                "--format focus exports one billing period: give --period "
                "YYYY-MM (and no --from/--to)",
            )
        month_range(args.period)
        path = client(args).ledger_focus(args.period, args.output, format=container)
        print(
            f"wrote {path} (FOCUS 1.2, {container}, billing period {args.period})", file=sys.stderr
        )
        return 0
    if args.period:
        if args.start or args.end:
            raise KliqueError(None, "invalid-request", "give --period or --from/--to, not both")
        start, end = month_range(args.period)
    elif not (args.start and args.end):
        raise KliqueError(None, "invalid-request", "give --from and --to, or --period YYYY-MM")
    else:
        start, end = parse_when(args.start, "--from"), parse_when(args.end, "--to")
    path = client(args).ledger_export(start, end, args.output, format=fmt)
    print(f"wrote {path} ({fmt}, intervals overlapping [{start}, {end}))", file=sys.stderr)
    return 0


_EXTENSIONS = {".csv": "csv", ".html": "html", ".htm": "html", ".json": "json"}


@handles_errors
def run_statement(args: argparse.Namespace) -> int:
    import os

    from klique_util.files import write_atomic

    fmt = args.format
    if fmt is None:
        ext = os.path.splitext(args.output or "")[1].lower()
        fmt = _EXTENSIONS.get(ext, "table")
    month_range(args.period)
    api_fmt = "json" if fmt == "table" else fmt
    res = client(args).ledger_statement(args.group, args.period, format=api_fmt)
    if fmt == "table":
        text = render_statement(res)
    elif fmt == "json":
        text = json.dumps(res, indent=2, ensure_ascii=False) + "\n"
    else:
        text = res
    if args.output:
        if not os.path.isdir(os.path.dirname(os.path.abspath(args.output))):
            raise KliqueError(
                None,
                "invalid-request",
                f"the directory of {args.output} does not exist: create it first",
            )
        write_atomic(args.output, text.encode("utf-8"), mkdir=False)
        print(
            f"wrote {args.output} (statement of {args.group} for {args.period}, {fmt})",
            file=sys.stderr,
        )
    else:
        sys.stdout.write(text)
    return 0


_SPLIT_NOTE = {"borrowed_split": " (borrowed: half paid by the lenders)"}
"""What follows the project of a line of ``settings.attribution.borrowed: split``."""


LOST_NOTE = {
    "taker": "GPU-hours a reclaim or rebalance threw away (lost work) are credited to the "
    "preempted task's group and billed to the group that took the GPUs back "
    "(settings.attribution.lost_work)",
    "overhead": "GPU-hours a reclaim or rebalance threw away (lost work) are credited to the "
    "preempted task's group and charged to overhead "
    "(settings.attribution.lost_work)",
}


def render_statement(st: dict) -> str:
    """A statement as a terminal table: the lines, then the total and the budgets."""
    notes = {**_SPLIT_NOTE, "lost_work_credit": f" (lost work: {st.get('lost_work')} pays)"}
    rows = [
        [
            x["group"],
            (x["project"] or "(none)") + notes.get(x.get("kind", ""), ""),
            x["user"],
            x["gpu_type"],
            x["per_gpu_hour"] or ("" if x.get("kind") == "reserved_idle" else "no price"),
            x["gpu_hours"],
            x["cost"],
        ]
        for x in st["lines"]
    ]
    rows.append(["total", "", "", "", "", st["gpu_hours"], st["total"]])
    out = [
        f"statement {st['path']}  {st['period']}  ({st['period_start']} to "
        f"{st['period_end']})  {st['currency']}",
        table(
            ["team", "project", "user", "gpu_type", "per_gpu_hour", "gpu_hours", "cost"],
            rows,
            right=[4, 5, 6],
        ),
    ]
    if st["budgets"]:
        out.append(
            table(
                ["budget", "group", "per", "hours", "used", "used %"],
                [
                    [
                        b["policy"],
                        b["group"],
                        b["period"],
                        b["hours"],
                        b["used_hours"],
                        b.get("used_pct", ""),
                    ]
                    for b in st["budgets"]
                ],
                right=[3, 4, 5],
            )
        )
    if st["unpriced_gpu_types"]:
        out.append(f"no price (charged 0): {', '.join(st['unpriced_gpu_types'])}")
    if st.get("borrowed") == "split":
        out.append(
            "borrowed GPU-hours that ran on other groups' idle reserved GPUs are paid "
            "half by the borrower, half by the lenders (settings.attribution.borrowed)"
        )
    if st.get("lost_work") in LOST_NOTE:
        out.append(LOST_NOTE[st["lost_work"]])
    return "\n\n".join(out) + "\n"


@handles_errors
def run_feed(args: argparse.Namespace) -> int:
    res = client(args).ledger_feed(args.cursor, limit=args.limit)
    if args.json:
        print_json(res)
        return 0
    w = csv.writer(sys.stdout, lineterminator="\n")
    w.writerow(res["columns"])
    w.writerows([["" if r[c] is None else r[c] for c in res["columns"]] for r in res["rows"]])
    more = " (more: pull again)" if res["more"] else ""
    print(f"{len(res['rows'])} rows; cursor: {res['cursor']}{more}", file=sys.stderr)
    return 0


def months(start: str, end: str) -> list[str]:
    """Every month from ``start`` to ``end`` inclusive, as ``YYYY-MM``."""
    from kliqued.ledger.focus import next_month, parse_period

    try:
        first, last = parse_period(start), parse_period(end)
    except ValueError as exc:
        raise KliqueError(None, "invalid-request", str(exc)) from None
    if last < first:
        raise KliqueError(None, "invalid-request", f"--to {end} is before --from {start}")
    out = []
    while first <= last:
        out.append(f"{first:%Y-%m}")
        first = next_month(first)
    return out


@handles_errors
def run_partitions(args: argparse.Namespace) -> int:
    for path in client(args).ledger_partitions(months(args.start, args.end), args.output):
        print(f"wrote {path}", file=sys.stderr)
    return 0
