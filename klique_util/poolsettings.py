"""A pool's ``settings`` (estate extension): which keys each executor reads, what a value may
be, and the typed record a worker gets with every lease (docs/estate.md, docs/executors.md).

One home for the vocabulary, because two sides use it: the compiler warns about a key no
executor of the pool's kind reads and refuses a value that could never work (a namespace
that is no DNS label), and the worker parses the lease's ``settings`` into
:class:`PoolSettings` and its executor maps them (Slurm ``--account``, PBS ``-A``, a
Kubernetes namespace). Standard library only: every layer imports it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

LABEL_PREFIX = "label."
"""``label.team: ml`` puts the label ``team=ml`` on a Kubernetes Job and its pods (settings
are strings, so one key per label)."""

SCHEDULERS = ("slurm", "pbs", "lsf")
MODES = ("process", "docker", "podman")

EXECUTOR_KEYS: dict[str, frozenset[str]] = {
    "slurm": frozenset({"partition", "account", "qos"}),
    "pbs": frozenset({"queue", "account"}),
    "lsf": frozenset({"queue", "account"}),
    "kubernetes": frozenset({"namespace", "runtime_class", "service_account"}),
    "process": frozenset(),
    "docker": frozenset(),
    "podman": frozenset(),
}
"""The keys each executor maps onto its jobs (``label.*`` too for kubernetes)."""

CONTROL_KEYS = frozenset({"master_port"})
"""Read by the control plane (a gang's rendezvous port), whatever the executor."""

KIND_KEYS: dict[str, frozenset[str]] = {
    "hpc": frozenset({"scheduler"}),
    "baremetal": frozenset({"mode"}),
    "cloud": frozenset({"region", "instance_type", "vm_size", "mode", "node_gpus"}),
    "kubernetes": frozenset(),
}
"""Keys that say which executor or where a pool is, for people and rollouts (and a cloud
pool's ``node_gpus``, which ``kliqued autoscale`` reads); no executor maps them, and none
warns about them."""

KIND_EXECUTORS: dict[str, tuple[str, ...]] = {
    "hpc": SCHEDULERS,
    "kubernetes": ("kubernetes",),
    "baremetal": MODES,
    "cloud": MODES + ("kubernetes",),
}
"""The executors a pool of each kind may run (a cloud node runs a worker like bare metal, or
joins a cluster)."""

_WORD = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@+-]{0,127}$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?)?$")


def executors_of(kind: str, values: Mapping[str, str]) -> tuple[str, ...]:
    """The executors a pool of ``kind`` with these settings may run: the one its
    ``scheduler`` (hpc) or ``mode`` (baremetal, cloud) names when it names a valid one."""
    choices = KIND_EXECUTORS.get(kind, tuple(EXECUTOR_KEYS))
    named = values.get("scheduler" if kind == "hpc" else "mode")
    return (named,) if named in choices else choices


def reads(executor: str, key: str) -> bool:
    """Whether ``executor`` maps ``key`` onto its jobs."""
    if executor == "kubernetes" and key.startswith(LABEL_PREFIX):
        return True
    return key in EXECUTOR_KEYS.get(executor, frozenset())


def known_to(kind: str, values: Mapping[str, str], key: str) -> bool:
    """Whether some executor a pool of ``kind`` may run reads ``key``, or the control plane
    does, or it describes the pool (``scheduler``, ``region``)."""
    if key in CONTROL_KEYS or key in KIND_KEYS.get(kind, frozenset()):
        return True
    return any(reads(e, key) for e in executors_of(kind, values))


def keys_for(kind: str, values: Mapping[str, str]) -> list[str]:
    """Every key a pool of ``kind`` (with these settings) may use, for hints."""
    keys = set(CONTROL_KEYS) | KIND_KEYS.get(kind, frozenset())
    for e in executors_of(kind, values):
        keys |= EXECUTOR_KEYS.get(e, frozenset())
        if e == "kubernetes":
            keys.add(LABEL_PREFIX + "NAME")
    return sorted(keys)


def value_problem(key: str, value: str) -> str | None:
    """Why ``value`` cannot work for ``key`` (a sentence), or None. Values reach command
    lines and manifests, so a word with spaces or a leading dash is refused here rather
    than split or read as an option by sbatch."""
    if key == "node_gpus":
        if not value.isdigit() or int(value) < 1:
            return f"node_gpus must be a whole number of GPUs >= 1, found {value!r}"
    elif key == "master_port":
        if not value.isdigit() or not 0 < int(value) < 65536:
            return f"master_port must be a port number 1-65535, found {value!r}"
    elif key == "scheduler":
        if value not in SCHEDULERS:
            return f"scheduler must be one of {', '.join(SCHEDULERS)}, found {value!r}"
    elif key == "mode":
        if value not in MODES:
            return f"mode must be one of {', '.join(MODES)}, found {value!r}"
    elif key == "namespace":
        if not _DNS_LABEL.match(value):
            return (
                f"namespace must be a Kubernetes namespace name (lowercase letters, "
                f"digits and '-', at most 63), found {value!r}"
            )
    elif key in ("runtime_class", "service_account"):
        if not _DNS_SUBDOMAIN.match(value):
            return (
                f"{key} must be a Kubernetes object name (lowercase letters, digits, "
                f"'-' and '.'), found {value!r}"
            )
    elif key.startswith(LABEL_PREFIX):
        name = key[len(LABEL_PREFIX) :]
        prefix, _, short = name.rpartition("/")
        if not _LABEL_NAME.match(short) or (prefix and not _DNS_SUBDOMAIN.match(prefix)):
            return f"{key}: {name!r} is not a Kubernetes label name"
        if not _LABEL_VALUE.match(value):
            return (
                f"{key}: {value!r} is not a Kubernetes label value (at most 63 of "
                f"A-Z a-z 0-9 _ . -, starting and ending alphanumeric)"
            )
    elif key in ("partition", "account", "qos", "queue"):
        if not _WORD.match(value):
            return (
                f"{key} must be one word (letters, digits, _ . : @ + -, not starting "
                f"with '-'), found {value!r}"
            )
    return None


@dataclass(frozen=True)
class PoolSettings:
    """A pool's settings as its worker gets them with each lease (``"settings"``): the
    estate in force when the task was leased, so an edited pool reaches running workers at
    their next lease. Empty for a lease from a control plane that sends none."""

    values: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_lease(cls, lease: Mapping[str, Any]) -> "PoolSettings":
        """The lease's ``settings``; entries that are not string to string are dropped (a
        control plane only sends strings: the compiler's model says so)."""
        raw = lease.get("settings")
        if not isinstance(raw, dict):
            return cls({})
        return cls({str(k): v for k, v in raw.items() if isinstance(v, str)})

    def get(self, key: str) -> str | None:
        value = self.values.get(key)
        return value or None

    @property
    def account(self) -> str | None:
        return self.get("account")

    @property
    def partition(self) -> str | None:
        return self.get("partition")

    @property
    def qos(self) -> str | None:
        return self.get("qos")

    @property
    def queue(self) -> str | None:
        return self.get("queue")

    @property
    def namespace(self) -> str | None:
        return self.get("namespace")

    @property
    def labels(self) -> dict[str, str]:
        """The ``label.NAME: value`` entries as Kubernetes labels."""
        return {
            k[len(LABEL_PREFIX) :]: v
            for k, v in sorted(self.values.items())
            if k.startswith(LABEL_PREFIX) and len(k) > len(LABEL_PREFIX)
        }

    def unread_by(self, executor: str) -> list[str]:
        """Keys neither ``executor`` nor the control plane reads and that describe no pool:
        the worker warns about each once (a typo, or a setting meant for another
        executor)."""
        described = set().union(*KIND_KEYS.values())
        return sorted(
            k
            for k in self.values
            if not reads(executor, k) and k not in CONTROL_KEYS and k not in described
        )
