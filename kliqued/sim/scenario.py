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
from typing import Any

from ruamel.yaml.comments import CommentedMap, CommentedSeq

from compiler.api import Document, compile_documents, read_dir, EstateReadError
from compiler.compiled import CompiledEstate
from compiler.diagnostics import Diagnostic, Position, error
from compiler.loader import load_yaml, load_yaml_path
from compiler.units import parse_duration, parse_time, to_milli

from kliqued.engine import EstateIndex, SubmissionError, check_submission
from kliqued.engine.periods import to_ms

DEFAULT_START = "2026-01-05T00:00:00Z"
EXPECT_KEYS = ("running", "pools", "tasks", "placed_on", "queue", "preempted", "budget_used",
               "gpu_hours", "waiting_reason", "started")
TASK_STATES = ("placed", "queued", "ended")
REASON_KINDS = ("order", "limit", "budget", "capacity", "pending")
PREEMPT_KINDS = ("reclaimed", "budget", "unstarted")
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
        d = (t - self.start) // 1000
        if d == 0 and t == self.start:
            return "+0s"
        sign = "-" if d < 0 else "+"
        d = abs(d)
        parts = []
        for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
            if d >= size:
                parts.append(f"{d // size}{unit}")
                d %= size
        ms = (t - self.start) % 1000
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
            return start + parse_offset(value) * 1000
        except ValueError:
            self.err(line, f"unparsable time {value!r}",
                     "an offset from start such as 30s, 15m, 2h, 1d, or an RFC 3339 time")
            return None

    def duration_ms(self, value: Any, line: int, what: str) -> int | None:
        try:
            return parse_offset(value) * 1000
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
            self.err(line, f"{what} makes the estate invalid ({len(errs)} "
                           f"error{'s' if len(errs) != 1 else ''}):")
            self.diags.extend(errs)
            return None
        return result.estate

    def apply_set(self, docs: list[Document], path: str, value: Any, line: int) -> bool:
        parts = str(path).split(".")
        section = parts[0]
        if section not in SET_SECTIONS:
            self.err(line, f"set {path}: unknown section {section!r}",
                     f"one of {', '.join(SET_SECTIONS)}")
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
                self.err(line, f"set {path}: no {section[:-1] if section != 'pricing' else 'price'}"
                               f" named {name!r} in the estate")
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
    loaded = load_yaml_path(path, "scenario")
    if not loaded.ok:
        raise ScenarioError([d for d in loaded.diagnostics if d.is_error])
    root = loaded.root
    if not isinstance(root, CommentedMap):
        raise ScenarioError([error("scenario", "a scenario is a mapping with estate, events "
                                   "and expect", Position(path, 1))])
    known = {"name", "estate", "start", "events", "expect", "description"}
    for k in root:
        if k not in known:
            ld.err(_line(root, k), f"unknown key {k!r}", f"one of {', '.join(sorted(known))}")
    sc_name = str(root.get("name") or Path(path).stem)
    start_v = root.get("start", DEFAULT_START)
    try:
        start = to_ms(parse_time(start_v))
    except ValueError as exc:
        ld.err(_line(root, "start"), f"unparsable start time: {exc}")
        start = to_ms(parse_time(DEFAULT_START))
    if "estate" not in root:
        ld.err(1, "no estate", "an inline estate mapping or a path to one")
        raise ScenarioError(ld.diags)
    docs = ld.estate_docs(root["estate"], _line(root, "estate"))
    if docs is None:
        raise ScenarioError(ld.diags)
    estate = ld.compile(docs, _line(root, "estate"), "the scenario's estate")
    if estate is None:
        raise ScenarioError(ld.diags)
    warnings: list[Diagnostic] = []

    events: list[Event] = []
    cur_index = EstateIndex.build(estate)
    submitted: set[str] = set()
    last_at: int | None = None
    raw_events = root.get("events") or []
    if not isinstance(raw_events, list):
        ld.err(_line(root, "events"), "events: expected a list")
        raw_events = []
    for i, ev in enumerate(raw_events):
        line = _line(raw_events, i)
        if not isinstance(ev, CommentedMap) or "at" not in ev:
            ld.err(line, "an event is a mapping with `at` and one of submit, finish, cancel, "
                         "set, engine, workers")
            continue
        at = ld.time(ev["at"], start, _line(ev, "at"))
        if at is None:
            continue
        if last_at is not None and at < last_at:
            ld.err(line, "events out of time order: this one is earlier than the one before",
                   "list events in time order")
        last_at = at if last_at is None else max(last_at, at)
        actions = [k for k in ev if k != "at"]
        if not actions:
            ld.err(line, "an event needs one of submit, finish, cancel, set, engine, workers")
        for k in actions:
            v = ev[k]
            kline = _line(ev, k)
            if k == "submit":
                if not isinstance(v, CommentedMap):
                    ld.err(kline, "submit: expected a mapping")
                    continue
                allowed = {"resource", "user", "project", "id", "count", "gpus", "runtime",
                           "checkpoint"}
                for f in v:
                    if f not in allowed:
                        ld.err(_line(v, f), f"submit: unknown field {f!r}",
                               f"one of {', '.join(sorted(allowed))}")
                missing = [f for f in ("resource", "user", "id") if f not in v]
                if missing:
                    ld.err(kline, f"submit: missing {', '.join(missing)}")
                    continue
                count = v.get("count", 1)
                if not isinstance(count, int) or isinstance(count, bool) or count < 1:
                    ld.err(_line(v, "count"), "submit: count must be a whole number >= 1")
                    continue
                gpus = None
                if "gpus" in v:
                    try:
                        gpus = to_milli(v["gpus"], "gpus")
                    except ValueError as exc:
                        ld.err(_line(v, "gpus"), f"submit: {exc}")
                        continue
                runtime = (ld.duration_ms(v["runtime"], _line(v, "runtime"), "runtime")
                           if "runtime" in v else None)
                ckpt = (ld.duration_ms(v["checkpoint"], _line(v, "checkpoint"), "checkpoint")
                        if "checkpoint" in v else None)
                if ckpt == 0:
                    ckpt = None
                resource = str(v["resource"])
                user = str(v["user"])
                project = str(v["project"]) if v.get("project") is not None else None
                try:
                    check_submission(cur_index, resource, user, project, gpus)
                except SubmissionError as exc:
                    field_ = ("resource" if "compute resource" in str(exc) else
                              "user" if "user" in str(exc) else
                              "project" if "project" in str(exc) else "gpus")
                    ld.err(_line(v, field_) or kline, f"submit: {exc}")
                    continue
                base = str(v["id"])
                ids = [f"{base}-{n}" for n in range(1, count + 1)]
                for tid in ids:
                    if tid in submitted:
                        ld.err(_line(v, "id"), f"submit: task id {tid!r} is already used")
                submitted.update(ids)
                events.append(Event(at, kline, "submit", submit=Submit(
                    resource, user, project, ids, gpus, runtime, ckpt)))
            elif k in ("finish", "cancel"):
                ids = ld.ids(v, kline)
                for tid in ids:
                    if tid not in submitted:
                        ld.err(kline, f"{k}: unknown task id {tid!r}",
                               "a task is known once an earlier submit created it")
                events.append(Event(at, kline, k, tasks=ids))
            elif k == "engine":
                if v not in ("disabled", "enabled"):
                    ld.err(kline, f"engine: expected disabled or enabled, found {v!r}")
                    continue
                events.append(Event(at, kline, "engine", enabled=v == "enabled"))
            elif k == "set":
                if not isinstance(v, CommentedMap) or not v:
                    ld.err(kline, "set: expected a mapping of <section>.<name>.<field>: value")
                    continue
                new_docs = [Document(d.file, copy.deepcopy(d.root)) for d in docs]
                ok = all([ld.apply_set(new_docs, str(p), val, _line(v, p))
                          for p, val in v.items()])
                if not ok:
                    continue
                new = ld.compile(new_docs, kline, "this set")
                if new is None:
                    continue
                docs = new_docs
                cur_index = EstateIndex.build(new)
                events.append(Event(at, kline, "set", changes=dict(v), estate=new))
            elif k == "workers":
                w = _workers(ld, v, kline, cur_index)
                if w is not None:
                    events.append(Event(at, kline, "workers", workers=w))
            else:
                ld.err(kline, f"unknown event {k!r}",
                       "one of submit, finish, cancel, set, engine, workers")

    expectations: list[Expectation] = []
    raw_expect = root.get("expect") or []
    if not isinstance(raw_expect, list):
        ld.err(_line(root, "expect"), "expect: expected a list")
        raw_expect = []
    all_groups = {g.name for g in estate.groups}
    all_pools = {p.name for p in estate.pools}
    all_crs = {c.name for c in estate.compute_resources}
    for e in events:
        if e.estate is not None:
            all_groups |= {g.name for g in e.estate.groups}
            all_pools |= {p.name for p in e.estate.pools}
            all_crs |= {c.name for c in e.estate.compute_resources}
    for i, ex in enumerate(raw_expect):
        line = _line(raw_expect, i)
        if not isinstance(ex, CommentedMap) or "at" not in ex:
            ld.err(line, "an expectation is a mapping with `at` and what to check")
            continue
        at = ld.time(ex["at"], start, _line(ex, "at"))
        if at is None:
            continue
        checks: dict[str, dict[str, Any]] = {}
        lines: dict[tuple[str, str], int] = {}
        for k, v in ex.items():
            if k == "at":
                continue
            kline = _line(ex, k)
            if k not in EXPECT_KEYS:
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
                if k in ("running", "budget_used", "gpu_hours") and name not in all_groups:
                    ld.err(vline, f"{k}: unknown group {name!r}")
                elif k == "pools" and name not in all_pools:
                    ld.err(vline, f"pools: unknown pool {name!r}")
                elif k == "queue" and name not in all_crs:
                    ld.err(vline, f"queue: unknown compute resource {name!r}")
                elif k in ("tasks", "placed_on", "preempted", "waiting_reason", "started") \
                        and name not in submitted:
                    ld.err(vline, f"{k}: unknown task id {name!r}")
                if k in ("running", "pools", "budget_used", "gpu_hours"):
                    if isinstance(val, bool) or not isinstance(val, (int, float)):
                        ld.err(vline, f"{k}.{name}: expected a number, found {val!r}")
                        continue
                    val = float(val)
                elif k == "tasks" and val not in TASK_STATES:
                    ld.err(vline, f"tasks.{name}: expected one of {', '.join(TASK_STATES)}")
                elif k == "placed_on" and str(val) not in all_pools:
                    ld.err(vline, f"placed_on.{name}: unknown pool {val!r}")
                elif k == "waiting_reason" and val not in REASON_KINDS:
                    ld.err(vline, f"waiting_reason.{name}: expected one of "
                                  f"{', '.join(REASON_KINDS[:4])}")
                elif k == "preempted" and not (
                        val in PREEMPT_KINDS or (isinstance(val, int) and not isinstance(val, bool)
                                                 and val >= 0)):
                    ld.err(vline, f"preempted.{name}: expected reclaimed, budget, unstarted "
                                  f"or a count")
                elif k == "started" and not isinstance(val, bool):
                    ld.err(vline, f"started.{name}: expected true or false, found {val!r}")
                elif k == "queue":
                    if not isinstance(val, list):
                        ld.err(vline, f"queue.{name}: expected a list of task ids")
                        continue
                    for tid in val:
                        if str(tid) not in submitted:
                            ld.err(vline, f"queue.{name}: unknown task id {tid!r}")
                    val = [str(x) for x in val]
                checks[k][name] = val if not isinstance(val, CommentedSeq) else list(val)
        expectations.append(Expectation(at, line, checks, lines))
    if ld.diags:
        raise ScenarioError(ld.diags)
    expectations.sort(key=lambda x: x.at)  # stable: same-time ones keep file order
    return Scenario(path, sc_name, start, estate, events, expectations, warnings)


def _workers(ld: Any, v: Any, line: int, index: EstateIndex) -> dict[str, int] | None:
    """``workers: {pool: GPUs}``: the GPUs of the pool's live workers from now on (0: no live
    worker, so the pool takes no new placements). A pool never named has workers for all of
    its capacity, so its tasks start once placed."""
    if not isinstance(v, CommentedMap) or not v:
        ld.err(line, "workers: expected a mapping of <pool>: <GPUs of its live workers>")
        return None
    out: dict[str, int] = {}
    for pool, gpus in v.items():
        pline = _line(v, pool) or line
        if str(pool) not in index.pools:
            ld.err(pline, f"workers: unknown pool {pool!r}",
                   f"one of {', '.join(sorted(index.pools))}")
            continue
        try:
            out[str(pool)] = to_milli(gpus, f"workers.{pool}")
        except ValueError as exc:
            ld.err(pline, f"workers: {exc}")
    return out if len(out) == len(v) else None
