"""The event kinds: one registry (``events.KINDS``), each kind's payload round-trips through
the stored row, each has a reducer in the one dispatch table replay uses, and no code writes
a kind the registry does not know (the writer and the replayer cannot drift)."""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from pathlib import Path
from typing import Any

import pytest

from kliqued.daemon import events as E
from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.events import KINDS, Event, Payload
from kliqued.daemon.state.reducers import REDUCERS
from kliqued.daemon.state.replay import ReplayError, rebuild
from kliqued.daemon.storage.store import Batch, Store

ROOT = Path(__file__).resolve().parents[2]

# ``Event("kind", ...)``, ``Event("a" if x else "b", ...)`` and ``Event(NAME, ...)`` with
# ``NAME = "kind"`` in the same module; not ``asyncio.Event()`` nor the simulator's
# ``Event(at, ...)``.
WRITTEN = re.compile(
    r'\bEvent\(\s*("[a-z_]+"(?:\s+if\s[^,]*?\selse\s+"[a-z_]+")?|[A-Z][A-Z_]*)\s*,'
)


def written_kinds() -> dict[str, list[str]]:
    """Every kind a module of the product writes, with where."""
    out: dict[str, list[str]] = {}
    for path in sorted((ROOT / "kliqued").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        for m in WRITTEN.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            spelled = m.group(1)
            if not spelled.startswith('"'):  # a module constant: its value
                const = re.search(rf'^{spelled}\s*=\s*("[a-z_]+")', text, re.M)
                assert const, f"{path.relative_to(ROOT)}:{line}: {spelled} is not a kind literal"
                spelled = const.group(1)
            for kind in re.findall(r'"([a-z_]+)"', spelled):
                out.setdefault(kind, []).append(f"{path.relative_to(ROOT)}:{line}")
    return out


def sample(cls: type[Payload]) -> Payload:
    """A payload with every declared field set to a value of its type (not its default),
    and an undeclared key, so a field the round trip loses makes the comparison fail."""
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for i, f in enumerate(dataclasses.fields(cls)):
        if f.name == "extra":
            continue
        values[f.name] = _value(hints[f.name], i)
    return cls(**values, extra={"audit_note": "kept as written", "n": [1, None]})


def _value(hint: Any, i: int) -> Any:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    base = typing.get_origin(hint)
    if base in (typing.Union, types.UnionType) and args:
        return _value(args[0], i)
    if hint is bool:
        return True
    if hint is int:
        return 1000 + i
    if hint is float:
        return 0.5 + i
    if hint is str:
        return f"v{i}"
    if base is list or hint is list:
        return [f"item{i}", {"k": i}]
    if base is dict or hint is dict:
        return {"key": f"v{i}", "nested": {"n": i}}
    return {"any": [i, "x"]}  # Any: JSON of some shape


def test_every_kind_written_is_registered_and_every_registered_kind_is_written() -> None:
    written = written_kinds()
    assert len(written) >= 15, f"the grep finds the writers: {sorted(written)}"
    unknown = {k: where for k, where in written.items() if k not in KINDS}
    assert not unknown, f"kinds written but not registered in events.KINDS: {unknown}"
    stale = sorted(set(KINDS) - set(written))
    assert not stale, f"kinds registered but written nowhere: {stale}"


def test_every_kind_has_exactly_one_reducer() -> None:
    assert sorted(REDUCERS) == sorted(KINDS)
    assert all(callable(f) for f in REDUCERS.values())
    assert all(cls.KIND == kind for kind, cls in KINDS.items())


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_payload_round_trips_through_the_stored_row(kind: str, tmp_path: Path) -> None:
    """dataclass -> Event -> row in DuckDB -> row read back -> Event -> dataclass: equal."""
    p = sample(KINDS[kind])
    ev = Event(kind, "T-1", "alice", "r1", "g", "u", p.to_data())
    store = Store(str(tmp_path / "k.db"))
    try:
        store.ensure_schema()
        store.commit_sync(Batch(rows=[ev.row(1, 1234)]))
        (row,) = list(store.read_events())
    finally:
        store.close()
    seq, at, kind2, task, actor, revision, grp, usr, data_text = row
    back = Event(kind2, task, actor, revision, grp, usr, json.loads(data_text))
    assert (seq, at) == (1, 1234)
    assert back == ev
    assert E.payload(back) == p
    assert E.payload(back).to_data() == ev.data


def test_older_rows_without_optional_fields_load_with_defaults() -> None:
    ended = E.payload(Event("ended", "T-1", data={"kind": "failed", "epoch": 1}))
    assert isinstance(ended, E.Ended)
    assert (ended.lost, ended.reason, ended.message) == (False, None, None)
    reg = E.payload(Event("worker_registered", data={"worker_id": "w1", "pool": "p"}))
    assert isinstance(reg, E.WorkerRegistered) and reg.gpus == [] and reg.key_hash is None


def test_missing_required_field_and_unknown_kind_are_named() -> None:
    with pytest.raises(TypeError, match="pool"):
        E.payload(Event("placed", "T-1", data={"resource": "r"}))
    with pytest.raises(E.UnknownKind, match="'teleported'"):
        E.payload(Event("teleported", "T-1"))


def test_replay_names_the_event_of_an_unknown_kind(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "k.db"))
    try:
        store.ensure_schema()
        store.commit_sync(Batch(rows=[Event("teleported", "T-9").row(1, 5)]))
        with pytest.raises(ReplayError, match=r"event 1 \(teleported T-9\).*unknown event kind"):
            rebuild(Daemon(), store)
    finally:
        store.close()
