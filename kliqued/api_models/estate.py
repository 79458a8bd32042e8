"""The answers about the estate in force, as pydantic models: its policies, its pools (and a
pool's cloud), the plan state and the revision itself, whose schemas the document generates
(``schema.components``) as it does the other answers' (``responses``).

They were the last answers written by hand in ``openapi.py``; a module of their own because
they describe the estate's view of the daemon (``views.py``'s policies, pools and plan
state), not a resource's record. As with ``responses``, the views still build dicts and the
suite checks what a real daemon answers against the document; these models only say the
shapes. A field absent from some answers (a level's fair share, present only under
``order: fair``; a pool's autoscaler and capacity truth) is ``X | SkipJsonSchema[None] =
None``: not required, and not nullable in the document, as the views never send ``null``
there.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from kliqued.api_models.responses import Budget, CloudNode, Time, Waiting

_CLOSED = ConfigDict(extra="forbid")

Share = Annotated[
    float,
    Field(
        ge=0,
        description="with settings.lending.order: fair only: the level's borrowed "
        "GPUs / lend_weight (lending.md)",
    ),
]
"""A level's fair share (``order: fair`` only)."""
LendWeight = Annotated[float, Field(gt=0, description="with settings.lending.order: fair only")]
"""A level's weight in the fair share (``order: fair`` only)."""
Count = Annotated[int, Field(ge=0)]


class Policy(BaseModel):
    model_config = _CLOSED
    name: str
    group: str
    reservation: float
    limit: float
    used: float
    borrowed: float
    budget: Budget | None
    envelope: bool = Field(
        description="the policy of a group with groups below it: its numbers are the subtree's"
    )
    parent: str | None = Field(description="the envelope just above")
    levels: list[str] = Field(
        description="the policies a task of the group counts at, itself first"
    )
    depth: Count = Field(description="envelopes above it")
    path: str = Field(description="its group's path, top first")
    shared_reservation: float | None = Field(
        description="an envelope's reservation that no policy below holds: any of them may use it"
    )
    below: list[str] = Field(description="an envelope's policies just below it")
    user_limit: float | None
    waiting: Waiting
    share: Share | SkipJsonSchema[None] = None
    lend_weight: LendWeight | SkipJsonSchema[None] = None


class PolicyList(BaseModel):
    model_config = _CLOSED
    policies: list[Policy]


class PoolWorkers(BaseModel):
    """A pool's live workers and their GPUs."""

    model_config = _CLOSED
    live: Count
    gpus: Count


class LevelUse(BaseModel):
    """GPUs a group uses in a pool, rolled up the tree."""

    model_config = _CLOSED
    group: str
    path: str
    depth: Count
    used: float
    share: Share | SkipJsonSchema[None] = None
    lend_weight: LendWeight | SkipJsonSchema[None] = None


class Scaling(BaseModel):
    """Why an autoscaled pool does not grow now, since when, and how many tasks wait."""

    model_config = _CLOSED
    cause: Literal["spend_cap", "capacity", "error"]
    reason: str | None
    waiting: Count
    since: Time


class PoolCloud(BaseModel):
    model_config = _CLOSED
    month: str = Field(description="the UTC month, YYYY-MM")
    currency: str
    spent: str = Field(
        description="this month's cloud spend of the pool (running nodes up to now), decimal text"
    )
    spend_cap: str | None
    capped: bool = Field(description="spent reached spend_cap: the autoscaler adds no node")
    nodes: list[CloudNode]
    scaling: Scaling | None


class PoolAutoscaler(BaseModel):
    """An autoscaled pool's autoscaler: whether it heartbeats."""

    model_config = _CLOSED
    live: bool = Field(
        description="its autoscaler heartbeats; with no live worker the pool takes work only "
        "while it does"
    )


class DeclaredCapacity(BaseModel):
    """What the estate declares of a pool."""

    model_config = _CLOSED
    gpus: float
    gpu_type: str
    machines: list[int] | SkipJsonSchema[None] = Field(
        None, description="GPUs of each declared machine, largest first"
    )


class ReportedCapacity(BaseModel):
    """What a pool's live workers report."""

    model_config = _CLOSED
    workers: Count
    gpus: Count
    models: list[str]
    machines: list[int] = Field(description="GPUs of each live worker")


class CapacityTruth(BaseModel):
    """A pool's declared capacity against its workers' reports."""

    model_config = _CLOSED
    declared: DeclaredCapacity
    reported: ReportedCapacity
    agree: bool
    mismatches: list[str]


class Pool(BaseModel):
    model_config = _CLOSED
    name: str
    kind: Literal["kubernetes", "baremetal", "hpc", "cloud"]
    gpu_type: str
    capacity: float
    used: float
    borrowed: float
    free: float
    labels: dict[str, str]
    workers: PoolWorkers
    takes_work: bool = Field(
        description="false: no live worker (nor, for an autoscaled pool, a running "
        "autoscaler), so no new placements"
    )
    autoscaled: bool
    start_timeout_s: Count
    by_level: list[LevelUse] = Field(
        description="GPUs used here by each group the caller sees, rolled up the tree, top first"
    )
    cloud: PoolCloud | None = None
    autoscaler: PoolAutoscaler | SkipJsonSchema[None] = None
    capacity_truth: CapacityTruth | SkipJsonSchema[None] = None


class PoolList(BaseModel):
    model_config = _CLOSED
    pools: list[Pool]


class PlannedResource(BaseModel):
    """A compute resource in the plan state: its tasks queued and placed."""

    model_config = _CLOSED
    queued: int
    placed: int
    placed_gpus: float
    weighted_placed: int


class BudgetHours(BaseModel):
    """GPU-hours a policy used of its budget, per period."""

    model_config = _CLOSED
    day: float
    week: float
    month: float


class PlannedPolicy(BaseModel):
    """A policy in the plan state: its use and its budget's."""

    model_config = _CLOSED
    group: str
    used_gpus: float
    placed: int
    weighted_placed: int
    budget_used_hours: BudgetHours


class PlannedPool(BaseModel):
    """A pool in the plan state: its placements and GPUs used."""

    model_config = _CLOSED
    placed: int
    used_gpus: float


class MonthUsage(BaseModel):
    """GPU-hours of one GPU type in one month."""

    model_config = _CLOSED
    gpu_type: str
    month: str
    gpu_hours: float


class PlanState(BaseModel):
    model_config = _CLOSED
    revision: str
    commit: str | None
    at: Time
    compute_resources: dict[str, PlannedResource]
    policies: dict[str, PlannedPolicy]
    pools: dict[str, PlannedPool]
    usage: list[MonthUsage]
    capacity_mismatches: dict[str, list[str]] = Field(
        default_factory=dict,
        description="per pool: how its live workers disagree with what it declares",
    )


class RefusedRevision(BaseModel):
    """The last estate revision refused: what, when, from where and why."""

    model_config = _CLOSED
    revision: str | None
    commit: str | None = None
    at: Time
    source: str | None = None
    errors: list[str]


class Estate(BaseModel):
    model_config = _CLOSED
    revision: str
    applied_at: datetime | None
    source: str | None
    commit: str | None = Field(description="the git commit it was read from (--git)")
    pools: int
    profiles: int
    policies: int
    compute_resources: int
    refused: RefusedRevision | None


ESTATE_ANSWERS: tuple[type[BaseModel], ...] = (
    Policy,
    PolicyList,
    Pool,
    PoolCloud,
    PoolList,
    PlanState,
    Estate,
)
"""The estate's answers whose schemas are generated, by the name the operations use."""
