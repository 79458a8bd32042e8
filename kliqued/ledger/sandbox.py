"""What finance's SQL may read and call: the ledger's relations and pure functions, nothing else.

The daemon's database also holds the event log (every user's commands) and the token table,
and DuckDB has no per-connection privileges, so the sandbox is an allowlist checked twice,
both times on DuckDB's own view of the query, never on its text:

1. **Parsed** (``json_serialize_sql``): every relation the query names must be one of
   :data:`RELATIONS` (unqualified, or in ``main`` of this database) or a CTE in scope at that
   place, with DuckDB's scoping (a CTE's body does not see itself unless it is recursive, so
   ``WITH tokens AS (SELECT * FROM tokens)`` names the real table and is refused); every table
   function must be one of :data:`TABLE_FUNCTIONS` (so no ``duckdb_tables()``,
   ``pragma_*``, ``query()``, ``checkpoint()``); no scalar function of :data:`DENIED_FUNCTIONS`
   (side effects or server settings); no ``DESCRIBE``/``SUMMARIZE``/``SHOW`` subqueries.
   ``information_schema``, ``pg_catalog`` and DuckDB's ``duckdb_*`` views are relations
   outside the allowlist, so they list nothing.
2. **Bound** (``EXPLAIN``): the physical plan may scan only the ledger's base tables
   (:data:`BASE_TABLES`, which the views read) and the allowed table functions. This catches
   what the binder brings in that the text does not show (a macro, a view of a system schema).

A denylist of names could not be complete; an allowlist of what the plan touches is.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from klique_util.excerpt import excerpt

ParseNode = dict[str, Any]
"""A node of DuckDB's JSON parse tree (``json_serialize_sql``): JSON objects all the way down."""

RELATIONS = (
    "ledger",
    "prices",
    "price_periods",
    "usage",
    "usage_priced",
    "usage_by_month",
    "usage_monthly",
    "usage_by_level",
    "usage_by_business_unit",
    "usage_by_department",
    "cloud_nodes",
    "cloud_node_usage",
    "cloud_spend_monthly",
    "capacity",
    "reservations",
    "capacity_periods",
    "capacity_by_month",
    "borrowed_usage",
    "reserved_idle",
    "estate_use",
    "idle_cost",
    "in_use_now",
    "preemptions",
    "lost_work",
)
"""The relations finance's SQL may name: the ledger's tables and documented views (a group
admin's names the same, over their subtree's rows: :mod:`kliqued.ledger.scope`)."""

BASE_TABLES = (
    "ledger",
    "prices",
    "ledger_monthly",
    "ledger_monthly_pending",
    "cloud_nodes",
    "capacity",
    "reservations",
    "preemptions",
)
"""The tables the plans of those relations scan (``usage_monthly`` reads the internal
monthly aggregate; a query may not name it)."""

TABLE_FUNCTIONS = ("range", "generate_series", "unnest")
"""Table functions that compute rows from their arguments only."""

DENIED_FUNCTIONS = frozenset(
    {
        "nextval",
        "currval",
        "setval",
        "setseed",
        "write_log",
        "sleep_ms",
        "current_setting",
        "getvariable",
        "getenv",
        "checkpoint",
        "force_checkpoint",
        "query",
        "query_table",
        "json_execute_serialized_sql",
    }
)
"""Scalar functions with a side effect (a sequence, the RNG, DuckDB's log, a thread held
asleep) or that read the server's state or settings: DuckDB's non-CONSISTENT functions, less
the harmless ones (clocks, random, uuid, ids of the current query)."""

_TABLE_REFS = frozenset(
    {"BASE_TABLE", "TABLE_FUNCTION", "SUBQUERY", "JOIN", "EMPTY", "EXPRESSION_LIST"}
)
"""Kinds of FROM item a query may use (``SHOW_REF``, i.e. DESCRIBE/SUMMARIZE, is not one)."""


class NotAllowed(Exception):
    """The query reads or calls something outside the sandbox; the message says what."""


def allowed_text() -> str:
    return ", ".join(RELATIONS)


def _refuse_relation(name: str) -> NotAllowed:
    return NotAllowed(
        f"{excerpt(name)} is not a ledger table or view: ledger SQL may read only "
        f"{allowed_text()} (docs/ledger.md)"
    )


def parsed(conn: Any, sql: str) -> ParseNode:
    """DuckDB's parse tree of ``sql`` (one SELECT), as JSON."""
    text = conn.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()[0]
    tree: ParseNode = json.loads(text)
    if tree.get("error"):
        message = tree.get("error_message") or "the query could not be parsed"
        if "Only SELECT" in message:
            message = (
                "this form of query is not supported on the ledger (PIVOT, SHOW, "
                "DESCRIBE...): write it as a plain SELECT, e.g. with GROUP BY and FILTER"
            )
        raise NotAllowed(message)
    return tree


def check_tree(tree: ParseNode, database: str, qualified: bool = True) -> None:
    """Raises :class:`NotAllowed` unless every relation, table function and function the
    parse tree names is allowed (see the module's docstring). ``qualified=False``: a
    relation may not name its schema or database either (a query scoped to a group admin's
    subtree, :mod:`kliqued.ledger.scope`, whose unqualified names are its filtered rows)."""
    _walk(tree.get("statements", []), frozenset(), database.lower(), qualified)


def _walk(node: Any, scope: frozenset[str], db: str, qualified: bool = True) -> None:
    if isinstance(node, list):
        for item in node:
            _walk(item, scope, db, qualified)
        return
    if not isinstance(node, dict):
        return
    ctes = (node.get("cte_map") or {}).get("map") if isinstance(node.get("cte_map"), dict) else None
    if ctes:
        inner = set(scope)
        for entry in ctes:
            name = str(entry.get("key", "")).lower()
            body = entry.get("value") or {}
            query = body.get("query_node") or {}
            here = frozenset(inner)
            if (
                query.get("type") == "RECURSIVE_CTE_NODE"
                and str(query.get("cte_name", "")).lower() == name
            ):
                # only the recursive part (right of the UNION) sees the CTE itself
                _walk({k: v for k, v in body.items() if k != "query_node"}, here, db, qualified)
                _walk({k: v for k, v in query.items() if k != "right"}, here, db, qualified)
                _walk(query.get("right"), here | {name}, db, qualified)
            else:
                _walk(body, here, db, qualified)
            inner.add(name)
        rest = {k: v for k, v in node.items() if k != "cte_map"}
        _walk(rest, frozenset(inner), db, qualified)
        return
    kind = node.get("type")
    if (
        "class" not in node
        and "sample" in node
        and "alias" in node
        and isinstance(kind, str)
        and not kind.endswith("_NODE")
    ):
        _check_table_ref(node, kind, scope, db, qualified)
    if node.get("class") == "FUNCTION":
        name = str(node.get("function_name", "")).lower()
        if name in DENIED_FUNCTIONS:
            raise NotAllowed(
                f"{name}() is not available in ledger SQL: it has side effects "
                "or reads the server's state"
            )
    for value in node.values():
        _walk(value, scope, db, qualified)


def _check_table_ref(
    node: ParseNode, kind: str, scope: frozenset[str], db: str, qualified: bool = True
) -> None:
    if kind not in _TABLE_REFS:
        what = {"SHOW_REF": "DESCRIBE, SUMMARIZE and SHOW"}.get(kind, kind)
        raise NotAllowed(
            f"{what} cannot be used in ledger SQL; the tables and views are "
            "described in docs/ledger.md"
        )
    if kind == "BASE_TABLE":
        name = str(node.get("table_name", "")).lower()
        schema = str(node.get("schema_name", "")).lower()
        catalog = str(node.get("catalog_name", "")).lower()
        if not schema and not catalog and name in scope:
            return  # a CTE of the query
        if (schema or catalog) and not qualified:
            shown = ".".join(p for p in (catalog, schema, name) if p)
            raise NotAllowed(
                f"{excerpt(shown)}: name the ledger's tables and views without a "
                f"schema or database ({excerpt(name)}), they hold the rows you may "
                f"read"
            )
        if not catalog and schema == db:
            catalog, schema = db, ""  # `kliqued.ledger`: the database, not a schema
        if catalog not in ("", db) or schema not in ("", "main") or name not in RELATIONS:
            shown = ".".join(p for p in (catalog, schema, name) if p)
            raise _refuse_relation(shown)
        if node.get("at_clause"):
            raise NotAllowed("time travel (AT ...) is not available on the ledger")
    elif kind == "TABLE_FUNCTION":
        fn = node.get("function") or {}
        name = str(fn.get("function_name", "")).lower()
        if (
            fn.get("class") != "FUNCTION"
            or name not in TABLE_FUNCTIONS
            or str(fn.get("schema", "")).lower() not in ("", "main")
            or str(fn.get("catalog", "")).lower() not in ("", "system")
        ):
            raise NotAllowed(
                f"table function {name or '?'}() is not available in ledger SQL; "
                f"allowed: {', '.join(TABLE_FUNCTIONS)}"
            )


def _qualified(name: str) -> tuple[str, ...]:
    """A plan's ``database.schema.table``, each part unquoted and lower-cased: DuckDB quotes
    a part that is not a plain identifier (a database named after ``kliqued-ledger.duckdb``
    is ``"kliqued-ledger"``), doubling a quote inside it."""
    parts: list[str] = []
    i, n = 0, len(name)
    while i <= n:
        if i < n and name[i] == '"':
            j, part = i + 1, []
            while j < n:
                if name[j] == '"' and name[j + 1 : j + 2] == '"':
                    part.append('"')
                    j += 2
                elif name[j] == '"':
                    break
                else:
                    part.append(name[j])
                    j += 1
            parts.append("".join(part).lower())
            i = j + 2  # past the closing quote and the dot
        else:
            end = name.find(".", i)
            end = n if end < 0 else end
            parts.append(name[i:end].lower())
            i = end + 1
    return tuple(parts)


def check_plan(plan_json: str, database: str, temp: Sequence[str] = ()) -> None:
    """Raises :class:`NotAllowed` unless the physical plan (``EXPLAIN (FORMAT json)``) scans
    only :data:`BASE_TABLES` of ``database`` and calls only :data:`TABLE_FUNCTIONS`.
    ``temp``: temporary tables the server itself made for the query and put in its text (a
    month's lending pieces, :func:`kliqued.ledger.lending.month_pieces`), which the query's
    author could not name (:func:`check_tree` refuses them)."""
    tables = {(database.lower(), "main", t.lower()) for t in BASE_TABLES}
    tables |= {("temp", "main", t.lower()) for t in temp}
    functions = {f.upper() for f in TABLE_FUNCTIONS}
    stack: list[Any] = [json.loads(plan_json)]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        info = node.get("extra_info")
        if isinstance(info, dict):
            table = info.get("Table")
            if table is not None and _qualified(str(table)) not in tables:
                raise _refuse_relation(_qualified(str(table))[-1])
            fn = info.get("Function")
            if fn is not None and str(fn).upper() not in functions:
                raise NotAllowed(
                    f"table function {str(fn).lower()}() is not available in "
                    f"ledger SQL; allowed: {', '.join(TABLE_FUNCTIONS)}"
                )
        stack.extend(node.get("children") or [])
