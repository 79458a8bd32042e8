"""A chargeback statement (:mod:`kliqued.ledger.statement`'s JSON) as CSV or as a printable
HTML page (Jinja2, autoescaped: group, user and project names are data). The page prints
on A4 as it is (print it to PDF from the browser); nothing is computed here, so the CSV, the
page and the API's JSON always show the same numbers."""

from __future__ import annotations

import csv
import io
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape

_ENV = Environment(
    loader=PackageLoader("kliqued.ledger", "templates"),
    autoescape=select_autoescape(["html", "j2"]),
    trim_blocks=True,
    lstrip_blocks=True,
)

CSV_COLUMNS = (
    "group",
    "project",
    "user",
    "gpu_type",
    "per_gpu_hour",
    "price_from",
    "gpu_hours",
    "budget_hours",
    "cost",
)
"""A line's columns after ``kind`` (``line`` for usage, ``reserved_idle``,
``borrowed_split``, ``lent_split``, ``total``)."""


def statement_csv(st: dict[str, Any]) -> str:
    """One row per line item, then a ``total`` row (its ``cost`` is the statement's total);
    the period, group and currency on every row, so a file stands alone in a spreadsheet."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["period", "statement_group", "currency", "kind", *CSV_COLUMNS])
    head = [st["period"], st["path"], st["currency"]]
    for line in st["lines"]:
        kind = "line" if line.get("kind", "usage") == "usage" else line["kind"]
        w.writerow([*head, kind, *("" if line[c] is None else line[c] for c in CSV_COLUMNS)])
    w.writerow(
        [*head, "total", "", "", "", "", "", "", st["gpu_hours"], st["budget_hours"], st["total"]]
    )
    return buf.getvalue()


def statement_html(st: dict[str, Any]) -> str:
    """The printable page."""
    return _ENV.get_template("statement.html.j2").render(st=st)
