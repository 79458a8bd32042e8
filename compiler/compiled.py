"""The compiled estate: the one canonical state that the daemon, the engine and the simulator
consume. This is the seam between the compiler and everything downstream.

Everything a runtime needs is explicit here: defaults applied, ``pools_by`` resolved to a pool
list, every pool's execution order complete, compute resources listed. Amounts are integer
thousandths (``*_milli``) and durations whole seconds (``*_s``), so consumers never parse.
Lists of objects are sorted by name, and the JSON is written with sorted keys, so the same
estate gives the same bytes whatever its file split or key order; ``revision`` is the digest
of those bytes.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

FORMAT_VERSION = 1


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CAttribution(_Frozen):
    reserved_idle: Literal["group", "overhead"] = "overhead"
    overhead_account: str = "overhead"
    borrowed: Literal["borrower", "split"] = "borrower"
    """Left out of the canonical JSON at its default, so estates from before it keep their
    revision."""
    lost_work: Literal["owner", "taker", "overhead"] = "owner"
    """Who pays for lost work (kliqued.ledger.statement); left out at its default too."""


class CLending(_Frozen):
    """lending.md's settings; left out of the canonical JSON at their defaults, so estates
    that do not use them keep their revision."""

    order: Literal["ordered", "fair"] = "ordered"
    protect_for_s: int = 0
    victims: Literal["newest", "least_lost_work"] = "newest"


class CSettings(_Frozen):
    pass_interval_s: int
    low_watermark_s: int
    currency: str
    start_timeout_s: int = 600
    """The estate-wide start timeout (each pool has its own resolved one)."""
    alerts: "CAlerts | None" = None
    """Alert channels and recipients; left out of the canonical JSON when absent, so an
    estate without them keeps its revision."""
    attribution: CAttribution | None = None
    """Who pays for idle capacity (the ledger's statements); left out of the canonical JSON
    when absent, like ``alerts``."""
    lending: CLending = CLending()
    """lending.md; left out of the canonical JSON at its defaults."""
    identity: "CIdentity | None" = None
    """Sign-in through identity providers (docs/identity.md); left out of the canonical JSON
    when absent, like ``alerts``."""


class CPeopleProvider(_Frozen):
    """An identity provider people sign in with."""

    name: str
    issuer: str
    audience: str
    client_id: str
    """The public client of the dashboard and ``kliqued login`` (the audience when unset)."""
    user_claim: str
    users: dict[str, str]
    """Claim value -> estate user, for the users whose value is not their name."""
    algorithms: list[str]
    leeway_s: int
    scopes: list[str]


class CWorkload(_Frozen):
    """A CI token service: a job whose token matches every claim condition acts as
    ``role``."""

    name: str
    issuer: str
    audience: str
    claims: dict[str, str]
    """Claim -> the value it must have (a trailing ``*``: a prefix)."""
    role: Literal["planner"]
    algorithms: list[str]
    leeway_s: int


class CIdentity(_Frozen):
    providers: list[CPeopleProvider]
    workloads: list[CWorkload]
    roles: dict[str, list[str]]
    """Role (admin, finance, planner) -> the users who hold it, sorted."""
    token_lifetime_s: int

    def in_estate(self, user: str) -> bool:
        """Whether ``user`` holds a role here (a person in no group may still be finance)."""
        return any(user in users for users in self.roles.values())


class CAlertChannel(_Frozen):
    name: str
    kind: Literal["webhook", "slack", "email"]
    url: str | None = None
    secret_env: str | None = None
    secret_file: str | None = None
    smtp_host: str | None = None
    smtp_port: int = 25
    sender: str | None = None
    to: list[str] = ["admins", "it"]
    timeout_s: int = 10


class CAlerts(_Frozen):
    channels: list[CAlertChannel]
    contacts: dict[str, str]
    """Estate user -> address."""
    it: list[str]
    waiting_after_s: int | None = None


class CNodePrice(_Frozen):
    instance_type: str
    on_demand: str
    """Decimal text in ``settings.currency``, per node-hour."""
    spot: str | None = None


class CAutoscale(_Frozen):
    max_milli: int
    idle_timeout_s: int
    spot_first: bool
    spend_cap: str | None = None
    """Decimal text in ``settings.currency`` per UTC calendar month; None: no cap."""
    node_prices: tuple[CNodePrice, ...] = ()


class CNodes(_Frozen):
    count: int
    gpus_milli: int


class CPool(_Frozen):
    name: str
    kind: Literal["kubernetes", "baremetal", "hpc", "cloud"]
    capacity_milli: int
    """Declared capacity; for an autoscaled cloud pool, ``autoscale.max``."""
    gpu_type: str
    gpu_memory_gb: int | None
    generation: int | None
    labels: dict[str, str]
    execution_order: list[str]
    """Every profile that uses this pool, first = placed first (listed, then the rest in
    declaration order)."""
    autoscale: CAutoscale | None
    start_timeout_s: int = 600
    """A placed task no worker has taken within this long is requeued; 0 = never."""
    settings: dict[str, str]
    """Free-form executor settings for the pool's workers (partition, namespace, ...)."""
    nodes: list[CNodes] = []
    """The machines behind the pool, in declared order; empty: not declared (one pool-sized
    machine as far as placement knows)."""


class CFromTask(_Frozen):
    param: Literal["gpus"]
    default_milli: int
    max_milli: int


class CIdle(_Frozen):
    """A profile's session idle limits in seconds (None: no limit of that kind)."""

    wall_s: int | None = None
    cpu_s: int | None = None
    gpu_s: int | None = None
    network_s: int | None = None


class CProfile(_Frozen):
    name: str
    gpus_milli: int | None
    """The fixed size of every task; None when the task sets its size (``from_task``)."""
    from_task: CFromTask | None
    time_weight_milli: int
    pools: list[str]
    """Pool order, first = tried first (``pools_by`` resolved)."""
    policies: list[str]
    """Queuing priority, first = placed first."""
    queueing: Literal["strict", "best_effort"]
    nodes: int = 1
    """A gang over this many nodes (the task's GPUs split evenly), all placed or none."""
    idle: CIdle | None = None
    """The idle limits of its sessions, a ceiling the session may lower; None: none."""


class CBudget(_Frozen):
    hours_milli: int
    period: Literal["day", "week", "month"]
    low_watermark_s: int
    alert_at_milli: list[int]


class CPoolsAllowed(_Frozen):
    labels: dict[str, str]
    pools: list[str] | None


class CPolicy(_Frozen):
    name: str
    group: str
    reservation_milli: int
    limit_milli: int
    budget: CBudget | None
    pools_allowed: CPoolsAllowed | None
    profiles: list[str]
    """The profiles connected to this policy, in declaration order."""
    user_limit_milli: int | None = None
    """Most GPUs one user of the group holds at once; None: no per-user limit."""
    envelope: bool = False
    """The policy of a group with groups below it: its numbers apply to the whole subtree,
    and no profile is connected to it (organisation.md)."""
    levels: list[str] = []
    """The policies met going up from this policy's group: itself, then each envelope above
    it, nearest first. A flat estate: ``[name]``."""
    below: list[str] = []
    """An envelope's nearest policies below it (whose next level up is this one)."""
    shared_reservation_milli: int = 0
    """An envelope's ``reservation - sum of the nearest reservations below``: the part any
    policy below it may use. 0 for a policy that is not an envelope."""
    lend_weight_milli: int = 1000
    """lending.md's ``lend_weight`` in thousandths (default 1); left out at its default."""
    protect_for_s: int | None = None
    """This policy's own ``protect_for``; None: ``settings.lending.protect_for_s``. Left out
    when None."""


class CGroup(_Frozen):
    name: str
    parent: str | None
    ancestors: list[str]
    """Parent first, then its parent, up to the top."""
    users: list[str]
    admins: list[str]
    projects: list[str]
    """Sorted; see ``project_order`` for the queue order."""
    policy: str | None
    project_priority: bool = False
    project_order: list[str] = []
    """With ``project_priority``: the projects as listed, first = queued first (tasks of no
    listed project after them). Empty without it: submission order only."""


class CPrice(_Frozen):
    gpu_type: str
    per_gpu_hour: str
    """Decimal text in ``settings.currency``: reporting only."""
    effective_from: str
    list_per_gpu_hour: str | None = None
    """The list price when ``per_gpu_hour`` is a contracted one below it; None: the same.
    Left out of the canonical JSON when None, so estates without it keep their revision."""


class CComputeResource(_Frozen):
    name: str
    """``<policy>/<profile>``: what users and agents send work to."""
    policy: str
    profile: str
    group: str


class CompiledEstate(_Frozen):
    format: int = FORMAT_VERSION
    revision: str = ""
    """``sha256:<hex>`` of the canonical JSON of everything else."""
    settings: CSettings
    pools: list[CPool]
    profiles: list[CProfile]
    policies: list[CPolicy]
    groups: list[CGroup]
    pricing: list[CPrice]
    compute_resources: list[CComputeResource]

    def canonical_json(self) -> str:
        """The byte-stable text: sorted keys, two-space indent, a final newline."""
        return (
            json.dumps(self.canonical_body(), sort_keys=True, indent=2, ensure_ascii=False) + "\n"
        )

    def canonical_body(self) -> dict[str, Any]:
        """The data the revision digest covers, as JSON values: the plan's diff walks this
        same form, so every difference that gives a new revision is one the plan can show."""
        body = self.model_dump(mode="json")
        for key in ("alerts", "attribution", "identity"):
            if body["settings"].get(key) is None:
                body["settings"].pop(key, None)
        lending = body["settings"].get("lending")
        if lending is not None:
            for key, default in CLending().model_dump(mode="json").items():
                if lending.get(key) == default:
                    lending.pop(key)
            if not lending:
                body["settings"].pop("lending")
        for pol in body["policies"]:
            if pol.get("lend_weight_milli") == 1000:
                pol.pop("lend_weight_milli", None)
            if pol.get("protect_for_s") is None:
                pol.pop("protect_for_s", None)
        attribution = body["settings"].get("attribution")
        if attribution is not None and attribution.get("borrowed") == "borrower":
            attribution.pop("borrowed", None)
        if attribution is not None and attribution.get("lost_work") == "owner":
            attribution.pop("lost_work", None)
        # Left out at their defaults, so an estate that does not use them keeps its revision.
        for pool in body["pools"]:
            if not pool.get("nodes"):
                pool.pop("nodes", None)
            a = pool.get("autoscale")
            if a is not None:
                if a.get("spend_cap") is None:
                    a.pop("spend_cap", None)
                if not a.get("node_prices"):
                    a.pop("node_prices", None)
        for prof in body["profiles"]:
            if prof.get("nodes") == 1:
                prof.pop("nodes", None)
            if prof.get("idle") is None:
                prof.pop("idle", None)
        for price in body["pricing"]:
            if price.get("list_per_gpu_hour") is None:
                price.pop("list_per_gpu_hour", None)
        return body

    def with_revision(self) -> "CompiledEstate":
        body = self.model_copy(update={"revision": ""}).canonical_json()
        digest = hashlib.sha256(body.encode("utf-8")).hexdigest()
        return self.model_copy(update={"revision": f"sha256:{digest}"})

    @classmethod
    def from_json(cls, text: str | bytes) -> "CompiledEstate":
        return cls.model_validate_json(text)

    # Lookups by name; cheap enough for the compiler and plan, the engine builds its own index.
    def pool(self, name: str) -> CPool | None:
        return next((p for p in self.pools if p.name == name), None)

    def profile(self, name: str) -> CProfile | None:
        return next((p for p in self.profiles if p.name == name), None)

    def policy(self, name: str) -> CPolicy | None:
        return next((p for p in self.policies if p.name == name), None)

    def group(self, name: str) -> CGroup | None:
        return next((g for g in self.groups if g.name == name), None)


CSettings.model_rebuild()
