"""Stage 1 of compiling: each YAML document to validated models, item by item.

Validating one object at a time (rather than the whole file at once) is what lets a run
report every error in the estate with its place, and still check the valid objects further.
"""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ValidationError
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from .diagnostics import Diagnostic, error
from .loader import position_of, to_plain
from .models import (
    HANDLE_PATTERN,
    KIND_OF_SECTION,
    NAME_PATTERN,
    SECTIONS,
    USER_PATTERN,
    Group,
    Policy,
    Pool,
    Price,
    Profile,
    Settings,
)
from .source import SourceMap, SourceObject

TOP_LEVEL = ["version", "settings", *SECTIONS]
_UNION_TAGS = {"fixed", "from_task"}
_PATTERN_TEXT: dict[str, tuple[str, str | None]] = {
    USER_PATTERN: (
        "is not a valid user identity",
        "letters, digits and . _ @ + -, such as alice or alice@example.com",
    ),
    r"^[A-Z]{3}$": ("must be a 3-letter currency code", "for example EUR, USD or CHF"),
    HANDLE_PATTERN: (
        "is not a forge handle",
        "as CODEOWNERS writes owners: @user, @org/team or an email",
    ),
}


def _close(word: str, options: list[str]) -> str | None:
    match = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f"did you mean '{match[0]}'?" if match else None


def _object_label(kind: str, raw: Any, index: int) -> tuple[str, str | None]:
    name = raw.get("name") if isinstance(raw, dict) else None
    if kind == "price" and isinstance(raw, dict):
        gt, eff = raw.get("gpu_type"), raw.get("effective_from")
        if isinstance(gt, str):
            return f"price for '{gt}'" + (f" from {eff}" if eff else ""), None
    if isinstance(name, str) and name:
        return f"{kind} '{name}'", name
    return f"{kind} #{index + 1}", None


def _clean_loc(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """Drops the union tags pydantic puts into a path (``gpus.fixed`` is just ``gpus``)."""
    out: list[Any] = []
    for i, step in enumerate(loc):
        if (
            i > 0
            and loc[i - 1] == "gpus"
            and step in _UNION_TAGS
            and len(out)
            and out[-1] == "gpus"
        ):
            if step == "fixed" or i + 1 < len(loc):
                continue
        out.append(step)
    return tuple(out)


def _loc_text(loc: tuple[Any, ...]) -> str:
    text = ""
    for step in loc:
        text += f"[{step}]" if isinstance(step, int) else (f".{step}" if text else str(step))
    return text


def _model_fields(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The field names allowed where ``loc`` points, for "did you mean" hints."""
    current: Any = model
    for step in loc:
        if isinstance(step, int):
            continue
        field = getattr(current, "model_fields", {}).get(step)
        if field is None:
            break
        ann = field.annotation
        nested = _find_model(ann)
        if nested is None:
            break
        current = nested
    return list(getattr(current, "model_fields", {}))


def _find_model(ann: Any) -> type[BaseModel] | None:
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for arg in getattr(ann, "__args__", ()) or ():
        found = _find_model(arg)
        if found is not None:
            return found
    meta = getattr(ann, "__metadata__", None)
    if meta is not None:
        return _find_model(getattr(ann, "__origin__", None))
    return None


def pydantic_diagnostics(
    exc: ValidationError, model: type[BaseModel], label: str, file: str, node: Any
) -> list[Diagnostic]:
    diags: list[Diagnostic] = []
    for err in exc.errors(include_url=False):
        loc = _clean_loc(tuple(err["loc"]))
        where = _loc_text(loc)
        etype = err["type"]
        if etype == "extra_forbidden":
            field = str(loc[-1]) if loc else "?"
            allowed = _model_fields(model, loc[:-1])
            diags.append(
                error(
                    "unknown-field",
                    f"{label}: unknown field '{where}'",
                    position_of(file, node, loc, key=True),
                    _close(field, allowed) or f"allowed here: {', '.join(allowed)}",
                )
            )
        elif etype == "missing":
            diags.append(
                error(
                    "missing-field",
                    f"{label}: missing required field '{where}'",
                    position_of(file, node, loc[:-1]),
                )
            )
        elif etype == "string_pattern_mismatch" and err["ctx"].get("pattern") == NAME_PATTERN:
            diags.append(
                error(
                    "invalid-name",
                    f"{label}: '{where}' is not a valid name: {err['input']!r}",
                    position_of(file, node, loc),
                    "names are lower-case letters, digits and '-', 1 to 63 characters, "
                    "starting and ending with a letter or digit",
                )
            )
        elif etype == "literal_error":
            expected = err["ctx"].get("expected", "")
            diags.append(
                error(
                    "invalid-value",
                    f"{label}: '{where}' must be one of {expected}; found {err['input']!r}",
                    position_of(file, node, loc),
                    _close(
                        str(err["input"]),
                        [e.strip(" '") for e in expected.replace(" or ", ",").split(",")],
                    ),
                )
            )
        elif etype == "string_pattern_mismatch":
            pattern = err["ctx"].get("pattern", "")
            text, hint = _PATTERN_TEXT.get(pattern, (f"must match {pattern}", None))
            diags.append(
                error(
                    "invalid-value",
                    f"{label}: '{where}' {text}; found {err['input']!r}",
                    position_of(file, node, loc),
                    hint,
                )
            )
        else:
            msg = err["msg"].removeprefix("Value error, ")
            hint = None
            if etype == "string_type":
                msg = f"expected a string, found {type(err['input']).__name__}"
                if isinstance(err["input"], (int, float, bool)):
                    hint = f'quote it: "{err["input"]}"'
            elif etype in ("model_type", "dict_type"):
                msg = f"expected a mapping, found {type(err['input']).__name__}"
            elif etype == "list_type":
                msg = f"expected a list, found {type(err['input']).__name__}"
                hint = "write it as [a, b] or one '- item' per line"
            diags.append(
                error(
                    "invalid-value",
                    f"{label}: '{where}': {msg}",
                    position_of(file, node, loc),
                    hint,
                )
            )
    return diags


def validate_document(file: str, root: Any, sources: SourceMap) -> list[Diagnostic]:
    """Validates one document into ``sources``; returns what was wrong with it."""
    diags: list[Diagnostic] = []
    if root is None:
        return diags
    if not isinstance(root, CommentedMap):
        sources.incomplete = True
        return [
            error(
                "invalid-value",
                f"an estate file must be a mapping of sections ({', '.join(TOP_LEVEL)})",
                position_of(file, root, ()),
            )
        ]
    for key in root:
        value = root[key]
        if key == "version":
            if value != 1 or isinstance(value, bool):
                diags.append(
                    error(
                        "invalid-value",
                        f"unsupported version {value!r}",
                        position_of(file, root, ("version",)),
                        "the only version today is 1",
                    )
                )
        elif key == "settings":
            diags.extend(_settings(file, root, sources))
        elif key in SECTIONS:
            diags.extend(_section(file, root, key, sources))
        else:
            sources.incomplete = True
            diags.append(
                error(
                    "unknown-field",
                    f"unknown section '{key}'",
                    position_of(file, root, (key,), key=True),
                    _close(str(key), TOP_LEVEL) or f"sections: {', '.join(TOP_LEVEL)}",
                )
            )
    return diags


def _settings(file: str, root: CommentedMap, sources: SourceMap) -> list[Diagnostic]:
    node = root["settings"]
    pos = position_of(file, root, ("settings",), key=True)
    if sources.settings is not None:
        first = sources.settings.pos()
        return [
            error(
                "settings-repeated",
                "settings appear more than once in the estate",
                pos,
                f"keep one settings section; the other is at {first}",
            )
        ]
    if node is None:
        node = CommentedMap()
    try:
        model = Settings.model_validate(to_plain(node))
    except ValidationError as exc:
        sources.settings = SourceObject("settings", "settings", Settings(), file, node)
        return pydantic_diagnostics(exc, Settings, "settings", file, node)
    sources.settings = SourceObject("settings", "settings", model, file, node)
    return []


def _section(file: str, root: CommentedMap, section: str, sources: SourceMap) -> list[Diagnostic]:
    node = root[section]
    kind = KIND_OF_SECTION[section]
    model_cls = SECTIONS[section]
    if node is None:
        return []
    if not isinstance(node, CommentedSeq):
        return [
            error(
                "invalid-value",
                f"'{section}' must be a list of {section}",
                position_of(file, root, (section,)),
                f"write each item as '- name: ...' under '{section}:'",
            )
        ]
    diags: list[Diagnostic] = []
    for index, item in enumerate(node):
        raw = to_plain(item)
        label, name = _object_label(kind, raw, index)
        if not isinstance(item, CommentedMap):
            diags.append(
                error(
                    "invalid-value",
                    f"{label}: expected a mapping, found {type(raw).__name__}",
                    position_of(file, node, (index,)),
                )
            )
            continue
        try:
            model = model_cls.model_validate(raw)
        except ValidationError as exc:
            diags.extend(pydantic_diagnostics(exc, model_cls, label, file, item))
            if name:
                sources.broken.setdefault(kind, set()).add(name)
            continue
        obj_name = _key_of(model)
        existing = sources.get(kind, obj_name)
        if existing is not None:
            here = position_of(file, item, ("name",) if kind != "price" else ())
            first = existing.pos("name") if kind != "price" else existing.pos()
            if isinstance(model, Price):
                diags.append(
                    error(
                        "duplicate-price",
                        f"two prices for '{model.gpu_type}' from {model.effective_from}",
                        here,
                        f"the other is at {first}; remove one or change its effective_from",
                    )
                )
            else:
                diags.append(
                    error(
                        "duplicate-name",
                        f"{kind} '{obj_name}' is declared twice",
                        here,
                        f"the first is at {first}; names are unique per kind",
                    )
                )
            continue
        sources.add(SourceObject(kind, obj_name, model, file, item))
    return diags


def _key_of(model: BaseModel) -> str:
    """A price is known by its GPU type and start date; every other item by its name."""
    if isinstance(model, Price):
        return f"{model.gpu_type}@{model.effective_from}"
    if isinstance(model, (Pool, Profile, Policy, Group)):
        return model.name
    raise TypeError(f"not an item of a list section: {type(model).__name__}")
