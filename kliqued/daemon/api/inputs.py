"""Input at the edge: every text and number a request brings is checked here, once, before a
handler sees it, so that nothing the event log cannot hold (or that would break a pass, a
listing or a worker) gets further than the request that brought it.

- A JSON body (``parse_body``) must be UTF-8, at most ``MAX_DEPTH`` deep, with finite numbers
  (no ``NaN``, ``Infinity``, ``1e400``) and integers that fit in 64 bits.
- No string anywhere (body, keys, query, path, the headers the API reads) may hold a lone
  UTF-16 surrogate (``"\\ud800"``): DuckDB cannot store it, and no client can print it.
- Names and ids (every string not listed below) hold no control character (C0, DEL, C1):
  they show up in listings, logs and terminals.
- Free text (``FREE_TEXT``: a command's arguments, a report's message, SQL) may hold tabs,
  newlines and other controls, but not NUL: no argv, C string or terminal can carry it.
- Data (``DATA``: a task's payload, any JSON the task's channel reads) may hold anything a
  JSON string can, NUL included, except a surrogate.

Every refusal is a 400 whose message starts with the JSON pointer (``/command/1``) or the
parameter it is about, and never echoes the offending character itself.
"""

from __future__ import annotations

import json
import math
import re
from functools import lru_cache
from typing import Any, Iterable, Mapping

from kliqued.daemon.errors import ApiError, bad_request

MAX_DEPTH = 32
"""Deepest nesting of arrays and objects in a body: far beyond any real payload, far below
what a recursive validator or encoder would choke on."""

INT_MAX = 2**63 - 1
"""Integers beyond 64 bits fit no column, no epoch and no exit code."""

FREE_TEXT: dict[str, tuple[str, ...]] = {
    "TaskSubmission": ("/command/*",),
    "TaskReport": ("/message",),
    "WorkerReports": ("/reports/*/message",),
    "LedgerSql": ("/sql",),
    "ScheduleCreate": ("/command/*", "/pipeline/text"),
    "PipelineRunRequest": ("/text",),
}
"""Per request schema: the JSON pointers (``*``: any one segment) of free text."""

DATA: dict[str, tuple[str, ...]] = {"TaskSubmission": ("/payload",)}
"""Per request schema: the JSON pointers of whole subtrees that are data."""

READ_HEADERS = ("Idempotency-Key",)
"""The request headers a handler reads and may store: checked as names."""

_SURROGATE = re.compile("[\ud800-\udfff]")
_FREE_BAD = re.compile("[\x00\ud800-\udfff]")
_NAME_BAD = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")

NAME, FREE, ANY = 0, 1, 2
_BAD = {NAME: _NAME_BAD, FREE: _FREE_BAD, ANY: _SURROGATE}


def describe(ch: str) -> str:
    """A refused character, named without writing it."""
    o = ord(ch)
    if 0xD800 <= o <= 0xDFFF:
        return f"a lone UTF-16 surrogate (U+{o:04X}), which is not text"
    if o == 0:
        return "a NUL character (U+0000)"
    return f"a control character (U+{o:04X})"


def _seg(key: str) -> str:
    """A JSON pointer segment (RFC 6901), refused characters shown as \\uXXXX."""
    key = key.replace("~", "~0").replace("/", "~1")
    return _NAME_BAD.sub(lambda m: f"\\u{ord(m.group()):04x}", key)


def _refuse(where: str, what: str, schema: str | None = None) -> None:
    details: dict[str, Any] = {"pointer": where}
    if schema is not None:
        details["schema"] = schema
    raise bad_request(f"{where or '(body)'}: {what}", details)


def check_text(where: str, value: str, kind: int = NAME) -> None:
    """Refuses ``value`` (found at ``where``) if it holds a character ``kind`` forbids."""
    m = _BAD[kind].search(value)
    if m is not None:
        allowed = {
            NAME: "names and ids hold no control characters",
            FREE: "text holds no NUL",
            ANY: "JSON text must be valid Unicode",
        }[kind]
        _refuse(where, f"contains {describe(m.group())} at character {m.start()}; {allowed}")


class _Rules:
    """Which kind of text each place of one schema's body holds."""

    def __init__(self, schema: str | None) -> None:
        self.free = [p.split("/")[1:] for p in FREE_TEXT.get(schema or "", ())]
        self.data = [p.split("/")[1:] for p in DATA.get(schema or "", ())]

    @staticmethod
    def _match(pattern: list[str], path: list[str]) -> bool:
        return len(pattern) == len(path) and all(p == "*" or p == s for p, s in zip(pattern, path))

    def kind(self, path: list[str]) -> int:
        for pat in self.data:
            if len(path) >= len(pat) and self._match(pat, path[: len(pat)]):
                return ANY
        return FREE if any(self._match(pat, path) for pat in self.free) else NAME


@lru_cache(maxsize=None)
def _rules(schema: str | None) -> _Rules:
    return _Rules(schema)


def parse_body(raw: bytes, schema: str | None = None) -> Any:
    """``raw`` as JSON, checked as the module docstring says (400 otherwise)."""
    if not raw:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(
            400, "invalid-json", f"the body is not UTF-8 (byte {exc.start})", {"pointer": ""}
        ) from None
    try:
        body = json.loads(text)
    except RecursionError:
        raise bad_request(
            f"the body is nested deeper than {MAX_DEPTH} levels", {"pointer": ""}
        ) from None
    except ValueError as exc:
        raise ApiError(
            400, "invalid-json", f"the body is not JSON: {str(exc)[:200]}", {"pointer": ""}
        ) from None
    check_tree(body, schema)
    return body


def check_tree(body: Any, schema: str | None = None) -> None:
    """Walks a parsed body without recursion (depth, numbers, text). A place's path is
    kept as a linked (parent, key) pair and spelled out only for a refusal or for a string
    that needs its kind (one with a non-ASCII or control character): ~15 us a submission."""
    rules = _rules(schema)
    stack: list[tuple[Any, Any, int]] = [(body, None, 0)]
    pop, push = stack.pop, stack.append
    while stack:
        value, node, depth = pop()
        t = type(value)
        if t is str:
            if not value.isascii() or _ASCII_CTRL.search(value) is not None:
                path = _unwind(node)
                check_text(_pointer(path), value, rules.kind(path))
        elif t is dict or t is list:
            if depth >= MAX_DEPTH:
                _refuse(_pointer(_unwind(node)), f"nested deeper than {MAX_DEPTH} levels", schema)
            if t is dict:
                for k, v in value.items():
                    if not k.isascii() or _ASCII_CTRL.search(k) is not None:
                        path = _unwind((node, k))  # keys are names, but in data
                        kind = ANY if rules.kind(path) == ANY else NAME
                        check_text(_pointer(path), k, kind)
                    if type(v) is not str or not v.isascii():
                        push((v, (node, k), depth + 1))
                    elif _ASCII_CTRL.search(v) is not None:
                        push((v, (node, k), depth + 1))
            else:
                for i, v in enumerate(value):
                    push((v, (node, str(i)), depth + 1))
        elif t is float:
            if not math.isfinite(value):
                _refuse(
                    _pointer(_unwind(node)),
                    "numbers must be finite (no NaN, Infinity or values beyond 1.8e308)",
                    schema,
                )
        elif t is int:
            if not -INT_MAX <= value <= INT_MAX:
                _refuse(_pointer(_unwind(node)), "integers must fit in 64 bits", schema)


def _unwind(node: Any) -> list[str]:
    """The path of a linked (parent, key) node, root first."""
    out: list[str] = []
    while node is not None:
        node, key = node
        out.append(key)
    out.reverse()
    return out


_ASCII_CTRL = re.compile("[\x00-\x1f\x7f]")


def _pointer(path: list[str]) -> str:
    return "".join("/" + _seg(p) for p in path)


def check_params(
    query: Mapping[str, str], path: Mapping[str, str], headers: Mapping[str, str]
) -> None:
    """The query string, the path's variables and the headers the API reads: names."""
    for k, v in _items(query):
        check_text("query parameter name", k)
        check_text(f"query parameter {_seg(k)}", v)
    for k, v in path.items():
        check_text(f"path segment {{{k}}}", v)
    for h in READ_HEADERS:
        header = headers.get(h)
        if header is not None:
            check_text(f"header {h}", header)


def _items(m: Mapping[str, str]) -> Iterable[tuple[str, str]]:
    items = getattr(m, "items", None)
    return items() if items is not None else ()
