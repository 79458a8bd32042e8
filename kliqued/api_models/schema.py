"""JSON Schema for the OpenAPI document, generated from pydantic models.

pydantic writes an optional field as ``anyOf: [X, {type: null}]``, titles on every node,
and its keys sorted; the document writes ``type: [X, "null"]``, no titles, and keys in the
order a validator should try them. jsonschema reports a body's errors in the schema's
keyword order and ``request.valid`` answers with the first, so the order is part of the
API's error messages (``'resource' is a required property`` before ``unexpected
properties``): ``tidy`` restores it. The result is plain data, checked equal to the schemas
that were written by hand before (tests/daemon/test_openapi_models.py).
"""

from __future__ import annotations

from typing import Any, Iterable

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue

REF = "#/components/schemas/{model}"

ORDER = (
    "$ref",
    "type",
    "const",
    "enum",
    "oneOf",
    "anyOf",
    "properties",
    "required",
    "additionalProperties",
    "propertyNames",
    "minProperties",
    "maxProperties",
    "items",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minimum",
    "exclusiveMinimum",
    "maximum",
    "exclusiveMaximum",
    "multipleOf",
    "description",
    "examples",
)
"""The keywords' order in a generated node: what a value is, then its bounds, then words."""

_BY_TYPE = {
    "string": {"minLength", "maxLength", "pattern", "format"},
    "number": {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum", "multipleOf"},
    "array": {"items", "minItems", "maxItems"},
    "object": {
        "properties",
        "required",
        "additionalProperties",
        "propertyNames",
        "minProperties",
        "maxProperties",
    },
}
_BY_TYPE["integer"] = _BY_TYPE["number"]
_BY_TYPE["null"] = set()
_NAMED = {"properties", "$defs"}
"""Keywords whose value maps names (a property's, a definition's) to schemas."""


class _Generator(GenerateJsonSchema):
    """pydantic's generator with its keys left in the order it builds them (``tidy``
    orders them)."""

    def sort(self, value: JsonSchemaValue, parent_key: str | None = None) -> JsonSchemaValue:
        return value


def _typed_branch(node: Any) -> str | None:
    """The one type of a branch that only says a type and that type's own keywords."""
    kind = node.get("type") if isinstance(node, dict) else None
    if not isinstance(kind, str):
        return None
    if kind not in _BY_TYPE or not set(node) - {"type"} <= _BY_TYPE[kind] | {"enum"}:
        return None
    return kind


def _merged(branches: list[Any]) -> dict[str, Any] | None:
    """``anyOf`` of typed branches as one node with a list of types, where no keyword is
    claimed by two branches (so each keeps applying to its own type only)."""
    kinds = [_typed_branch(b) for b in branches]
    if None in kinds or len(set(kinds)) != len(kinds):
        return None
    out: dict[str, Any] = {"type": kinds}
    for b in branches:
        for k, v in b.items():
            if k == "type":
                continue
            if k in out:
                return None
            out[k] = v
    if "enum" in out:
        if len(branches) != 2 or "null" not in kinds:
            return None
        out["enum"] = [*out["enum"], None]
    return out


def _collapsed(node: dict[str, Any]) -> dict[str, Any]:
    """``anyOf`` written as the document writes it: one node with a list of types, or
    ``oneOf`` for a union of models (whose branches are exclusive: see ``requests``)."""
    branches = node["anyOf"]
    rest = {k: v for k, v in node.items() if k != "anyOf"}
    merged = _merged(branches)
    if merged is not None:
        return {**merged, **rest}
    if all("$ref" in b or b == {"type": "null"} for b in branches):
        nulls = [b for b in branches if "$ref" not in b]
        return {"oneOf": nulls + [b for b in branches if "$ref" in b], **rest}
    return node


def _literal(node: dict[str, Any]) -> dict[str, Any]:
    """An enum of strings and null says its types, as the document's enums do."""
    values = node["enum"]
    if "type" in node or not any(v is None for v in values):
        return node
    if not all(v is None or isinstance(v, str) for v in values):
        return node
    return {"type": ["string", "null"], **node}


def tidy(node: Any) -> Any:
    """A generated schema as the document writes it: no titles, no defaults (the handlers
    apply theirs), no ``additionalProperties: true`` nor ``items: {}`` (the defaults), ``const`` without its
    redundant type, optional values as type lists, keys in ``ORDER``."""
    if isinstance(node, list):
        return [tidy(v) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for k, v in node.items():
        if k in ("title", "default") or (k == "additionalProperties" and v is True):
            continue
        if k == "items" and v == {}:  # any item: the default
            continue
        out[k] = {n: tidy(s) for n, s in v.items()} if k in _NAMED else tidy(v)
    if "const" in out:
        out.pop("type", None)
    if "anyOf" in out:
        out = _collapsed(out)
    if "enum" in out:
        out = _literal(out)
    if out.get("type") == "object" and "properties" in out and "required" not in out:
        out["required"] = []
    rank = {k: i for i, k in enumerate(ORDER)}
    return dict(sorted(out.items(), key=lambda kv: rank.get(kv[0], len(ORDER))))


def components(models: Iterable[type[BaseModel]]) -> dict[str, Any]:
    """``components.schemas`` for ``models``: each model's schema under its name, the
    models it uses (pydantic's ``$defs``) hoisted beside it. Two different schemas under
    one name are an error, not a silent overwrite."""
    out: dict[str, Any] = {}

    def put(name: str, schema: Any) -> None:
        if name in out and out[name] != schema:
            raise ValueError(f"two request schemas named {name}")
        out[name] = schema

    for model in models:
        schema = model.model_json_schema(
            ref_template=REF, schema_generator=_Generator, mode="validation"
        )
        for name, sub in schema.pop("$defs", {}).items():
            put(name, tidy(sub))
        put(model.__name__, tidy(schema))
    return out
