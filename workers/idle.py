"""Session idle limits: a task that declares them is stopped when it has been idle too long.

A task declares its limits in its labels (or its payload's ``idle`` object):

    labels:  {"idle.wall": "8h", "idle.cpu": "30m", "idle.gpu": "30m", "idle.network": "30m"}
    payload: {"idle": {"wall": "8h", "cpu": "30m", "cpu_threshold": "10%"}}

- ``wall``: the session's longest life, from its start (idle or not);
- ``cpu``: that long with the CPU use of the task's process group below ``cpu_threshold``
  (default ``5%`` of one core);
- ``gpu``: that long with the utilisation of every GPU the task was given at or below
  ``gpu_threshold`` (default ``0%``), from nvidia-smi; not measurable without nvidia-smi (the
  limit is then ignored, and the task's log says so once);
- ``network``: that long with fewer than ``network_threshold`` bytes a second (default
  ``1024``) received plus sent by the network namespace of the task's process (lo excluded);
  in the host's namespace that is the host's traffic, so this limit is for tasks in a
  namespace of their own (containers).

When a limit is reached, the worker stops the task as it would after a stop instruction
(SIGTERM, the grace period, SIGKILL) and reports it ``stopped`` with the message
``idle: <which> <limit as written>``, e.g. ``idle: cpu 30m``.

Two parts: the decision (``parse_limits`` and ``IdleTracker.observe``, pure: samples in,
verdict out) and the readers (``/proc`` and nvidia-smi). ``watch`` is the daemon's one hook,
called from each task's supervisor loop.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from datetime import datetime

from klique_util.units import SECOND_MS, UNIT_SECONDS

log = logging.getLogger(__name__)

KINDS = ("wall", "cpu", "gpu", "network")
_UNITS = {"ms": 1 / SECOND_MS, **UNIT_SECONDS}
DEFAULT_CPU_THRESHOLD = 0.05  # cores
DEFAULT_GPU_THRESHOLD = 0.0  # percent
DEFAULT_NETWORK_THRESHOLD = 1024.0  # bytes a second


def parse_duration(text) -> float:
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*", str(text))
        if not m:
            raise ValueError(f"{text!r} is not a duration like 30s, 30m or 8h")
        value = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    if value <= 0:
        raise ValueError(f"{text!r}: an idle limit must be positive")
    return value


def _bytes_rate(text: object) -> float:
    try:
        return float(str(text).strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a number of bytes a second") from None


def _percent(text, default: float) -> float:
    if text is None:
        return default
    s = str(text).strip()
    try:
        return float(s[:-1]) if s.endswith("%") else float(s)
    except ValueError:
        raise ValueError(f"{text!r} is not a percentage like 5%") from None


@dataclass(frozen=True)
class IdleLimits:
    wall_s: float | None = None
    cpu_s: float | None = None
    gpu_s: float | None = None
    network_s: float | None = None
    cpu_threshold: float = DEFAULT_CPU_THRESHOLD  # cores (0.05 = 5% of one core)
    gpu_threshold: float = DEFAULT_GPU_THRESHOLD  # percent utilisation
    network_threshold: float = DEFAULT_NETWORK_THRESHOLD  # bytes a second
    text: dict = field(default_factory=dict, compare=False)  # kind -> the limit as written

    def limit(self, kind: str) -> float | None:
        return getattr(self, f"{kind}_s")

    @property
    def any(self) -> bool:
        return any(self.limit(k) is not None for k in KINDS)

    def sample_interval(self) -> float:
        """How often to sample: a quarter of the shortest limit, between 0.25 s and 10 s."""
        shortest = min(v for k in KINDS if (v := self.limit(k)) is not None)
        return min(max(shortest / 4, 0.25), 10.0)


def parse_limits(labels: dict | None, payload=None) -> IdleLimits | None:
    """The task's idle limits from ``labels`` (``idle.<kind>``) and ``payload["idle"]``
    (``<kind>``; the labels win); None when it declares none. Raises ValueError for a value
    that is not a duration (or threshold)."""
    spec: dict[str, object] = {}
    if isinstance(payload, dict) and isinstance(payload.get("idle"), dict):
        spec.update({str(k): v for k, v in payload["idle"].items()})
    for key, value in (labels or {}).items():
        if str(key).startswith("idle."):
            spec[str(key)[5:]] = value
    if not spec:
        return None
    unknown = set(spec) - set(KINDS) - {f"{k}_threshold" for k in ("cpu", "gpu", "network")}
    if unknown:
        raise ValueError(
            f"unknown idle setting(s) {sorted(unknown)}; known: "
            f"{', '.join(KINDS)} and cpu/gpu/network_threshold"
        )
    values: dict = {f"{k}_s": parse_duration(spec[k]) for k in KINDS if k in spec}
    if "cpu_threshold" in spec:
        values["cpu_threshold"] = _percent(spec["cpu_threshold"], 5.0) / 100
    if "gpu_threshold" in spec:
        values["gpu_threshold"] = _percent(spec["gpu_threshold"], 0.0)
    if "network_threshold" in spec:
        values["network_threshold"] = _bytes_rate(spec["network_threshold"])
    limits = IdleLimits(**values, text={k: str(spec[k]).strip() for k in KINDS if k in spec})
    return limits if limits.any else None


@dataclass(frozen=True)
class Sample:
    """What was measured at ``at`` (seconds, monotonic): cumulative CPU seconds of the task's
    processes, cumulative network bytes of its namespace, and the highest utilisation (%) of
    its GPUs; None where not measurable."""

    at: float
    cpu_s: float | None = None
    net_bytes: int | None = None
    gpu_util: float | None = None


class IdleTracker:
    """The decision: fed samples in time order, says which limit (if any) was reached.

    For each of cpu/gpu/network it keeps the time since which the task has been idle in that
    respect: a sample interval with activity above the threshold moves it to that sample's
    time; an unmeasurable sample leaves the clock where it was (never stops a task for lack of
    data: the clock is only checked when the latest sample measured it). ``wall`` counts from
    ``started_at``."""

    def __init__(self, limits: IdleLimits, started_at: float):
        self.limits = limits
        self.started_at = started_at
        self.prev: Sample | None = None
        self.idle_since = {k: started_at for k in ("cpu", "gpu", "network")}

    def observe(self, s: Sample) -> str | None:
        lim, prev = self.limits, self.prev
        measured = {
            "cpu": s.cpu_s is not None,
            "gpu": s.gpu_util is not None,
            "network": s.net_bytes is not None,
        }
        if prev is not None and s.at > prev.at:
            dt = s.at - prev.at
            if s.cpu_s is not None and prev.cpu_s is not None:
                if (s.cpu_s - prev.cpu_s) / dt > lim.cpu_threshold:
                    self.idle_since["cpu"] = s.at
            if s.net_bytes is not None and prev.net_bytes is not None:
                if (s.net_bytes - prev.net_bytes) / dt >= lim.network_threshold:
                    self.idle_since["network"] = s.at
        if s.gpu_util is not None and s.gpu_util > lim.gpu_threshold:
            self.idle_since["gpu"] = s.at
        self.prev = s
        if lim.wall_s is not None and s.at - self.started_at >= lim.wall_s:
            return self.verdict("wall")
        for kind in ("cpu", "gpu", "network"):
            limit = lim.limit(kind)
            if limit is not None and measured[kind] and s.at - self.idle_since[kind] >= limit:
                return self.verdict(kind)
        return None

    def verdict(self, kind: str) -> str:
        return f"{kind} {self.limits.text.get(kind) or _fmt(self.limits.limit(kind))}"


def _fmt(seconds: float | None) -> str:
    return f"{seconds:g}s"


# readers -------------------------------------------------------------------------------------
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    return data[data.rindex(")") + 2 :].split()


def group_pids(pgid: int) -> list[int]:
    out: list[int] = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if name.isdigit():
            f = _stat_fields(int(name))
            if f and int(f[2]) == pgid and f[0] not in ("Z", "X", "x"):
                out.append(int(name))
    return out


def cpu_seconds(pids: list[int]) -> float | None:
    """utime + stime of the processes plus cutime + cstime (their reaped children)."""
    ticks, seen = 0, False
    for pid in pids:
        f = _stat_fields(pid)
        if f is None:
            continue
        seen = True
        ticks += int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])
    return ticks / _TICKS if seen else None


def net_bytes(pid: int) -> int | None:
    """Received plus sent bytes of every interface but lo in the namespace of ``pid``."""
    try:
        with open(f"/proc/{pid}/net/dev", encoding="ascii", errors="replace") as fh:
            lines = fh.read().splitlines()[2:]
    except OSError:
        return None
    total = 0
    for line in lines:
        name, _, rest = line.partition(":")
        if name.strip() == "lo":
            continue
        cols = rest.split()
        if len(cols) >= 9:
            total += int(cols[0]) + int(cols[8])
    return total


def gpu_utilisation(indices: list[int], smi: str | None = None) -> float | None:
    """The highest utilisation (%) among the GPUs ``indices``, from nvidia-smi; None when
    there is no nvidia-smi or no answer."""
    smi = smi or shutil.which("nvidia-smi")
    if not smi or not indices:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index,utilization.gpu", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    utils = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and int(parts[0]) in indices:
            try:
                utils.append(float(parts[1]))
            except ValueError:
                pass
    return max(utils) if utils else None


def measure(pgid: int | None, gpus: list[int], limits: IdleLimits) -> Sample:
    now = time.monotonic()
    cpu = net = None
    if pgid is not None and (limits.cpu_s is not None or limits.network_s is not None):
        pids = group_pids(pgid)
        if limits.cpu_s is not None:
            cpu = cpu_seconds(pids)
        if limits.network_s is not None and pids:
            net = net_bytes(pids[-1])
    util = gpu_utilisation(gpus) if limits.gpu_s is not None else None
    return Sample(now, cpu, net, util)


# the daemon's hook ---------------------------------------------------------------------------
@dataclass
class _Watch:
    limits: IdleLimits | None
    tracker: IdleTracker | None = None
    next_at: float = 0.0
    warned: set = field(default_factory=set)


def _started_monotonic(started_at: str | None) -> float:
    """The task's start (RFC 3339) on the monotonic clock, so a worker restart keeps `wall`."""
    now = time.monotonic()
    if not started_at:
        return now
    try:
        t = datetime.fromisoformat(started_at.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return now
    return now - max(0.0, time.time() - t)


def watch(daemon, rec, handle) -> None:
    """Called by the daemon on every turn of a running task's supervisor loop: samples the
    task at its own pace and asks the daemon to stop it when an idle limit is reached. Never
    raises: a failure here turns the task's idle limits off, it never ends the task."""
    try:
        _watch(daemon, rec, handle)
    except Exception:  # pragma: no cover - defensive
        log.exception("task %s: idle limits turned off after an error", rec.task)
        daemon.__dict__.setdefault("_idle_watches", {})[rec.key] = _Watch(None)


def _watch(daemon, rec, handle) -> None:
    watches: dict[str, _Watch] = daemon.__dict__.setdefault("_idle_watches", {})
    w = watches.get(rec.key)
    if w is None:
        for key in [k for k in watches if k not in daemon.records]:
            del watches[key]
        try:
            limits = parse_limits(rec.lease.get("labels"), rec.lease.get("payload"))
        except ValueError as exc:
            daemon._task_log(rec, f"idle limits ignored: {exc}")
            limits = None
        w = watches[rec.key] = _Watch(limits)
        if limits is not None:
            w.tracker = IdleTracker(limits, _started_monotonic(rec.started_at))
            daemon._task_log(
                rec, "idle limits: " + ", ".join(f"{k} {v}" for k, v in limits.text.items())
            )
    limits = w.limits
    if w.tracker is None or limits is None or rec.stop is not None or time.monotonic() < w.next_at:
        return
    w.next_at = time.monotonic() + limits.sample_interval()
    sample = measure(getattr(handle, "pgid", None), list(rec.gpus or []), limits)
    if limits.gpu_s is not None and sample.gpu_util is None and "gpu" not in w.warned:
        w.warned.add("gpu")
        daemon._task_log(
            rec, "idle limit gpu ignored: GPU utilisation is not measurable here (no nvidia-smi)"
        )
    verdict = w.tracker.observe(sample)
    if verdict is not None:
        log.info("task %s (epoch %s) idle: %s", rec.task, rec.epoch, verdict)
        daemon._request_stop(rec, "idle", verdict, None)
