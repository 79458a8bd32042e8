"""Values whose size the query chooses: refused before they are built (issue 25).

DuckDB's ``memory_limit`` counts the memory of operators (aggregates, joins, sorts) but not a
value built inside one scalar function call, and it checks for an interrupt only between
chunks, never inside one call: ``lpad('x', 2000000000, 'y')`` or
``repeat(repeat('x', 1000000), 3000)`` took the daemon to 2.5-12.5 GB for 7-100 s whatever
the limit and the deadline. So the sandbox refuses, on DuckDB's parse tree, every way the
query can choose how large one value grows:

1. **Sized functions** (:data:`SIZE_ARGUMENTS`, ``range``/``generate_series`` used as a
   scalar list, ``printf``/``format`` widths): the size must be an integer literal of at
   most :data:`MAX_SIZE`, and the sizes of calls nested in one another multiply to at most
   :data:`MAX_GROWTH` (``repeat(repeat('x', 1000), 1000)`` is a million).
   ``replace``/``regexp_replace`` multiply their input by their replacement's length, so
   their replacement must be a literal and counts the same way.
2. **Lambdas**: a fold (``reduce``) can double its value as often as the list is long, so
   it is refused; a map (``list_transform``) builds the list times the lambda's result, so
   its lambda follows the rule of a recursive part (3), calls no sized function and names
   no literal longer than :data:`MAX_SIZE` bytes; ``list_filter`` is never larger than its list. (A list
   comprehension's result expression parses as a ``struct_pack``, which rule 3 refuses.)
3. **Recursive CTEs**: each round may feed a larger value to the next (``s || s`` doubles
   a string thirty times to 2 GB in a second, between two interrupt checks). In the
   recursive part, a function over the query's columns must be one of
   :data:`RECURSIVE_SAFE` (the result is a fixed-size value, or at most its input plus a
   literal: ``n + 1``, ``path || '/'``), over one column reference at most (``s || s``,
   ``l + l`` double).

The full list of DuckDB 2.0's scalar functions was checked for arguments that choose an
output size (``SELECT function_name, parameters, return_type FROM duckdb_functions()``;
docs/decisions.md lists what was found)."""

from __future__ import annotations

import re
from typing import Any

from .sandbox import NotAllowed, ParseNode

MAX_SIZE = 1000
"""The largest size one call may ask for (a padding width, a repeat count, a list length)."""

MAX_GROWTH = 10_000
"""The most the sizes of calls nested in one another may multiply to."""

SIZE_ARGUMENTS = {
    "repeat": 1,
    "lpad": 1,
    "rpad": 1,
    "list_resize": 1,
    "array_resize": 1,
    "bar": 3,
    "to_base": 2,
    "bitstring": 1,
    "equi_width_bins": 2,
}
"""Scalar functions whose result's size is chosen by the argument at this index."""

LIST_BUILDERS = frozenset({"range", "generate_series"})
"""As scalar functions (not in FROM), these build a list of a length their arguments choose."""

FORMATTERS = frozenset({"printf", "format"})
"""Their format string chooses widths (``%2000000000d``, ``{:>2000000000}``, ``%*d``)."""

REPLACERS = frozenset({"replace", "regexp_replace"})
"""Each match becomes the replacement (argument 2): the input times its length."""

FILTERS = frozenset({"list_filter", "filter", "array_filter"})
"""Lambdas whose result is never larger than their list."""

MAPS = frozenset({"list_apply", "list_transform", "array_apply", "array_transform", "apply"})
"""Lambdas mapped over a list: the lambda's body is checked as a recursive part is."""

RECURSIVE_SAFE = frozenset(
    {
        "+",
        "-",
        "*",
        "/",
        "//",
        "%",
        "abs",
        "round",
        "floor",
        "ceil",
        "ceiling",
        "sign",
        "sqrt",
        "least",
        "greatest",
        "coalesce",
        "ifnull",
        "nullif",
        "length",
        "len",
        "strlen",
        "octet_length",
        "array_length",
        "cardinality",
        "date_trunc",
        "date_part",
        "datepart",
        "extract",
        "date_diff",
        "datediff",
        "date_sub",
        "datesub",
        "year",
        "month",
        "day",
        "hour",
        "minute",
        "second",
        "epoch",
        "to_timestamp",
        "make_date",
        "last_day",
        "substring",
        "substr",
        "left",
        "right",
        "trim",
        "ltrim",
        "rtrim",
        "lower",
        "upper",
        "lcase",
        "ucase",
        "list_extract",
        "list_element",
        "array_extract",
        "struct_extract",
        "contains",
        "starts_with",
        "ends_with",
        "prefix",
        "suffix",
        "instr",
        "position",
        "strpos",
        "hash",
        "md5",
        "min",
        "max",
        "count",
        "sum",
        "avg",
        "~~",
        "!~~",
        "~~*",
        "!~~*",
        "~~~",
        "regexp_matches",
        "||",
        "concat",
        "not",
    }
)
"""Functions over the query's columns a recursive CTE's recursive part may call: fixed-size
results, or at most the input and a literal (``||`` and ``concat`` over one column)."""

_WIDTH = re.compile(r"\d+")


def check(tree: ParseNode) -> None:
    """Raises :class:`NotAllowed` when the parse tree (``json_serialize_sql``) builds a
    value whose size the query chooses (see the module's docstring)."""
    _node(tree.get("statements", []), 1, False)


def _node(node: Any, growth: int, recursive: bool) -> None:
    if isinstance(node, list):
        for item in node:
            _node(item, growth, recursive)
        return
    if not isinstance(node, dict):
        return
    if node.get("type") == "RECURSIVE_CTE_NODE":
        _node([v for k, v in node.items() if k != "right"], growth, recursive)
        _node(node.get("right"), growth, True)
        return
    if node.get("type") == "TABLE_FUNCTION" and isinstance(node.get("function"), dict):
        # range(n) in FROM streams its rows: only its arguments are values
        _node([v for k, v in node.items() if k != "function"], growth, recursive)
        _node(node["function"].get("arguments"), growth, recursive)
        return
    if node.get("class") in ("FUNCTION", "AGGREGATE"):
        growth = _function(node, growth, recursive)
    if node.get("class") == "LAMBDA":
        _short_literals(node.get("expr"))
        recursive = True  # a map's lambda runs once per element: no growth per call,
        growth = MAX_GROWTH  # and no sized call (the list's length is not known)
    for value in node.values():
        _node(value, growth, recursive)


def _arguments(node: ParseNode) -> list[ParseNode]:
    return [
        a.get("expression") or {} if isinstance(a, dict) and "expression" in a else a
        for a in node.get("arguments") or node.get("children") or []
    ]


def _literal(expr: ParseNode) -> str | None:
    """The text of a literal constant, None for anything else."""
    if not isinstance(expr, dict) or expr.get("class") != "CONSTANT":
        return None
    lit = expr.get("literal")
    if isinstance(lit, dict):
        return None if lit.get("kind") == "NULL" else str(lit.get("text", ""))
    value = expr.get("value")
    if isinstance(value, dict) and not value.get("is_null"):
        return str(value.get("value", ""))
    return None


def _size(name: str, expr: ParseNode) -> int:
    text = _literal(expr)
    try:
        size = int(text) if text is not None else None
    except ValueError:
        size = None
    if size is None or size > MAX_SIZE:
        raise NotAllowed(
            f"{name}() with a size that is not a small constant builds a value "
            f"the query chooses the size of; not available in ledger SQL (use "
            f"a whole-number literal of at most {MAX_SIZE})"
        )
    return max(size, 1)


def _factor(name: str, args: list[ParseNode]) -> int:
    """How many times larger than its input the call's result may be."""
    if name in SIZE_ARGUMENTS:
        index = SIZE_ARGUMENTS[name]
        return _size(name, args[index]) if index < len(args) else 80 if name == "bar" else 1
    if name in LIST_BUILDERS:
        bounds = [_size(name, a) if _literal(a) is not None else _size(name, {}) for a in args]
        if len(bounds) == 1:
            return _size(name, args[0])
        step = max(abs(bounds[2]) if len(bounds) > 2 else 1, 1)
        return _size(
            name,
            {"class": "CONSTANT", "literal": {"text": str(abs(bounds[1] - bounds[0]) // step + 1)}},
        )
    if name in FORMATTERS:
        fmt = _literal(args[0]) if args else None
        if fmt is None or "*" in fmt or re.search(r"\{[^}]*\{", fmt):
            raise NotAllowed(
                f"{name}() with a format that is not a literal, or whose width is "
                "an argument, builds a value the query chooses the size of; not "
                "available in ledger SQL"
            )
        widest = max((int(w) for w in _WIDTH.findall(fmt)), default=1)
        return _size(name, {"class": "CONSTANT", "literal": {"text": str(widest)}})
    if name in REPLACERS:
        replacement = _literal(args[2]) if len(args) > 2 else None
        if replacement is None:
            raise NotAllowed(
                f"{name}() with a replacement that is not a literal builds a "
                "value the query chooses the size of; not available in ledger SQL"
            )
        return len(replacement.encode()) + 1
    return 1


def _columns(node: Any) -> int:
    if isinstance(node, list):
        return sum(_columns(n) for n in node)
    if not isinstance(node, dict):
        return 0
    return (1 if node.get("class") == "COLUMN_REF" else 0) + sum(_columns(v) for v in node.values())


def _function(node: ParseNode, growth: int, recursive: bool) -> int:
    name = str(node.get("function_name", "")).lower()
    args = _arguments(node)
    lambdas = [a for a in args if isinstance(a, dict) and a.get("class") == "LAMBDA"]
    if lambdas and name not in FILTERS and name not in MAPS:
        raise NotAllowed(
            f"{name}() with a lambda can double a value for each element of its "
            "list; not available in ledger SQL (unnest the list and aggregate)"
        )
    if recursive and _columns(args):
        if name not in RECURSIVE_SAFE:
            raise NotAllowed(
                f"{name}() over the columns of a recursive CTE's recursive part "
                "can grow a value each round; not available in ledger SQL"
            )
        if _columns(args) > 1 and name not in (
            "least",
            "greatest",
            "coalesce",
            "ifnull",
            "nullif",
            "contains",
            "starts_with",
            "ends_with",
            "prefix",
            "suffix",
            "instr",
            "position",
            "strpos",
            "~~",
            "!~~",
            "~~*",
            "!~~*",
            "~~~",
            "regexp_matches",
            "date_diff",
            "datediff",
            "date_part",
            "datepart",
        ):
            raise NotAllowed(
                f"{name}() over two column references in a recursive CTE's "
                "recursive part can double a value each round (s || s); not "
                "available in ledger SQL"
            )
    growth *= _factor(name, args)
    if growth > MAX_GROWTH:
        raise NotAllowed(
            f"{name}() nested in other calls that multiply a value's size "
            f"builds one more than {MAX_GROWTH} times larger than its input; not "
            "available in ledger SQL"
        )
    return growth


def _short_literals(node: Any) -> None:
    """A map's lambda names no literal longer than :data:`MAX_SIZE` bytes (its result is
    repeated for each element of the list)."""
    if isinstance(node, list):
        for item in node:
            _short_literals(item)
    elif isinstance(node, dict):
        text = _literal(node)
        if text is not None and len(text.encode()) > MAX_SIZE:
            raise NotAllowed(
                f"a literal of {len(text.encode())} bytes in a lambda is repeated "
                "for each element of the list; not available in ledger SQL (at "
                f"most {MAX_SIZE} bytes)"
            )
        for value in node.values():
            _short_literals(value)
