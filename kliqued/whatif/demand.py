"""A demand file read for the what-if: a trace CSV (scenarios.md) with the export's
``channel`` and ``status`` columns, optional.

Unlike ``kliqued simulate --trace``, a row an estate cannot take is not an error of the
file: the what-if names it for that side (compare.py). Here only the file itself is
checked (columns, times, durations, sizes), each problem with its line.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass

from compiler.units import parse_time, to_milli
from klique_util.demand import COLUMNS as EXPORT_COLUMNS, STATUSES
from klique_util.units import to_ms
from kliqued.sim.scenario import DEFAULT_START
from kliqued.sim.trace import COLUMNS, is_time, parse_duration_ms, parse_submit

MAX_ERRORS = 20


@dataclass(frozen=True, slots=True)
class DemandTask:
    """One row of a demand file, as read (``line``: its line in the file)."""

    line: int
    id: str
    at: int
    resource: str
    user: str
    project: str | None
    gpus_milli: int | None
    runtime_ms: int
    status: str | None


class DemandError(ValueError):
    """The demand file cannot be read; the message names the file, line and column."""


def read_demand(path: str) -> list[DemandTask]:
    try:
        with open(path, encoding="utf-8-sig", newline="") as fh:
            text = fh.read()
    except OSError as exc:
        raise DemandError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise DemandError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return read_demand_text(text, path)


def read_demand_text(text: str, source: str) -> list[DemandTask]:
    """Rows in submission order; raises DemandError listing the first problems."""
    problems: list[str] = []
    rows: list[DemandTask] = []
    reader = csv.reader(io.StringIO(text))
    try:
        header = next(reader, None)
        if header is None:
            raise DemandError(f"{source}: empty: expected the header {','.join(EXPORT_COLUMNS)}")
        col = {h.strip(): i for i, h in enumerate(header)}
        missing = [c for c in COLUMNS if c not in col]
        if missing:
            raise DemandError(
                f"{source}:1: missing column{'s' if len(missing) > 1 else ''} "
                f"{', '.join(missing)} (a demand file has "
                f"{','.join(EXPORT_COLUMNS)})"
            )
        start: int | None = None
        for row in reader:
            line = reader.line_num
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if start is None:
                # Offsets count from the first row's time when it is absolute (as a trace's).
                sub = row[col["submit"]].strip() if col["submit"] < len(row) else ""
                start = to_ms(parse_time(DEFAULT_START))
                if is_time(sub):
                    try:
                        start = to_ms(parse_time(sub))
                    except ValueError:
                        pass
            try:
                rows.append(_row(row, col, line, start))
            except (ValueError, IndexError) as exc:
                problems.append(f"{source}:{line}: {exc}")
                if len(problems) >= MAX_ERRORS:
                    break
                continue
    except csv.Error as exc:
        raise DemandError(f"{source}: not a CSV file: {exc}") from None
    if problems:
        raise DemandError("\n".join(problems))
    rows.sort(key=lambda r: (r.at, r.line))
    return rows


def _row(row: list[str], col: dict[str, int], line: int, start: int) -> DemandTask:
    def cell(name: str) -> str:
        i = col.get(name)
        if i is None:
            return ""
        if i >= len(row):
            raise ValueError(f"{name}: missing (the row has {len(row)} fields)")
        return row[i].strip()

    tid = cell("id")
    if not tid:
        raise ValueError("id: empty")
    sub = cell("submit")
    try:
        at = parse_submit(sub, start)
    except ValueError as exc:
        raise ValueError(f"submit: unparsable time {sub!r}: {exc}") from None
    try:
        runtime = parse_duration_ms(cell("runtime"))
    except ValueError as exc:
        raise ValueError(f"runtime: unparsable duration {cell('runtime')!r}: {exc}") from None
    gpus_text = cell("gpus")
    try:
        gpus = to_milli(gpus_text, "gpus") if gpus_text else None
    except ValueError as exc:
        raise ValueError(f"gpus: {exc}") from None
    status = cell("status") or None
    if status is not None and status not in STATUSES:
        raise ValueError(f"status: expected one of {', '.join(STATUSES)}, found {status!r}")
    resource, user = cell("resource"), cell("user")
    if not resource or not user:
        raise ValueError("resource and user: both are required")
    return DemandTask(line, tid, at, resource, user, cell("project") or None, gpus, runtime, status)
