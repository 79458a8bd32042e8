"""Safe YAML loading that keeps every position.

Estate files come from pull requests, so the loader treats them as untrusted: a size cap,
strict UTF-8, no tabs in indentation, no duplicate keys, and a cap on alias expansion (the
"billion laughs" attack) are checked here, each reported as a diagnostic with its place.
The ruamel.yaml round-trip tree is kept as is, because its ``.lc`` line/column data is how
every later error finds its way back to ``file:line:col``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from datetime import date, datetime
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.constructor import DuplicateKeyError, RoundTripConstructor
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.nodes import MappingNode, SequenceNode

from .diagnostics import Diagnostic, Position, error

MAX_FILE_BYTES = 10 * 1024 * 1024
MAX_NODES = 1_000_000
"""Nodes one file may expand to through aliases: far above any real estate (an XL estate of
10,000 compute resources is about 200,000), far below what exhausts memory."""
MAX_DEPTH = 64
"""Deepest nesting of mappings and sequences: an estate or a pipeline is a handful of levels
deep; far deeper only makes the recursive later stages (models, canonical JSON) fail."""
NODES_FLOOR = 10_000
NODES_PER_BYTE = 16
"""Aliases may expand a file to at most ``NODES_FLOOR + NODES_PER_BYTE * its size`` values
(and never past ``Limits.max_nodes``). Written out, a value takes at least two bytes, so no
file without aliases comes near it, and sharing a block among many items stays well within;
a few kilobytes of aliases of aliases ("billion laughs") are refused after tens of
thousands of values, not a million: every later stage's cost follows the expanded size."""


@dataclass(frozen=True)
class Limits:
    """The bounds of one kind of YAML file, checked by :func:`load_yaml` before anything else
    reads the tree. Every YAML the daemon parses goes through it with its kind's limits
    (``ESTATE`` here; pipelines: ``kliqued.schedule.pipeline.LIMITS``)."""

    max_bytes: int = MAX_FILE_BYTES
    max_nodes: int = MAX_NODES
    max_depth: int = MAX_DEPTH
    too_large_hint: str = "split the estate over several files"

    def nodes_for(self, size: int) -> int:
        """The values a file of ``size`` bytes may expand to through aliases."""
        return min(self.max_nodes, NODES_FLOOR + NODES_PER_BYTE * size)


ESTATE = Limits()


class _Constructor(RoundTripConstructor):
    """Keeps timestamps as their text: the models parse times themselves, strictly UTC."""


_Constructor.add_constructor(
    "tag:yaml.org,2002:timestamp",
    lambda loader, node: loader.construct_scalar(node),
)


def _yaml() -> YAML:
    y = YAML(typ="rt")
    y.Constructor = _Constructor
    y.allow_duplicate_keys = False
    return y


try:  # the C parser (ruamel.yaml.clib) composes an XL estate about 8x faster
    import ruamel.yaml.cyaml  # noqa: F401  (its import fails without ruamel.yaml.clib)

    HAVE_C_PARSER = True
except ImportError:  # pragma: no cover - the pure parser gives the same tree, slower
    HAVE_C_PARSER = False

_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_MERGE = "tag:yaml.org,2002:merge"


class _Duplicate(Exception):
    def __init__(self, key: object, first: tuple[int, int], second: tuple[int, int]) -> None:
        self.key, self.first, self.second = key, first, second


def _fast_load(text: str) -> Any:
    """Composes with the C parser and builds the same round-trip types the pure loader gives
    (CommentedMap/CommentedSeq with ``.lc`` positions), aliases kept as shared objects."""
    y = YAML(typ="safe", pure=False)
    node = y.compose(text)
    if node is None:
        return None
    constructor = y.constructor
    memo: dict[int, Any] = {}

    def build(n: Any) -> Any:
        if id(n) in memo:
            return memo[id(n)]
        if isinstance(n, MappingNode):
            m = CommentedMap()
            memo[id(n)] = m
            m._yaml_set_line_col(n.start_mark.line, n.start_mark.column)
            for k_node, v_node in n.value:
                if k_node.tag == _MERGE:
                    raise MarkedYAMLError(
                        problem="merge keys (<<) are not supported", problem_mark=k_node.start_mark
                    )
                key = build(k_node)
                if isinstance(key, (dict, list)):
                    raise MarkedYAMLError(
                        problem="a key must be a plain value", problem_mark=k_node.start_mark
                    )
                if key in m:
                    first = m.lc.key(key)
                    raise _Duplicate(key, first, (k_node.start_mark.line, k_node.start_mark.column))
                m[key] = build(v_node)
                m.lc.add_kv_line_col(
                    key,
                    [
                        k_node.start_mark.line,
                        k_node.start_mark.column,
                        v_node.start_mark.line,
                        v_node.start_mark.column,
                    ],
                )
            return m
        if isinstance(n, SequenceNode):
            seq = CommentedSeq()
            memo[id(n)] = seq
            seq._yaml_set_line_col(n.start_mark.line, n.start_mark.column)
            for i, item in enumerate(n.value):
                seq.append(build(item))
                seq.lc.add_kv_line_col(i, [item.start_mark.line, item.start_mark.column])
            return seq
        if n.tag == _TIMESTAMP:
            value: Any = str(n.value)
        else:
            value = constructor.construct_object(n, deep=True)
        memo[id(n)] = value
        return value

    return build(node)


@dataclass
class LoadedYaml:
    file: str
    root: Any = None
    diagnostics: list[Diagnostic] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(d.is_error for d in self.diagnostics)


def _decode(file: str, data: bytes) -> str | Diagnostic:
    """The text of ``data`` (a UTF-8 BOM dropped), or the diagnostic naming the bad byte."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = data[: exc.start]
        line = before.count(b"\n") + 1
        col = exc.start - (before.rfind(b"\n") + 1) + 1
        return error(
            "yaml-encoding",
            f"the file is not UTF-8: byte 0x{data[exc.start]:02x} cannot be decoded",
            Position(file, line, col),
            "save the file as UTF-8",
        )


def _tab_indents(file: str, text: str) -> list[Diagnostic]:
    diags = []
    for n, line in enumerate(text.splitlines(), start=1):
        stripped = line.lstrip(" \t")
        indent = line[: len(line) - len(stripped)]
        if "\t" in indent and stripped and not stripped.startswith("#"):
            diags.append(
                error(
                    "yaml-tab",
                    "a tab in the indentation: YAML indents with spaces only",
                    Position(file, n, indent.index("\t") + 1),
                    "replace the tab with spaces",
                )
            )
    return diags


def _mark_position(file: str, mark: Any) -> Position | None:
    if mark is None:
        return None
    return Position(file, mark.line + 1, mark.column + 1)


SAFE_NESTING = 5_000
"""Nesting the composers surely survive: libyaml's (through ruamel.yaml.clib) recurses in C
per level and crashes the whole process somewhere past 20,000 levels, so a file that might
go deeper is measured on the parser's events (flat) first."""


def _nesting_bound(text: str) -> int:
    """An upper bound on the file's nesting, at C speed: a flow level needs a ``[`` or
    ``{`` somewhere, and a block level is indented deeper than its parent (two levels per
    column at most, a sequence under a key at the key's column)."""
    widest = max(map(len, text.splitlines()), default=0)
    return text.count("[") + text.count("{") + 2 * widest + 2


def _too_deep(file: str, text: str, max_depth: int) -> Diagnostic | None:
    """Refuses nesting beyond ``max_depth`` before any composer sees the file (see
    ``SAFE_NESTING``); the events are read only when the cheap bound cannot rule it out."""
    if _nesting_bound(text) <= SAFE_NESTING:
        return None
    from ruamel.yaml.events import CollectionEndEvent, CollectionStartEvent

    depth = 0
    try:
        for ev in YAML(typ="safe", pure=not HAVE_C_PARSER).parse(text):
            if isinstance(ev, CollectionStartEvent):
                depth += 1
                if depth > max_depth:
                    return error(
                        "yaml-depth-limit",
                        f"the file nests deeper than {max_depth} levels",
                        _mark_position(file, ev.start_mark) or Position(file),
                        "flatten the nesting",
                    )
            elif isinstance(ev, CollectionEndEvent):
                depth -= 1
    except (YAMLError, ValueError):
        return None  # malformed: the loader below reports it with its place
    return None


def _load_tree(text: str) -> Any:
    """The C parser first; on any syntax error the pure YAML 1.2 parser decides, because
    libyaml is stricter in places (a time like 12:00 inside a flow mapping)."""
    if HAVE_C_PARSER:
        try:
            return _fast_load(text)
        except _Duplicate:
            raise
        except (YAMLError, ValueError):
            pass
    return _yaml().load(text)


def _size(n: int) -> str:
    if n >= 1048576:
        return f"{n / 1048576:.1f} MiB".replace(".0 MiB", " MiB")
    return f"{n / 1024:.1f} KiB".replace(".0 KiB", " KiB")


def load_yaml(file: str, data: bytes, limits: Limits = ESTATE) -> LoadedYaml:
    """Parse one file within ``limits``. Never raises for bad input: problems come back as
    diagnostics."""
    out = LoadedYaml(file)
    if len(data) > limits.max_bytes:
        out.diagnostics.append(
            error(
                "yaml-too-large",
                f"the file is {_size(len(data))}; the limit is {_size(limits.max_bytes)}",
                Position(file),
                limits.too_large_hint,
            )
        )
        return out
    text = _decode(file, data)
    if isinstance(text, Diagnostic):
        out.diagnostics.append(text)
        return out
    tabs = _tab_indents(file, text)
    if tabs:
        out.diagnostics.extend(tabs)
        return out
    deep = _too_deep(file, text, limits.max_depth)
    if deep is not None:
        out.diagnostics.append(deep)
        return out
    try:
        root = _load_tree(text)
    except _Duplicate as dup:
        out.diagnostics.append(
            error(
                "yaml-duplicate-key",
                f'duplicate key "{dup.key}": a key may appear once per mapping',
                Position(file, dup.second[0] + 1, dup.second[1] + 1),
                f"the first one is at {Position(file, dup.first[0] + 1, dup.first[1] + 1)}; "
                "remove or merge one",
            )
        )
        return out
    except DuplicateKeyError as exc:
        out.diagnostics.append(
            error(
                "yaml-duplicate-key",
                f"duplicate key {_duplicate_key_name(exc)}: a key may appear once per mapping",
                _mark_position(file, exc.problem_mark),
                f"the first one is at {_mark_position(file, exc.context_mark)}; remove or merge one",
            )
        )
        return out
    except MarkedYAMLError as exc:
        problem = (exc.problem or exc.context or "malformed YAML").strip()[:300]
        out.diagnostics.append(
            error(
                "yaml-syntax",
                f"malformed YAML: {problem}",
                _mark_position(file, exc.problem_mark or exc.context_mark) or Position(file),
            )
        )
        return out
    except RecursionError:
        out.diagnostics.append(
            error(
                "yaml-depth-limit",
                f"the file nests deeper than {limits.max_depth} levels",
                Position(file),
                "flatten the nesting",
            )
        )
        return out
    except (YAMLError, ValueError) as exc:
        out.diagnostics.append(
            error("yaml-syntax", f"malformed YAML: {str(exc)[:300]}", Position(file))
        )
        return out
    size_diag = check_expansion(file, root, limits.nodes_for(len(data)), limits.max_depth)
    if size_diag is not None:
        out.diagnostics.append(size_diag)
        return out
    out.root = root
    return out


def load_yaml_path(path: str, code: str = "yaml-read", limits: Limits = ESTATE) -> LoadedYaml:
    """Reads and parses one file; an unreadable file is a diagnostic (``code``) too."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        return LoadedYaml(
            path, None, [error(code, f"cannot read: {exc.strerror or exc}", Position(path))]
        )
    return load_yaml(path, data, limits)


def _duplicate_key_name(exc: DuplicateKeyError) -> str:
    text = str(exc.problem or "")
    # ruamel says: found duplicate key "name" with value "x" (original value: "y")
    if 'key "' in text:
        return '"' + text.split('key "', 1)[1].split('"', 1)[0] + '"'
    return "found"


def check_expansion(
    file: str, root: Any, max_nodes: int = MAX_NODES, max_depth: int = MAX_DEPTH
) -> Diagnostic | None:
    """Counts the nodes the tree expands to (aliases included) up to ``max_nodes``, checks
    the nesting up to ``max_depth``, and finds aliases that contain themselves; each would
    make later stages loop, recurse too deep or exhaust memory. It stops at the first
    excess, so its own cost is bounded by the limits, and it names the mapping or sequence
    where the excess was reached (the alias's place)."""
    count = 0
    stack: list[tuple[Any, int, Any]] = [(root, 0, root)]
    on_path: dict[int, int] = {}
    path: list[int] = []
    while stack:
        node, depth, parent = stack.pop()
        while len(path) > depth:
            on_path.pop(path.pop(), None)
        count += 1
        container = isinstance(node, (dict, list))
        if count > max_nodes:
            return error(
                "yaml-alias-limit",
                f"the file expands to more than {max_nodes:,} values through aliases "
                f"(the alias limit for a file of its size)",
                _node_position(file, node if container else parent),
                "write the values out, or use fewer nested aliases",
            )
        if container:
            if depth >= max_depth:
                return error(
                    "yaml-depth-limit",
                    f"the file nests deeper than {max_depth} levels",
                    _node_position(file, node),
                    "flatten the nesting",
                )
            if id(node) in on_path:
                return error(
                    "yaml-alias-limit",
                    "an alias refers to a node that contains it",
                    _node_position(file, node),
                    "remove the recursive alias",
                )
            on_path[id(node)] = depth
            path.append(id(node))
            children = node.values() if isinstance(node, dict) else node
            for child in children:
                stack.append((child, depth + 1, node))
    return None


def _node_position(file: str, node: Any) -> Position:
    lc = getattr(node, "lc", None)
    if lc is not None and lc.line is not None:
        return Position(file, lc.line + 1, lc.col + 1)
    return Position(file)


def to_plain(node: Any) -> Any:
    """The ruamel tree as plain dicts, lists and scalars (ints, floats, strs, bools, None)."""
    if isinstance(node, dict):
        return {
            str(k) if not isinstance(k, (int, float, bool)) else k: to_plain(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [to_plain(v) for v in node]
    if isinstance(node, bool):
        return bool(node)
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    if isinstance(node, str):
        return str(node)
    if isinstance(node, (datetime, date)):
        return node.isoformat()
    return node


def position_of(file: str, root: Any, path: tuple[Any, ...], *, key: bool = False) -> Position:
    """The deepest known place of ``path`` below ``root``: the value, or with ``key`` the key
    itself (an unknown field is reported at its name)."""
    node = root
    best = _node_position(file, root)
    for i, step in enumerate(path):
        last = i == len(path) - 1
        if isinstance(node, CommentedMap) and step in node:
            try:
                line, col = node.lc.key(step) if (last and key) else node.lc.value(step)
                best = Position(file, line + 1, col + 1)
            except (KeyError, TypeError):
                pass
            node = node[step]
        elif isinstance(node, CommentedSeq) and isinstance(step, int) and 0 <= step < len(node):
            try:
                line, col = node.lc.item(step)
                best = Position(file, line + 1, col + 1)
            except (KeyError, TypeError):
                pass
            node = node[step]
        else:
            break
    return best
