"""The rules of ``inputs.py`` that JSON Schema can say, said in the OpenAPI document (issue
32): a schema-valid request is not refused for its form, and schemathesis (and any client
generator) sees every rule. ``inputs.py`` refuses a control character (C0, DEL, C1) in every
string of a request that is a name or an id (``NAME``), not in free text (``FREE_TEXT``) or
data (``DATA``); here each such string of the request bodies (and every path and query
parameter) gets :data:`NAME_PATTERN`, unless it already has a pattern, a format, an enum or
a const that excludes them. Lone surrogates, also refused, are not expressible (a pattern
cannot tell a lone one from half of a pair), and JSON generators do not produce them.
Applied to the generated schemas (``openapi.SCHEMAS``), not written into each model."""

from __future__ import annotations

import copy
from typing import Any, Iterable

from kliqued.daemon.api.inputs import DATA, FREE_TEXT, INT_MAX

NAME_PATTERN = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$"
"""No C0, DEL or C1 control character (ECMA-262, as JSON Schema's ``pattern``)."""

SINCE_PATTERN = (
    "^([0-9]{1,9}[smhdw]?|[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}"
    "([.][0-9]{1,9})?(Z|[+-][0-9]{2}:[0-9]{2}))$"
)
"""``GET /v1/demand``'s ``since``, in the document and checked first (issue 32): a value of
this form the calendar refuses (a 30 February) is a 422, any other a 400."""

UTC_TIME_PATTERN = (
    "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}([.][0-9]{1,9})?(Z|[+]00:00)$"
)
"""A time parameter's form, in the document (issue 32): RFC 3339 in UTC (``Z`` or
``+00:00``)."""

_KEEP = ("pattern", "format", "enum", "const")


def _is_string(node: dict[str, Any]) -> bool:
    t = node.get("type")
    return t == "string" or (isinstance(t, list) and "string" in t)


def _is_integer(node: dict[str, Any]) -> bool:
    t = node.get("type")
    return t == "integer" or (isinstance(t, list) and "integer" in t)


def name_rule(node: dict[str, Any]) -> dict[str, Any]:
    """A parameter's schema with the rule (a copy; the node itself when it needs none)."""
    if not _is_string(node) or any(k in node for k in _KEEP):
        return node
    return {**node, "pattern": NAME_PATTERN}


def _target(schemas: dict[str, Any], root: str, pointer: list[str]) -> tuple[str, list[str]]:
    """Where ``pointer`` (``*``: any one segment) from ``root`` lands: the component whose
    node it is, and the pointer within it (``$ref`` followed)."""
    name, node = root, schemas[root]
    rest: list[str] = []
    for seg in pointer:
        while "$ref" in node:
            name, rest = node["$ref"].rsplit("/", 1)[1], []
            node = schemas[name]
        if seg == "*":
            node = node.get("items") or node.get("additionalProperties") or {}
        else:
            node = (node.get("properties") or {}).get(seg, {})
        rest = [*rest, seg]
    return name, rest


def with_name_rule(schemas: dict[str, Any], requests: Iterable[str]) -> dict[str, Any]:
    """``schemas`` with the rule on every name of the ``requests`` bodies and the schemas
    they reference (answers are left alone: they may carry a task's free text), and every
    integer of them bounded to 64 bits, as ``inputs.py`` bounds it."""
    out = copy.deepcopy(schemas)
    skip: dict[str, list[list[str]]] = {}
    for schema, pointers in (*FREE_TEXT.items(), *DATA.items()):
        if schema in out:
            for p in pointers:
                name, rest = _target(out, schema, p.split("/")[1:])
                skip.setdefault(name, []).append(rest)

    def skipped(name: str, path: list[str]) -> bool:
        return any(
            len(path) >= len(s) and all(a in ("*", b) for a, b in zip(s, path))
            for s in skip.get(name, [])
        )

    seen: set[str] = set()
    todo = [n for n in requests if n in out]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        stack: list[tuple[Any, list[str]]] = [(out[name], [])]
        while stack:
            node, path = stack.pop()
            if not isinstance(node, dict) or skipped(name, path):
                continue
            if "$ref" in node:
                todo.append(node["$ref"].rsplit("/", 1)[1])
                continue
            if _is_string(node) and not any(k in node for k in _KEEP):
                node["pattern"] = NAME_PATTERN
            if _is_integer(node):  # inputs.py: integers fit in 64 bits
                node.setdefault("minimum", -INT_MAX)
                node.setdefault("maximum", INT_MAX)
            for k, sub in (node.get("properties") or {}).items():
                stack.append((sub, [*path, k]))
            for key in ("items", "additionalProperties"):
                if isinstance(node.get(key), dict):
                    stack.append((node[key], [*path, "*"]))
            t = node.get("type")
            if (t == "object" or (isinstance(t, list) and "object" in t)) and node.get(
                "additionalProperties"
            ) is not False:  # keys are names too
                names = node.setdefault("propertyNames", {})
                if not any(k in names for k in _KEEP):
                    names["pattern"] = NAME_PATTERN
            for key in ("anyOf", "oneOf", "allOf"):
                for sub in node.get(key) or []:
                    stack.append((sub, path))
    return out
