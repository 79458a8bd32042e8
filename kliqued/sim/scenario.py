"""Loading a scenario (scenarios.md) into a checked, runnable plan.

Everything that can make a scenario invalid is found here, before any simulated time passes,
so an invalid file exits 2 with every problem and its ``file:line`` and nothing half-run: the
estate and every ``set`` are compiled up front (each ``set`` against the estate as it stands
at that event), and each submission is checked against the estate in force when it happens,
with the same rule the daemon uses (``engine.check_submission``).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ruamel.yaml.comments import CommentedMap, CommentedSeq

from compiler.api import Document, compile_documents, read_dir, EstateReadError
from compiler.compiled import CompiledEstate
from compiler.diagnostics import Diagnostic, Position, error
from compiler.loader import load_yaml, load_yaml_path
from compiler.units import parse_duration, parse_time, to_milli
from klique_util.units import DAY_S, HOUR_S, MINUTE_S, SECOND_MS, to_ms

from kliqued.engine import EstateIndex, SubmissionError, check_submission

from .kinds import KINDS, BadValue, Known

DEFAULT_START = "2026-01-05T00:00:00Z"
EXPECT_KEYS = tuple(KINDS)
ROOT_KEYS = {"name", "estate", "start", "events", "expect", "description"}
SUBMIT_FIELDS = {"resource", "user", "project", "id", "count", "gpus", "runtime", "checkpoint"}
EVENT_KINDS = "submit, finish, cancel, set, engine, workers"
SET_SECTIONS = ("pools", "profiles", "policies", "groups", "pricing", "settings")


@dataclass
class Submit:
    resource: str
    user: str
    project: str | None
    ids: list[str]
    gpus_milli: int | None
    runtime_ms: int | None
    checkpoint_ms: int | None


@dataclass
class Event:
    at: int
    """Milliseconds since the epoch."""
    line: int
    kind: str
    """submit | finish | cancel | set | engine | workers"""
    submit: Submit | None = None
    tasks: list[str] = field(default_factory=list)
    enabled: bool = True
    changes: dict[str, Any] = field(default_factory=dict)
    estate: CompiledEstate | None = None
    """For ``set``: the estate after the change."""
    workers: dict[str, int] = field(default_factory=dict)
    """For ``workers``: milli-GPUs of the live workers of each pool named (0: none)."""


@dataclass
class Expectation:
    at: int
    line: int
    checks: dict[str, dict[str, Any]]
    lines: dict[tuple[str, str], int]


@dataclass
class Scenario:
    file: str
    name: str
    start: int
    estate: CompiledEstate
    events: list[Event]
    expectations: list[Expectation]
    warnings: list[Diagnostic] = field(default_factory=list)

    def offset(self, t: int) -> str:
        """``+1h30m``: a time as the offset from the start, as scenarios are written."""
        d = (t - self.start) // SECOND_MS
        if d == 0 and t == self.start:
            return "+0s"
        sign = "-" if d < 0 else "+"
        d = abs(d)
        parts = []
        for unit, size in (("d", DAY_S), ("h", HOUR_S), ("m", MINUTE_S), ("s", 1)):
            if d >= size:
                parts.append(f"{d // size}{unit}")
                d %= size
        ms = (t - self.start) % SECOND_MS
        text = "".join(parts) or "0s"
        if ms:
            text += f"{ms}ms"
        return sign + text


class ScenarioError(Exception):
    def __init__(self, diagnostics: list[Diagnostic]) -> None:
        super().__init__("\n".join(d.render() for d in diagnostics))
        self.diagnostics = diagnostics


def _line(node: Any, key: Any = None) -> int:
    try:
        if key is None:
            return node.lc.line + 1
        if isinstance(node, CommentedSeq):
            return node.lc.item(key)[0] + 1
        return node.lc.value(key)[0] + 1
    except Exception:
        return 0


_COMPOUND = re.compile(r"^(\d+d)?(\d+h)?(\d+m)?(\d+s)?$")


def parse_offset(value: Any) -> int:
    """A duration in seconds: estate.md's forms, and compounds such as ``2h30m`` (a
    scenario's timeline reads more naturally with them)."""
    try:
        return parse_duration(value)
    except ValueError:
        if isinstance(value, str):
            m = _COMPOUND.match(value.strip())
            if m and any(m.groups()):
                return sum(parse_duration(g) for g in m.groups() if g)
        raise


class _Loader:
    def __init__(self, path: str) -> None:
        self.file = path
        self.diags: list[Diagnostic] = []

    def err(self, line: int, message: str, hint: str | None = None) -> None:
        self.diags.append(error("scenario", message, Position(self.file, line), hint))

    # ------------------------------------------------------------------ values
    def time(self, value: Any, start: int, line: int) -> int | None:
        if isinstance(value, str) and "T" in value.upper() and "-" in value:
            try:
                return to_ms(parse_time(value))
            except ValueError as exc:
                self.err(line, f"unparsable time {value!r}: {exc}")
                return None
        try:
            return start + parse_offset(value) * SECOND_MS
        except ValueError:
            self.err(
                line,
                f"unparsable time {value!r}",
                "an offset from start such as 30s, 15m, 2h, 1d, or an RFC 3339 time",
            )
            return None

    def duration_ms(self, value: Any, line: int, what: str) -> int | None:
        try:
            return parse_offset(value) * SECOND_MS
        except ValueError as exc:
            self.err(line, f"{what}: {exc}")
            return None

    def ids(self, value: Any, line: int) -> list[str]:
        if isinstance(value, str):
            return [value]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
        self.err(line, "expected a task id or a list of task ids")
        return []

    # ------------------------------------------------------------------ estate
    def estate_docs(self, value: Any, line: int) -> list[Document] | None:
        base = Path(self.file).parent
        if isinstance(value, CommentedMap):
            return [Document(self.file, value)]
        if isinstance(value, str):
            target = base / value
            try:
                files = read_dir(target)
            except EstateReadError as exc:
                self.err(line, f"estate: {exc}")
                return None
            docs = []
            for f in files:
                loaded = load_yaml(f.path, f.data)
                self.diags.extend(d for d in loaded.diagnostics if d.is_error)
                if loaded.ok and loaded.root is not None:
                    docs.append(Document(f.path, loaded.root))
            if not files:
                self.err(line, f"estate: no *.yaml or *.yml under {target}")
                return None
            return docs
        self.err(line, "estate: expected a mapping (inline estate) or a path")
        return None

    def compile(self, docs: list[Document], line: int, what: str) -> CompiledEstate | None:
        result = compile_documents(docs)
        if not result.ok:
            errs = [d for d in result.diagnostics if d.is_error]
            self.err(
                line,
                f"{what} makes the estate invalid ({len(errs)} "
                f"error{'s' if len(errs) != 1 else ''}):",
            )
            self.diags.extend(errs)
            return None
        return result.estate

    def apply_set(self, docs: list[Document], path: str, value: Any, line: int) -> bool:
        parts = str(path).split(".")
        section = parts[0]
        if section not in SET_SECTIONS:
            self.err(
                line,
                f"set {path}: unknown section {section!r}",
                f"one of {', '.join(SET_SECTIONS)}",
            )
            return False
        if section == "settings":
            target = None
            for d in docs:
                if isinstance(d.root, dict) and isinstance(d.root.get("settings"), dict):
                    target = d.root["settings"]
                    break
            if target is None:
                target = CommentedMap()
                docs[0].root["settings"] = target
            fields = parts[1:]
        else:
            if len(parts) < 3:
                self.err(line, f"set {path}: expected <section>.<name>.<field>")
                return False
            name = parts[1]
            target = None
            key = "gpu_type" if section == "pricing" else "name"
            for d in docs:
                items = d.root.get(section) if isinstance(d.root, dict) else None
                for item in items or []:
                    if isinstance(item, dict) and str(item.get(key)) == name:
                        target = item
                        break
                if target is not None:
                    break
            if target is None:
                self.err(
                    line,
                    f"set {path}: no {section[:-1] if section != 'pricing' else 'price'}"
                    f" named {name!r} in the estate",
                )
                return False
            fields = parts[2:]
        if not fields:
            self.err(line, f"set {path}: no field given")
            return False
        for f in fields[:-1]:
            nxt = target.get(f)
            if not isinstance(nxt, dict):
                nxt = CommentedMap()
                target[f] = nxt
            target = nxt
        if value is None:
            target.pop(fields[-1], None)
        else:
            target[fields[-1]] = copy.deepcopy(value)
        return True


def load_scenario(path: str) -> Scenario:
    """The scenario at ``path``, checked; raises ScenarioError listing every problem."""
    ld = _Loader(path)
    root = _read_root(path)
    for k in root:
        if k not in ROOT_KEYS:
            ld.err(_line(root, k), f"unknown key {k!r}", f"one of {', '.join(sorted(ROOT_KEYS))}")
    name = str(root.get("name") or Path(path).stem)
    start = _start(ld, root)
    docs, estate = _estate(ld, root)
    timeline = _Timeline(ld, start, docs, estate)
    for i, ev in enumerate(_list(ld, root, "events")):
        timeline.event(ev, _line(root["events"], i))
    known = timeline.known()
    expectations = []
    for i, ex in enumerate(_list(ld, root, "expect")):
        exp = _expectation(ld, ex, _line(root["expect"], i), start, known)
        if exp is not None:
            expectations.append(exp)
    if ld.diags:
        raise ScenarioError(ld.diags)
    expectations.sort(key=lambda x: x.at)  # stable: same-time ones keep file order
    return Scenario(path, name, start, estate, timeline.events, expectations, [])


def _read_root(path: str) -> CommentedMap:
    """The file's top mapping; a file that is not YAML or not a mapping stops here."""
    loaded = load_yaml_path(path, "scenario")
    if not loaded.ok:
        raise ScenarioError([d for d in loaded.diagnostics if d.is_error])
    if not isinstance(loaded.root, CommentedMap):
        raise ScenarioError(
            [
                error(
                    "scenario",
                    "a scenario is a mapping with estate, events and expect",
                    Position(path, 1),
                )
            ]
        )
    return loaded.root


def _start(ld: _Loader, root: CommentedMap) -> int:
    """``start``, or the default start (a Monday) when absent or unparsable."""
    try:
        return to_ms(parse_time(root.get("start", DEFAULT_START)))
    except ValueError as exc:
        ld.err(_line(root, "start"), f"unparsable start time: {exc}")
        return to_ms(parse_time(DEFAULT_START))


def _estate(ld: _Loader, root: CommentedMap) -> tuple[list[Document], CompiledEstate]:
    """The estate's documents and their compilation; without a valid estate nothing else
    can be checked, so a problem here stops the load."""
    if "estate" not in root:
        ld.err(1, "no estate", "an inline estate mapping or a path to one")
        raise ScenarioError(ld.diags)
    docs = ld.estate_docs(root["estate"], _line(root, "estate"))
    if docs is None:
        raise ScenarioError(ld.diags)
    estate = ld.compile(docs, _line(root, "estate"), "the scenario's estate")
    if estate is None:
        raise ScenarioError(ld.diags)
    return docs, estate


def _list(ld: _Loader, root: CommentedMap, key: str) -> list[Any]:
    """``events`` or ``expect``: a list, or empty (with an error when it is something else)."""
    value = root.get(key) or []
    if not isinstance(value, list):
        ld.err(_line(root, key), f"{key}: expected a list")
        return []
    return value


class _Timeline:
    """The events read so far, with what each later event is checked against: the estate in
    force (after the ``set`` events before it), the task ids submitted, the last time."""

    def __init__(
        self, ld: _Loader, start: int, docs: list[Document], estate: CompiledEstate
    ) -> None:
        self.ld = ld
        self.start = start
        self.docs = docs
        self.estates = [estate]
        self.index = EstateIndex.build(estate)
        self.submitted: set[str] = set()
        self.last_at: int | None = None
        self.events: list[Event] = []

    def known(self) -> Known:
        """Every name the scenario defines, for its expectations."""
        return Known(
            {g.name for e in self.estates for g in e.groups},
            {p.name for e in self.estates for p in e.pools},
            {c.name for e in self.estates for c in e.compute_resources},
            self.submitted,
            {p.name for e in self.estates for p in e.policies},
        )

    def event(self, ev: Any, line: int) -> None:
        """One entry of ``events``: its time, then each of its actions in file order."""
        ld = self.ld
        if not isinstance(ev, CommentedMap) or "at" not in ev:
            ld.err(line, f"an event is a mapping with `at` and one of {EVENT_KINDS}")
            return
        at = ld.time(ev["at"], self.start, _line(ev, "at"))
        if at is None:
            return
        if self.last_at is not None and at < self.last_at:
            ld.err(
                line,
                "events out of time order: this one is earlier than the one before",
                "list events in time order",
            )
        self.last_at = at if self.last_at is None else max(self.last_at, at)
        actions = [k for k in ev if k != "at"]
        if not actions:
            ld.err(line, f"an event needs one of {EVENT_KINDS}")
        for k in actions:
            kline = _line(ev, k)
            read = self.READERS.get(k)
            if read is None:
                ld.err(kline, f"unknown event {k!r}", f"one of {EVENT_KINDS}")
                continue
            event = read(self, k, ev[k], at, kline)
            if event is not None:
                self.events.append(event)

    def _submit(self, k: str, v: Any, at: int, kline: int) -> Event | None:
        """``submit``: its fields, checked with the daemon's rule against the estate in force;
        ``count`` tasks ``<id>-1`` .. ``<id>-<count>``."""
        ld = self.ld
        if not isinstance(v, CommentedMap):
            ld.err(kline, "submit: expected a mapping")
            return None
        for f in v:
            if f not in SUBMIT_FIELDS:
                ld.err(
                    _line(v, f),
                    f"submit: unknown field {f!r}",
                    f"one of {', '.join(sorted(SUBMIT_FIELDS))}",
                )
        missing = [f for f in ("resource", "user", "id") if f not in v]
        if missing:
            ld.err(kline, f"submit: missing {', '.join(missing)}")
            return None
        count = v.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            ld.err(_line(v, "count"), "submit: count must be a whole number >= 1")
            return None
        gpus = None
        if "gpus" in v:
            try:
                gpus = to_milli(v["gpus"], "gpus")
            except ValueError as exc:
                ld.err(_line(v, "gpus"), f"submit: {exc}")
                return None
        runtime = (
            ld.duration_ms(v["runtime"], _line(v, "runtime"), "runtime") if "runtime" in v else None
        )
        ckpt = (
            ld.duration_ms(v["checkpoint"], _line(v, "checkpoint"), "checkpoint")
            if "checkpoint" in v
            else None
        )
        resource = str(v["resource"])
        user = str(v["user"])
        project = str(v["project"]) if v.get("project") is not None else None
        try:
            check_submission(self.index, resource, user, project, gpus)
        except SubmissionError as exc:
            ld.err(_line(v, exc.field) or kline, f"submit: {exc}")
            return None
        base = str(v["id"])
        ids = [f"{base}-{n}" for n in range(1, count + 1)]
        for tid in ids:
            if tid in self.submitted:
                ld.err(_line(v, "id"), f"submit: task id {tid!r} is already used")
        self.submitted.update(ids)
        return Event(
            at,
            kline,
            "submit",
            submit=Submit(resource, user, project, ids, gpus, runtime, ckpt or None),
        )

    def _tasks(self, k: str, v: Any, at: int, kline: int) -> Event:
        """``finish`` and ``cancel``: task ids an earlier submit created."""
        ids = self.ld.ids(v, kline)
        for tid in ids:
            if tid not in self.submitted:
                self.ld.err(
                    kline,
                    f"{k}: unknown task id {tid!r}",
                    "a task is known once an earlier submit created it",
                )
        return Event(at, kline, k, tasks=ids)

    def _engine(self, k: str, v: Any, at: int, kline: int) -> Event | None:
        """``engine: disabled | enabled``."""
        if v not in ("disabled", "enabled"):
            self.ld.err(kline, f"engine: expected disabled or enabled, found {v!r}")
            return None
        return Event(at, kline, "engine", enabled=v == "enabled")

    def _set(self, k: str, v: Any, at: int, kline: int) -> Event | None:
        """``set``: the changes applied to a copy of the estate in force, which must compile;
        later events are checked against the result."""
        ld = self.ld
        if not isinstance(v, CommentedMap) or not v:
            ld.err(kline, "set: expected a mapping of <section>.<name>.<field>: value")
            return None
        new_docs = [Document(d.file, copy.deepcopy(d.root)) for d in self.docs]
        ok = all([ld.apply_set(new_docs, str(p), val, _line(v, p)) for p, val in v.items()])
        if not ok:
            return None
        new = ld.compile(new_docs, kline, "this set")
        if new is None:
            return None
        self.docs = new_docs
        self.estates.append(new)
        self.index = EstateIndex.build(new)
        return Event(at, kline, "set", changes=dict(v), estate=new)

    def _workers(self, k: str, v: Any, at: int, kline: int) -> Event | None:
        """``workers: {pool: GPUs}``: the GPUs of the pool's live workers from now on (0: no
        live worker, so the pool takes no new placements). A pool never named has workers for
        all of its capacity, so its tasks start once placed."""
        ld = self.ld
        if not isinstance(v, CommentedMap) or not v:
            ld.err(kline, "workers: expected a mapping of <pool>: <GPUs of its live workers>")
            return None
        out: dict[str, int] = {}
        for pool, gpus in v.items():
            pline = _line(v, pool) or kline
            if str(pool) not in self.index.pools:
                ld.err(
                    pline,
                    f"workers: unknown pool {pool!r}",
                    f"one of {', '.join(sorted(self.index.pools))}",
                )
                continue
            try:
                out[str(pool)] = to_milli(gpus, f"workers.{pool}")
            except ValueError as exc:
                ld.err(pline, f"workers: {exc}")
        return Event(at, kline, "workers", workers=out) if len(out) == len(v) else None

    READERS: dict[str, Callable[[_Timeline, str, Any, int, int], Event | None]] = {
        "submit": _submit,
        "finish": _tasks,
        "cancel": _tasks,
        "engine": _engine,
        "set": _set,
        "workers": _workers,
    }
    """Each event kind's reader: adding a kind is one method and one entry."""


def _expectation(ld: _Loader, ex: Any, line: int, start: int, known: Known) -> Expectation | None:
    """One entry of ``expect``: its time and, for each kind, the names and values checked
    by the kind's entry in kinds.KINDS."""
    if not isinstance(ex, CommentedMap) or "at" not in ex:
        ld.err(line, "an expectation is a mapping with `at` and what to check")
        return None
    at = ld.time(ex["at"], start, _line(ex, "at"))
    if at is None:
        return None
    checks: dict[str, dict[str, Any]] = {}
    lines: dict[tuple[str, str], int] = {}
    for k, v in ex.items():
        if k == "at":
            continue
        kline = _line(ex, k)
        if k not in KINDS:
            ld.err(kline, f"unknown expectation {k!r}", f"one of {', '.join(EXPECT_KEYS)}")
            continue
        if not isinstance(v, CommentedMap):
            ld.err(kline, f"{k}: expected a mapping")
            continue
        checks[k] = {}
        for name, val in v.items():
            name = str(name)
            vline = _line(v, name) or kline
            lines[(k, name)] = vline
            parsed = _expected(ld, k, name, val, vline, known)
            if parsed is not _UNUSABLE:
                checks[k][name] = parsed
    return Expectation(at, line, checks, lines)


_UNUSABLE = object()


def _expected(ld: _Loader, kind: str, name: str, val: Any, line: int, known: Known) -> Any:
    """One ``kind: {name: value}`` entry: the name must be one the scenario defines and the
    value one the kind accepts; the value as the kind's check compares it."""
    spec = KINDS[kind]
    if name not in known.of(spec.subject):
        ld.err(line, f"{kind}: unknown {spec.subject} {name!r}")
    try:
        val = spec.parse(known, f"{kind}.{name}", val, lambda msg: ld.err(line, msg))
    except BadValue as exc:
        ld.err(line, str(exc))
        return _UNUSABLE
    return list(val) if isinstance(val, CommentedSeq) else val
