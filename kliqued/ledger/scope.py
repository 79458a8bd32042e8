"""A group admin's part of the ledger: the rows whose recorded group path passes through a
group they administer (their subtree, as it was when each interval opened), and nothing else,
whatever the query.

The server does not try to see which rows a query asks for: a subquery, a join, a UNION or an
aggregate could always reach around such a check. It changes what the names mean instead.
The query runs inside a WITH clause that defines every relation ledger SQL may name
(:data:`kliqued.ledger.sandbox.RELATIONS`) and the internal tables the views read, with the
schema's own view definitions over the filtered rows. So ``ledger``, ``usage_monthly``,
``usage_by_level``... name the principal's rows only, in the query and inside the views'
bodies alike. A qualified name (``main.ledger``) would name the real table past the WITH: the
sandbox refuses those for a scoped query (``check_tree(..., qualified=False)``), and the plan
check still allows only the ledger's tables.
"""

from __future__ import annotations

import re
from typing import Sequence

from .schema import VIEW_ORDER, VIEWS

FILTERED = ("ledger", "ledger_monthly", "ledger_monthly_pending", "reservations", "preemptions")
"""The tables that hold group rows: each is replaced by its visible rows (``preemptions``:
by the preempted task's group, whoever took the GPUs)."""

HIDDEN = ("cloud_nodes",)
"""Tables of no group (the pools' cloud nodes): empty for a group admin."""

DERIVED = ("lending_pieces",)
"""Views derived from every group's rows at once (who lent to whom: kliqued.ledger.lending):
computed over the whole ledger, then only the visible rows kept, so an admin's team shows
what it lent to teams they cannot see (and nothing of those teams)."""

COVERED = frozenset({*FILTERED, *HIDDEN, "prices", "capacity", *VIEW_ORDER})
"""Every relation a scoped query reads: the filtered tables, the hidden ones (empty), the
prices and the pools' capacity (the same for everyone: the estate's), and the views rebuilt
on them."""


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def visible(alias: str, groups: Sequence[str]) -> str:
    """SQL true for a row (``alias``) whose ``group_path`` has one of ``groups`` at any level:
    the row belongs to their subtrees. A row with no recorded path (NULL, or '' in the
    monthly aggregate) is in no subtree."""
    names = ", ".join(_literal(g) for g in sorted(set(groups)))
    return f"list_has_any(string_split({alias}.group_path, '/'), [{names}]::VARCHAR[])"


def scoped(query: str, groups: Sequence[str] | None, pieces: str | None = None) -> str:
    """``query`` (one SELECT, already checked by the sandbox with ``qualified=False``) as it
    runs for an admin of ``groups``: every ledger relation it may name stands for the rows of
    their subtrees only. Its columns and row order are the query's own (DuckDB keeps a
    subquery's order through ``SELECT *``); a duplicated column name gets a suffix.
    ``pieces``: the lending pieces to derive from instead of the whole ledger's (a month's,
    :func:`kliqued.ledger.lending.month_pieces`: the server's own queries for one month);
    ``groups`` None with ``pieces``: every group's rows."""
    return f"{_prefix(groups, pieces)}{query}\n) AS scoped"


def _prefix(groups: Sequence[str] | None, pieces: str | None = None) -> str:
    ctes: list[tuple[str, str]] = []
    if groups is not None:
        ctes += [(t, f"SELECT * FROM main.{t} r WHERE {visible('r', groups)}") for t in FILTERED]
        ctes += [(t, f"SELECT * FROM main.{t} WHERE false") for t in HIDDEN]
    where = "" if groups is None else f" WHERE {visible('r', groups)}"
    ctes += [
        (name, f"SELECT * FROM {pieces or 'main.' + name} r{where}")
        if name in DERIVED
        else (name, VIEWS[name])
        for name in VIEW_ORDER
    ]
    head = ",\n".join(f"{name} AS ({body}\n)" for name, body in ctes)
    return f"WITH {head}\nSELECT * FROM (\n"


_LINES_BEFORE = _prefix(["x"]).count("\n")
"""Lines of the WITH before the query's first line (group names hold no newline)."""

_LINE = re.compile(r"\bLINE (\d+):")


def relocate(message: str) -> str:
    """A DuckDB error message about a scoped query, with its ``LINE n:`` counted in the
    query as its author wrote it rather than in the WITH around it."""
    return _LINE.sub(lambda m: f"LINE {max(1, int(m.group(1)) - _LINES_BEFORE)}:", message)
