"""The API's answers as pydantic models, all but the estate's view (its policies, pools,
plan state and revision: ``estate``): the shapes whose schemas the document generates
(``schema.components``), as it does the requests' (``requests``).

The views (``views.py``) still build these answers as dicts; the suite checks the answers it
gets against the document's schema (tests/daemon/test_endpoints.py, test_worker_answers.py,
tests/channels/test_channel_answers.py, the schemathesis run of test_openapi.py), so a view
and its model cannot drift apart unseen where the suite calls it (docs/decisions.md, issue 27
item 3).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from kliqued.api_models.channels import CHANNELS

_CLOSED = ConfigDict(extra="forbid")

Time = Annotated[
    datetime, Field(description="RFC 3339 UTC, e.g. 2026-11-29T08:00:00Z (milliseconds allowed)")
]


_SETTINGS = (
    "the pool's settings in the estate in force (partition, account, namespace, ...): "
    "docs/executors.md"
)


class ErrorBody(BaseModel):
    """What went wrong: a code for programs, a message for people, and where."""

    model_config = _CLOSED
    code: Annotated[str, Field(pattern="^[a-z][a-z0-9-]*$")]
    message: str
    details: dict[str, Any] = Field(default_factory=dict)


class Error(BaseModel):
    model_config = _CLOSED
    error: ErrorBody


class Health(BaseModel):
    model_config = _CLOSED
    status: Literal["ok", "starting"]
    revision: str
    engine: Literal["enabled", "disabled"]


class WhoAmI(BaseModel):
    model_config = _CLOSED
    principal: str
    kind: Literal["user", "worker", "role"]
    name: str
    groups: list[str]
    admin_of: list[str]
    roles: list[Literal["admin", "finance", "planner"]]
    token_id: str | None


class Reason(BaseModel):
    model_config = _CLOSED
    kind: Literal["order", "user_limit", "limit", "budget", "capacity", "pending", "worker"]
    text: str


class Engine(BaseModel):
    model_config = _CLOSED
    enabled: bool
    last_pass_at: datetime | None
    pass_interval_s: float
    revision: str


class SessionLink(BaseModel):
    model_config = _CLOSED
    url: str
    expires_in_s: int


class LogSize(BaseModel):
    model_config = _CLOSED
    size: Annotated[int, Field(ge=0)]


class AutoscalerAlive(BaseModel):
    model_config = _CLOSED
    pool: str
    live: bool
    timeout_s: float = Field(description="silent this long, it is lost")


class Token(BaseModel):
    model_config = _CLOSED
    id: str
    principal: str
    name: str | None
    created_at: Time
    created_by: str | None
    revoked_at: datetime | None
    expires_at: datetime | None


class TokenList(BaseModel):
    model_config = _CLOSED
    tokens: list[Token]


class TokenCreated(BaseModel):
    model_config = _CLOSED
    id: str
    token: Annotated[str, Field(pattern="^kq_")]
    principal: str
    name: str | None
    created_at: Time
    expires_at: datetime | None
    rotated_from: str | None = None


class IdentityProvider(BaseModel):
    model_config = _CLOSED
    name: str
    issuer: str
    client_id: str
    scopes: list[str]


class IdentityProviders(BaseModel):
    """What a client needs to start a sign-in (``kliqued login``, the dashboard)."""

    model_config = _CLOSED
    providers: list[IdentityProvider]


class LeaseRef(BaseModel):
    model_config = _CLOSED
    task: str
    epoch: Annotated[int, Field(ge=1)]


class Registered(BaseModel):
    model_config = _CLOSED
    worker_id: str
    heartbeat_ttl_s: float
    poll_wait_s: float
    running: list[LeaseRef]
    settings: dict[str, str] = Field(description=_SETTINGS)


class StopInstruction(BaseModel):
    model_config = _CLOSED
    task: str
    epoch: int
    reason: Literal["preempted", "cancelled", "budget", "stale-epoch"]
    text: str
    grace_s: float


class HeartbeatAnswer(BaseModel):
    model_config = _CLOSED
    stop: list[StopInstruction]
    ttl_s: float


class ReportResult(BaseModel):
    """One report of a batch: its status as if sent alone, and the error if it failed."""

    model_config = _CLOSED
    task: str
    epoch: int
    status: int
    error: dict[str, Any] = Field(
        default_factory=dict,
        description="a refused report's error (an Error's `error`); absent when `status` is 200",
    )


class ReportResults(BaseModel):
    model_config = _CLOSED
    results: list[ReportResult]


class Deregistered(BaseModel):
    model_config = _CLOSED
    worker: str
    pool: str
    requeued: list[str]


class Session(BaseModel):
    model_config = _CLOSED
    id: Annotated[str, Field(pattern="^t-[0-9A-Z]{14}$")] = Field(description="its task's id")
    task: str
    user: str
    resource: str
    app: str | None
    state: str = Field(
        description="queued, starting, running, or how it ended (`stopped: idle (cpu 30m)`)"
    )
    url: str = Field(description="where its owner reaches it")
    idle: dict[str, str] = Field(description="its idle limits")
    connected: bool = Field(description="its worker's tunnel is open: the URL answers")


class SessionList(BaseModel):
    model_config = _CLOSED
    sessions: list[Session]


class Alert(BaseModel):
    model_config = _CLOSED
    threshold: float
    at: Time
    text: str


class WorkerLease(BaseModel):
    """A lease a worker holds, and whether it is being stopped."""

    model_config = _CLOSED
    task: str
    epoch: int
    status: Literal["active", "stopping"]


class Worker(BaseModel):
    model_config = _CLOSED
    id: str
    pool: str
    hostname: str | None
    executor: str | None
    gpus: int
    version: str | None
    registered_at: datetime | None
    state: Literal["alive", "silent", "lost"]
    lost_at: datetime | None
    cannot_work: str | None = Field(description="why the worker says it takes no work now")
    leases: list[WorkerLease]
    apps: list[str] | None = Field(
        description="the session apps it can start (null: it did not say)"
    )


class WorkerList(BaseModel):
    model_config = _CLOSED
    workers: list[Worker]
    next: str | None


class SqlResult(BaseModel):
    model_config = _CLOSED
    columns: list[str]
    types: list[str]
    rows: list[list[Any]]
    truncated: bool
    elapsed_ms: float


class CloudNode(BaseModel):
    model_config = _CLOSED
    node: str
    provider: str
    instance_type: str
    lifecycle: Literal["spot", "on-demand"]
    gpus: Annotated[int, Field(ge=0)]
    per_hour: str = Field(
        description="decimal text in the estate's currency: the node's price an hour"
    )
    since: Time
    ended_at: datetime | None
    end_reason: str | None


class Event(BaseModel):
    model_config = _CLOSED
    seq: Annotated[int, Field(ge=1)]
    at: Time
    kind: str
    task: str | None
    actor: str | None
    revision: str | None
    data: dict[str, Any]


class EventList(BaseModel):
    model_config = _CLOSED
    events: list[Event]
    next: int | None


class QueueEntry(BaseModel):
    model_config = _CLOSED
    id: str
    user: str
    position: Annotated[int, Field(ge=1)]
    gpus: float
    waiting_reason: Reason | None
    submitted_at: Time


class Queue(BaseModel):
    model_config = _CLOSED
    resource: str
    queued: Annotated[int, Field(ge=0)]
    queue: list[QueueEntry]


class Lease(BaseModel):
    """A task leased to a worker: what it runs, on how much, with what. ``rank``, ``world``
    and ``nodes`` only for a gang's member (their defaults are not in the document)."""

    model_config = _CLOSED
    task: str
    epoch: Annotated[int, Field(ge=1)]
    command: list[str] | None
    payload: Any
    gpus: float
    resource: str
    user: str
    project: str | None
    labels: dict[str, str]
    grace_s: float
    env: dict[str, str]
    settings: dict[str, str] = Field(default_factory=dict, description=_SETTINGS)
    rank: Annotated[int, Field(ge=0)] = Field(0, description="a gang member's rank (issue 15)")
    world: Annotated[int, Field(ge=2)] = Field(2, description="a gang's members")
    nodes: Annotated[int, Field(ge=2)] = Field(
        2, description="the nodes a gang spans (a Slurm or Kubernetes worker takes it whole)"
    )


class Leases(BaseModel):
    model_config = _CLOSED
    leases: list[Lease]


class Preemption(BaseModel):
    """A task's latest preemption: its kind, in words, and when."""

    model_config = _CLOSED
    kind: str
    text: str
    at: Time


class TaskEnd(BaseModel):
    """Why a task ended and who ended it."""

    model_config = _CLOSED
    text: str = Field(
        description="why it ended, e.g. `failed: exit code 3: CUDA out of memory`, "
        "`cancelled by user:erin: reason`"
    )
    by: str | None = Field(description="who cancelled it: a principal, or `estate`")
    message: str | None = Field(description="the message of the worker's report that ended it")


class Forecast(BaseModel):
    """The earliest time a waiting task could start that the estate can know (issue 31)."""

    model_config = _CLOSED
    start_at: datetime | None = Field(description="null: unknown (`text` says what it waits for)")
    basis: Literal["now", "budget-reset", "protection-end", "task-end", "unknown"]
    text: str = Field(
        description="e.g. `not before 2026-12-08 00:00 UTC: the budget resets`, "
        "`unknown: waits for capacity`"
    )


class Task(BaseModel):
    model_config = _CLOSED
    id: Annotated[str, Field(pattern="^t-[0-9A-Z]{14}$")]
    resource: str
    policy: str
    profile: str
    group: str
    user: str
    actor: str = Field(description="the principal that sent it")
    channel: Annotated[str, Field(json_schema_extra={"enum": list(CHANNELS)})] = Field(
        description="how it was sent: `cli`, `sdk` (declared by the client in "
        "`X-Klique-Channel`), `api` (no header), or by the daemon itself for `mcp`, "
        "`schedule`, `pipeline`, `session`"
    )
    project: str | None
    labels: dict[str, str]
    command: list[str] | None
    payload: Any
    gpus: float | None
    state: Literal["queued", "placed", "running", "ended"] = Field(
        description="`running` is a sub-state of `placed`: placed, and its worker reported "
        "it started"
    )
    end_reason: str | None
    pool: str | None = Field(description="where it is placed (ended: where it last ran)")
    submitted_at: Time
    placed_at: datetime | None
    ended_at: datetime | None
    position: Annotated[int | None, Field(ge=1)]
    waiting_reason: Reason | None
    preemptions: Annotated[int, Field(ge=0)]
    last_preemption: Preemption | None
    revision: str
    worker: str | None = Field(description="the worker of its latest lease")
    epoch: Annotated[int, Field(ge=0)] = Field(
        description="its latest lease's fencing epoch (0: never leased)"
    )
    started_at: datetime | None = Field(description="when its current attempt started")
    exit_code: int | None
    signal: str | None = Field(description="e.g. SIGKILL")
    outputs: dict[str, str] | None = Field(
        description="what it wrote to $KLIQUE_OUTPUTS, once finished"
    )
    gpu_hours: Annotated[float, Field(ge=0)] = Field(
        description="GPU-hours of its placements, the current one up to now included"
    )
    end: TaskEnd | None
    protected_until: datetime | None = Field(
        description="a placed task: when its protection (lending.md protect_for) ends; null "
        "without one"
    )
    lost_work_s: Annotated[float | None, Field(ge=0)] = Field(
        description="a placed task: the work a preemption now would lose (since its last "
        "checkpoint, else its placement)"
    )
    lost_gpu_hours_so_far: Annotated[float, Field(ge=0)] = Field(
        description="GPU-hours its preemptions have lost"
    )
    forecast: Forecast | None = Field(
        description="a queued task: the earliest start the estate can know (issue 31); null "
        "otherwise, and in a page with more than 20 queued tasks"
    )


class DryRunVictim(BaseModel):
    """A placed task the dry-run task would take GPUs from."""

    model_config = _CLOSED
    task: str | None = Field(description="its id, when the caller may see it (else null)")
    user: str | None = Field(description="its user, when the caller may see the task")
    group: str
    resource: str
    pool: str
    gpus: float
    kind: Literal["reclaimed", "rebalanced"]
    lost_work_s: Annotated[float, Field(ge=0)] = Field(
        description="the work it would lose (since its last checkpoint, else its placement)"
    )
    protected_until: datetime | None = Field(
        description="when its protection ended (protected work is never taken); null: its "
        "policy protects nothing"
    )


class DryRunBudget(BaseModel):
    """One budgeted level of the task's group: now, and with the task running."""

    model_config = _CLOSED
    group: str
    policy: str
    period: Literal["day", "week", "month"]
    resets_at: Time
    hours: float
    used_hours: float
    left_hours: float
    burn_rate: float = Field(description="budget hours per hour now")
    burn_rate_with: float = Field(description="budget hours per hour with the task running")
    runout_at: datetime | None = Field(description="at the rate now, if before the reset")
    runout_with_at: datetime | None = Field(description="with the task running")
    start_check: Literal["passes", "fails"] = Field(
        description="whether the budget start check (the low watermark) lets it start now"
    )


class DryRun(BaseModel):
    """What the engine would do with a task sent now (``dry_run: true``): nothing stored."""

    model_config = _CLOSED
    dry_run: Literal[True]
    resource: str
    group: str
    user: str
    gpus: float
    at: Time = Field(description="the moment the answer is for")
    settled: bool = Field(
        description="false: a pass is due that has not run yet (work just submitted or "
        "ended, a budget or protection moment), which may change the answer"
    )
    outcome: Literal["placed", "waiting"]
    pool: str | None
    phase: Literal["reserve", "reclaim", "lend", "rebalance"] | None = Field(
        description="which phase would place it: within reservation, by reclaiming borrowed "
        "GPUs, on idle capacity lent, or by rebalancing (order: fair)"
    )
    victims: list[DryRunVictim]
    waiting_reason: Reason | None
    position: Annotated[int, Field(ge=1)] = Field(description="its place in line (1: the head)")
    budgets: list[DryRunBudget]
    cost_per_hour: float | None = Field(
        description="its GPUs at the price of `price_pool` (where it would run, else its "
        "profile's first pool); null: no price for that GPU type"
    )
    currency: str
    price_pool: str | None
    forecast: Forecast


class TaskList(BaseModel):
    model_config = _CLOSED
    tasks: list[Task]
    next: str | None


class ReportAnswer(BaseModel):
    model_config = _CLOSED
    task: Task


class ScheduleRun(BaseModel):
    model_config = _CLOSED
    due: Time
    at: Time
    outcome: Literal["submitted", "skipped", "missed", "failed"]
    text: str | None
    task: str | None
    pipeline: str | None
    missed: int
    state: str | None = Field(
        description="its task's state now (or how it ended), or its pipeline's"
    )


class SchedulePipeline(BaseModel):
    """The pipeline a schedule runs: its file, its name, the parameters it is given."""

    model_config = _CLOSED
    file: str
    name: str | None
    params: dict[str, Any]


class Schedule(BaseModel):
    model_config = _CLOSED
    id: Annotated[str, Field(pattern="^s-[0-9A-Z]{14}$")]
    name: str | None
    owner: str
    cron: str
    timezone: str
    resource: str | None
    command: list[str] | None
    project: str | None
    gpus: float | None
    labels: dict[str, str]
    pipeline: SchedulePipeline | None
    concurrency: Literal["allow", "forbid", "replace"]
    missed: Literal["run-once", "skip"]
    deadline_s: int | None
    state: Literal["active", "paused", "stopped"]
    reason: str | None = Field(description="why it is paused or stopped")
    token: str | None = Field(
        description="the id of the token it runs on (never the secret): the one that made "
        "it, or its owner's that resumed it; null for a schedule made before schedules "
        "recorded it"
    )
    created_at: Time
    next_runs: list[Time]
    last_runs: list[ScheduleRun] = Field(description="newest first")


class ScheduleList(BaseModel):
    model_config = _CLOSED
    schedules: list[Schedule]


class PipelineStep(BaseModel):
    model_config = _CLOSED
    name: str
    resource: str
    needs: list[str]
    state: Literal["waiting", "running", "succeeded", "failed", "skipped", "cancelled"]
    text: str | None
    attempts: int
    task: str | None
    tasks: list[str]
    task_state: str | None
    outputs: dict[str, str]


class Pipeline(BaseModel):
    model_config = _CLOSED
    id: Annotated[str, Field(pattern="^p-[0-9A-Z]{14}$")]
    name: str
    owner: str
    file: str
    params: dict[str, str]
    on_failure: Literal["fail-fast", "continue"]
    schedule: str | None
    state: Literal["running", "paused", "succeeded", "failed", "cancelled"]
    token: str | None = Field(description="the id of the token its steps are sent on")
    text: str | None = Field(description="why it is paused, or how it ended")
    started_at: Time
    ended_at: datetime | None
    steps: list[PipelineStep]


class PipelineList(BaseModel):
    model_config = _CLOSED
    pipelines: list[Pipeline]


class FromTask(BaseModel):
    """A profile whose size the task gives: the size without one, and the most it may ask."""

    model_config = _CLOSED
    default: float
    max: float | None


class RoomBudget(BaseModel):
    """The group's budget in a resource's room: hours, period, used, left, reset."""

    model_config = _CLOSED
    hours: float
    period: str
    used_hours: float
    left_hours: float
    resets_at: Time


class Room(BaseModel):
    """A group's room where it may submit: GPUs used against reservation and limit."""

    model_config = _CLOSED
    group: str
    used: float
    reservation: float
    limit: float
    free: float = Field(description="GPUs below the group's limit")
    budget: RoomBudget | None


class Resource(BaseModel):
    model_config = _CLOSED
    name: str
    policy: str
    profile: str
    group: str
    gpus: float | None
    from_task: FromTask | None
    time_weight: float
    pools: list[str]
    queued: Annotated[int, Field(ge=0)]
    placed: Annotated[int, Field(ge=0)]
    may_submit: bool = Field(description="the caller is one of the group's users")
    room: Room


class ResourceList(BaseModel):
    model_config = _CLOSED
    resources: list[Resource]


class Budget(BaseModel):
    model_config = _CLOSED
    hours: float
    period: Literal["day", "week", "month"]
    period_start: Time
    resets_at: Time
    used_hours: float
    left_hours: float
    burn_rate: float = Field(description="budget hours per hour")
    runout_at: datetime | None
    alerts: list[Alert] | SkipJsonSchema[None] = Field(
        None, description="this period's alerts: for those who can act on them"
    )


class WaitingGroup(BaseModel):
    model_config = _CLOSED
    group: str
    policy: str
    tasks: Annotated[int, Field(ge=1)]
    gpus: float
    reason: Reason | None = Field(
        description="why its first waiting task (the queue head that waited longest) waits"
    )


class Waiting(BaseModel):
    model_config = _CLOSED
    tasks: Annotated[int, Field(ge=0)]
    gpus: float
    groups: list[WaitingGroup] = Field(description="each team of the subtree with queued work")


RESPONSES: tuple[type[BaseModel], ...] = (
    Error,
    IdentityProviders,
    Health,
    WhoAmI,
    Reason,
    Engine,
    SessionLink,
    LogSize,
    AutoscalerAlive,
    Token,
    TokenList,
    TokenCreated,
    LeaseRef,
    Registered,
    StopInstruction,
    HeartbeatAnswer,
    ReportResults,
    Deregistered,
    Session,
    SessionList,
    Alert,
    Worker,
    WorkerList,
    SqlResult,
    CloudNode,
    Event,
    EventList,
    QueueEntry,
    Queue,
    Lease,
    Leases,
    Task,
    Forecast,
    DryRunVictim,
    DryRunBudget,
    DryRun,
    TaskList,
    ReportAnswer,
    ScheduleRun,
    Schedule,
    ScheduleList,
    PipelineStep,
    Pipeline,
    PipelineList,
    Resource,
    ResourceList,
    Budget,
    WaitingGroup,
    Waiting,
)
"""The answers whose schemas are generated, by the name the operations use."""
