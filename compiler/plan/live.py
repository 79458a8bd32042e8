"""The running system's counts, as ``kliqued plan --against URL`` reads them from
``GET /v1/plan/state``: the plan then says how many tasks a change preempts, cancels or
leaves over a limit, instead of "if more is already spent".

Pure: the CLI fetches the JSON; this module only reads it, strictly, so a daemon of another
version gives a clear error rather than a plan built on half-read numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from klique_util.units import gpus_to_milli, to_ms

from ..errors import LiveStateError as LiveStateError  # noqa: PLC0414 (re-exported)
from ..units import parse_time

PERIODS = ("day", "week", "month")


@dataclass(frozen=True)
class ResourceLive:
    queued: int = 0
    placed: int = 0
    placed_gpus_milli: int = 0
    weighted_placed: int = 0


@dataclass(frozen=True)
class PolicyLive:
    used_milli: int = 0
    placed: int = 0
    weighted_placed: int = 0
    budget_used_milli: dict[str, int] = field(default_factory=dict)
    """Budget hours used in the current day, week and month (thousandths)."""


@dataclass(frozen=True)
class PoolLive:
    placed: int = 0
    used_milli: int = 0


@dataclass(frozen=True)
class LiveState:
    source: str
    """Where it was read, e.g. the daemon's URL."""
    revision: str
    at: str
    at_ms: int
    resources: dict[str, ResourceLive]
    policies: dict[str, PolicyLive]
    pools: dict[str, PoolLive]
    usage: dict[str, dict[str, float]] | None
    """GPU-hours per GPU type and UTC month (``2026-11``); None without a ledger."""
    commit: str | None = None
    """The git commit the running revision was read from, when the daemon follows git."""
    capacity_mismatches: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Per pool: how its live workers disagree with what it declares (issue 15); absent
    from daemons before it."""

    def resource(self, name: str) -> ResourceLive:
        return self.resources.get(name, ResourceLive())

    def policy(self, name: str) -> PolicyLive:
        return self.policies.get(name, PolicyLive())

    def pool(self, name: str) -> PoolLive:
        return self.pools.get(name, PoolLive())


def _milli(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise LiveStateError(f"{where}: expected a number, found {value!r}")
    return gpus_to_milli(value)


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise LiveStateError(f"{where}: expected an integer, found {value!r}")
    return value


def _map(data: Any, key: str) -> dict[str, Any]:
    value = data.get(key)
    if not isinstance(value, dict):
        raise LiveStateError(f"'{key}': expected an object, found {type(value).__name__}")
    return value


def parse_live_state(data: Any, source: str) -> LiveState:
    """Reads the JSON of ``GET /v1/plan/state``; a wrong shape names the field."""
    try:
        return _parse(data, source)
    except (AttributeError, TypeError, KeyError) as exc:
        raise LiveStateError(f"not a plan state this version reads ({exc})") from None


def _parse(data: Any, source: str) -> LiveState:
    if not isinstance(data, dict):
        raise LiveStateError("expected a JSON object")
    revision, at = data.get("revision"), data.get("at")
    if not isinstance(revision, str) or not isinstance(at, str):
        raise LiveStateError("'revision' and 'at' must be strings")
    try:
        at_ms = to_ms(parse_time(at))
    except ValueError as exc:
        raise LiveStateError(f"'at': {exc}") from None
    resources = {
        name: ResourceLive(
            _int(v.get("queued"), f"{name}.queued"),
            _int(v.get("placed"), f"{name}.placed"),
            _milli(v.get("placed_gpus"), f"{name}.placed_gpus"),
            _int(v.get("weighted_placed"), f"{name}.weighted_placed"),
        )
        for name, v in _map(data, "compute_resources").items()
    }
    policies = {}
    for name, v in _map(data, "policies").items():
        used = v.get("budget_used_hours") or {}
        policies[name] = PolicyLive(
            _milli(v.get("used_gpus"), f"{name}.used_gpus"),
            _int(v.get("placed"), f"{name}.placed"),
            _int(v.get("weighted_placed"), f"{name}.weighted_placed"),
            {p: _milli(used.get(p, 0), f"{name}.budget_used_hours.{p}") for p in PERIODS},
        )
    pools = {
        name: PoolLive(
            _int(v.get("placed"), f"{name}.placed"), _milli(v.get("used_gpus"), f"{name}.used_gpus")
        )
        for name, v in _map(data, "pools").items()
    }
    usage: dict[str, dict[str, float]] | None = None
    if data.get("usage") is not None:
        usage = {}
        for row in data["usage"]:
            usage.setdefault(str(row["gpu_type"]), {})[str(row["month"])] = float(row["gpu_hours"])
    commit = data.get("commit")
    mismatches: dict[str, tuple[str, ...]] = {}
    for pool, texts in (data.get("capacity_mismatches") or {}).items():
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise LiveStateError(f"capacity_mismatches.{pool}: expected a list of strings")
        mismatches[str(pool)] = tuple(texts)
    return LiveState(
        source,
        revision,
        at,
        at_ms,
        resources,
        policies,
        pools,
        usage,
        commit if isinstance(commit, str) else None,
        mismatches,
    )
