"""The compiled estate's canonical form, walked field by field, for the plan's diff.

The revision digest covers every field of the canonical JSON (``CompiledEstate.
canonical_body``); the plan must show every difference it covers, including fields added
after the plan's renderers were written. So the diff does not list fields: it walks the same
canonical form the digest is taken of, and turns each leaf into an attribute line. The
per-kind renderers of ``diff`` only word the fields they know better (``pools_by``, renames);
every other leaf is shown from here, named as IT writes it: the compiled form's units are
in the key (``capacity_milli``, ``timeout_s``), so ``_milli`` and ``_s`` are dropped from the
name and the value is shown as an amount or a duration, the estate's own notation.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from klique_util.units import milli_to_gpus

from ..units import duration_str, milli_str

Path = tuple[str, ...]


class Shown(str):
    """A value as the estate writes it (``64``, ``"de"``, ``15m``, ``[a, b]``), carrying its
    typed value (64, "de", "15m", ["a", "b"]) for machine readers of the plan: the text is
    what people compare, the value what the JSON plan holds."""

    value: Any

    def __new__(cls, text: str, value: Any) -> "Shown":
        obj = super().__new__(cls, text)
        obj.value = value
        return obj


def typed(value: str | None) -> Any:
    """The typed value of a displayed one (a plain string is its own value)."""
    return getattr(value, "value", value)


def amount(milli: int) -> Shown:
    """A GPU amount, weight or number of hours: ``0.25`` shown, 0.25 as the value."""
    return Shown(milli_str(milli), milli_to_gpus(milli))


def dur(seconds: int) -> Shown:
    text = duration_str(seconds)
    return Shown(text, text)


def q(text: str) -> Shown:
    """A string value, quoted as in HCL/JSON so that spaces and empty strings are visible."""
    return Shown(json.dumps(text, ensure_ascii=False), text)


def flow(items: Iterable[str]) -> Shown:
    """A list the way it is written inline in YAML: ``[a, b]``."""
    texts = list(items)
    return Shown("[" + ", ".join(texts) + "]", [typed(t) for t in texts])


def boolean(v: bool) -> Shown:
    return Shown("true" if v else "false", v)


UNITS = (("_milli", amount), ("_s", dur))
"""Compiled key suffix -> how its integer values are shown (the suffix is dropped)."""


def display_key(key: str) -> str:
    for suffix, _ in UNITS:
        if key.endswith(suffix):
            return key[: -len(suffix)]
    return key


def scalar(key: str, value: Any) -> Shown:
    """One JSON scalar as the estate writes it; ``key`` (the compiled one) names its unit."""
    if isinstance(value, bool):
        return boolean(value)
    if isinstance(value, int):
        for suffix, show in UNITS:
            if key.endswith(suffix):
                return show(value)
        return Shown(str(value), value)
    if isinstance(value, str):
        return q(value)
    return Shown(json.dumps(value, ensure_ascii=False, sort_keys=True), value)


Leaves = dict[Path, tuple[Path, Shown]]
"""Compiled path (JSON keys, list items by name or index) -> (path as shown, value)."""


def leaves(value: Any, path: Path = (), shown: Path = (), key: str = "") -> Leaves:
    """Every leaf of a canonical JSON value. ``None`` is "not set" (no leaf), so setting a
    field reads as ``+`` and clearing it as ``-``; an empty list or mapping is a leaf of its
    own, so ``[]`` differs from not set. Lists of named objects are keyed by name (an alert
    channel ``ops``), other lists of objects by position, lists of scalars are one leaf."""
    out: Leaves = {}
    if value is None:
        return out
    if isinstance(value, dict):
        if not value:
            out[path] = (shown, Shown("{}", {}))
        for k in sorted(value):
            out.update(leaves(value[k], (*path, k), (*shown, display_key(k)), k))
        return out
    if isinstance(value, list):
        if not value:
            out[path] = (shown, Shown("[]", []))
        elif all(isinstance(v, dict) for v in value):
            named = all(isinstance(v.get("name"), str) for v in value)
            for i, item in enumerate(value):
                step = item["name"] if named else str(i)
                body = {k: v for k, v in item.items() if not (named and k == "name")}
                out.update(leaves(body, (*path, step), (*shown, step), key))
                if not body:
                    out[(*path, step)] = ((*shown, step), Shown("{}", {}))
        else:
            out[path] = (shown, flow(scalar(key, v) for v in value))
        return out
    out[path] = (shown, scalar(key, value))
    return out


def covered(path: Path, prefixes: Iterable[Path]) -> bool:
    """Whether a renderer that shows every field under one of ``prefixes`` shows ``path``."""
    return any(path[: len(p)] == p for p in prefixes)
