"""The API's request bodies as pydantic models: the one definition of their shapes.

The OpenAPI document's request schemas are generated from these (``schema.components``)
and requests are validated against the document (``request.valid``), so a body's shape is
written here once. The handlers' own checks (a cron's grammar, a duration's words, a token's
ten years) stay in the handlers: they need the estate, the clock or the caller.

Conventions, so that the generated schema says what the API has always said:

- ``extra="forbid"`` unless a worker may send fields a newer worker adds (the worker
  protocol's bodies: ``extra="allow"``).
- An optional field the API accepts as ``null`` is ``X | None``; one it does not is ``X``
  with a default (defaults are not written into the document: the handlers apply theirs).
- A union of models is written ``oneOf``: its branches must be exclusive (``TokenRequest``'s
  by the key each requires and the others forbid).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel

_FORBID = ConfigDict(extra="forbid")
_ALLOW = ConfigDict(extra="allow")

Name = Annotated[str, Field(min_length=1, max_length=256)]
Resource = Annotated[str, Field(min_length=1, max_length=512)]
Duration = Annotated[str, Field(max_length=32)] | Annotated[int, Field(ge=0)] | None
"""a duration: 90d, 12h, 30m, 45s, 2w, or whole seconds (the handlers read the words)"""
Gpus = Annotated[float | None, Field(ge=0, multiple_of=0.001)]
Command = Annotated[list[str], Field(max_length=10000)] | None
Labels = Annotated[
    dict[
        Annotated[str, Field(min_length=1, max_length=128)], Annotated[str, Field(max_length=1024)]
    ],
    Field(max_length=64),
]
OUTPUT_KEY = "^[A-Za-z_][A-Za-z0-9_]{0,127}$"
Outputs = Annotated[
    Annotated[
        dict[str, Annotated[str, Field(max_length=4096)]],
        # propertyNames, not a pattern on the key type: pydantic writes that as
        # patternProperties, which lets every other key through
        Field(max_length=100, json_schema_extra={"propertyNames": {"pattern": OUTPUT_KEY}}),
    ]
    | None,
    Field(
        description="a finished task's KEY=VALUE lines from the file named by "
        "$KLIQUE_OUTPUTS (pipelines pass them to later steps)"
    ),
]
Event = Literal["started", "finished", "failed", "stopped", "lost"]

_DURATION = "a duration: 90d, 12h, 30m, 45s, 2w, or whole seconds"
_EXPIRES_IN = "the token stops working this long after its creation (e.g. 90d); default: never"


class TaskSubmission(BaseModel):
    model_config = _FORBID
    resource: Resource = Field(
        description="compute resource, <policy>/<profile>", examples=["llm-research/h100"]
    )
    command: Command = None
    payload: Any = Field(
        None, description="any JSON value, for channels that send data rather than a command"
    )
    gpus: Gpus = Field(None, description="size, only for profiles whose size comes from the task")
    project: Annotated[str | None, Field(min_length=1, max_length=256)] = None
    labels: Labels = Field(default_factory=dict)
    user: Annotated[str | None, Field(min_length=1, max_length=256)] = Field(
        None, description="admins only: the user the task is sent for"
    )
    dry_run: bool = Field(
        False,
        description="true: nothing is stored; the answer (200, `DryRun`) says what the engine "
        "would do with the task now: placed (pool, phase, whom it would reclaim or "
        "rebalance) or waiting (reason, place in line), the budget with it, its cost per "
        "hour and the earliest start the estate can know (issue 31)",
    )


class PipelineRunRequest(BaseModel):
    model_config = _FORBID
    file: Annotated[str | None, Field(min_length=1, max_length=1024)] = Field(
        None, description="the file's name, for positions in errors"
    )
    text: Annotated[str, Field(min_length=1, max_length=262144)] = Field(
        description="the pipeline file (YAML; schemas/pipeline.schema.json)"
    )
    params: Annotated[
        dict[str, Annotated[str, Field(max_length=4096)]] | None, Field(max_length=100)
    ] = None
    project: Annotated[str | None, Field(min_length=1, max_length=256)] = Field(
        None, description="the project of the steps that name none (before the file's own)"
    )


class ScheduleCreate(BaseModel):
    model_config = _FORBID
    cron: Annotated[str, Field(min_length=1, max_length=256)] = Field(
        description="standard 5-field cron (minute hour day-of-month month day-of-week), "
        "read in `timezone`",
        examples=["0 2 * * *"],
    )
    timezone: Annotated[str | None, Field(min_length=1, max_length=64)] = Field(
        None, description="an IANA time zone (default UTC)"
    )
    name: Annotated[str | None, Field(min_length=1, max_length=256)] = None
    resource: Annotated[str | None, Field(min_length=1, max_length=512)] = None
    command: Command = None
    project: Annotated[str | None, Field(min_length=1, max_length=256)] = None
    gpus: Gpus = None
    labels: Labels = Field(default_factory=dict)
    pipeline: PipelineRunRequest | None = None
    concurrency: Literal["allow", "forbid", "replace", None] = Field(
        None,
        description="a run while the previous one still runs: runs beside it, is "
        "skipped, or replaces it",
    )
    missed: Literal["run-once", "skip", None] = Field(
        None,
        description="due times passed while the daemon was down: the latest runs once "
        "(within `deadline`), or none",
    )
    deadline: Duration = Field(
        None, description="run-once: how late a missed run may still start (default: any)"
    )


def _idle(kind: str) -> Any:
    return Field(
        None,
        description=f"idle limit `{kind}`: at most the profile's (a session may lower its "
        "limits, never raise them)",
    )


class IdleLimits(BaseModel):
    model_config = _FORBID
    wall: Duration = _idle("wall")
    cpu: Duration = _idle("cpu")
    gpu: Duration = _idle("gpu")
    network: Duration = _idle("network")


class SessionStart(BaseModel):
    model_config = _FORBID
    resource: Resource = Field(description="compute resource, <policy>/<profile>")
    app: Literal["jupyter", "vscode", "shell"]
    command: Annotated[list[str], Field(min_length=1, max_length=10000)] | None = Field(
        None,
        description="instead of the app's usual command: a server that listens on "
        "127.0.0.1:$KLIQUE_SESSION_PORT under the path $KLIQUE_SESSION_PREFIX",
    )
    project: Annotated[str | None, Field(min_length=1, max_length=256)] = None
    gpus: Gpus = None
    idle: IdleLimits = Field(default_factory=IdleLimits)


class CancelRequest(BaseModel):
    model_config = _FORBID
    reason: Annotated[str | None, Field(max_length=1024)] = Field(
        None, description="why, shown to the task's owner"
    )


class EngineSwitch(BaseModel):
    model_config = _FORBID
    enabled: bool


class _TokenOptions(BaseModel):
    """What every token request may add: a name and when it stops working."""

    model_config = _FORBID
    name: Annotated[str | None, Field(max_length=256)] = None
    expires_in: Duration = Field(None, description=_EXPIRES_IN)
    expires_at: datetime | None = Field(None, description="or: the instant it stops working")


class UserTokenRequest(_TokenOptions):
    user: Name


class WorkerTokenRequest(_TokenOptions):
    worker: Literal[True]
    pool: Name


class RoleTokenRequest(_TokenOptions):
    role: Literal["admin", "finance", "planner"]


class TokenRequest(RootModel[UserTokenRequest | WorkerTokenRequest | RoleTokenRequest]):
    """A token for a user, a pool's workers or a role: exactly one of ``user``, ``worker``
    (with ``pool``) and ``role``."""


class SignInRequest(BaseModel):
    """A sign-in: an ID token of a provider the estate trusts, for a Klique token."""

    model_config = _FORBID
    id_token: Annotated[str, Field(min_length=1, max_length=16384)] = Field(
        description="the provider's ID token (a JWT), just received from its token endpoint"
    )
    role: Literal["admin", "finance", "planner"] | None = Field(
        None,
        description="act as this role (settings.identity.roles must list you); "
        "default: as yourself",
    )


class TokenRotation(BaseModel):
    model_config = _FORBID
    grace: Duration = Field(
        None,
        description="how long the old token keeps working (e.g. 1h); default 0: it stops at once",
    )
    expires_in: Duration = Field(None, description=_EXPIRES_IN)
    expires_at: datetime | None = Field(None, description="or: the instant it stops working")


class LedgerSql(BaseModel):
    model_config = _FORBID
    sql: Annotated[str, Field(min_length=1, max_length=100_000)]
    limit: Annotated[int, Field(ge=1, le=100_000)] = 100_000
    timeout_s: Annotated[float, Field(gt=0, le=10)] = Field(
        10, description="time limit counted from arrival (default and maximum 10)"
    )


class WorkerRegistration(BaseModel):
    model_config = _ALLOW
    worker_id: Annotated[str, Field(pattern="^[A-Za-z0-9._:-]{1,128}$")]
    hostname: Annotated[str | None, Field(max_length=256)] = None
    pool: Name
    executor: Annotated[str | None, Field(max_length=64)] = None
    gpus: Annotated[list[dict[str, Any]], Field(max_length=1024)] = Field(default_factory=list)
    version: Annotated[str | None, Field(max_length=64)] = None
    apps: Annotated[
        list[Annotated[str, Field(pattern="^[a-z0-9][a-z0-9_-]{0,31}$")]] | None,
        Field(max_length=32),
    ] = Field(
        None,
        description="the session apps it can start (their program found at its start); "
        "absent: it does not say, and any session may be sent to it",
    )


class GpuRoom(BaseModel):
    """Room on one GPU, as a fraction of it."""

    model_config = _ALLOW
    index: Annotated[int, Field(ge=0)]
    free: Annotated[float, Field(ge=0, le=1)]


class LeaseRequest(BaseModel):
    model_config = _ALLOW
    free_gpus: Annotated[list[Annotated[int, Field(ge=0)]], Field(max_length=1024)] = Field(
        description="indices of entirely free GPUs"
    )
    gpu_free: Annotated[list[GpuRoom], Field(max_length=1024)] | None = Field(
        None, description="room on every GPU with room (fractions)"
    )
    cpu_free: Annotated[int, Field(ge=0, le=1000000)] = Field(
        1000000,
        description="CPU-only (0-GPU) tasks the worker starts now; absent: no limit",
    )


class RunningTask(BaseModel):
    """A task a worker's heartbeat says it runs."""

    model_config = _ALLOW
    task: str
    epoch: int
    state: str = "running"
    checkpoint_at: Annotated[str, Field(max_length=64)] = Field(
        "",
        description="the task's last checkpoint (its $KLIQUE_CHECKPOINT_FILE's time, "
        "RFC 3339, the worker's clock): lending.md's lost work counts from it",
    )


class Heartbeat(BaseModel):
    model_config = _ALLOW
    running: Annotated[list[RunningTask], Field(max_length=100_000)]
    cannot_work: Annotated[str | None, Field(max_length=500)] = Field(
        None,
        description="why the worker takes no work now (its state dir cannot be written); "
        "shown on the worker",
    )


class TaskReport(BaseModel):
    model_config = _ALLOW
    epoch: Annotated[int, Field(ge=1)]
    event: Event
    exit_code: int | None = None
    signal: Annotated[str | None, Field(max_length=32)] = None
    at: Annotated[str | None, Field(max_length=64)] = None
    message: Annotated[str | None, Field(max_length=4096)] = None
    outputs: Outputs = None
    reason: Annotated[str | None, Field(max_length=64)] = Field(
        None,
        description="for a `stopped` the worker decided itself: `idle` (an idle limit: "
        "the task ends `stopped: idle (<limit>)`) or `shutdown` (handed back on a clean "
        "shutdown: requeued, not counted as lost) or `cannot-work` (handed back by a "
        "worker that cannot work, e.g. a full state dir: the same)",
    )


class WorkerReport(BaseModel):
    """One task's report in a batch (``WorkerReports``): a ``TaskReport`` naming its task."""

    model_config = _ALLOW
    task: Annotated[str, Field(min_length=1, max_length=128)]
    epoch: Annotated[int, Field(ge=1)]
    event: Event
    exit_code: int | None = None
    signal: Annotated[str | None, Field(max_length=32)] = None
    at: Annotated[str | None, Field(max_length=64)] = None
    message: Annotated[str | None, Field(max_length=4096)] = None
    outputs: Outputs = None
    reason: Annotated[str | None, Field(max_length=64)] = None


class WorkerReports(BaseModel):
    model_config = _FORBID
    reports: Annotated[list[WorkerReport], Field(min_length=1, max_length=1000)]


class CloudNodeStart(BaseModel):
    model_config = _FORBID
    node: Annotated[
        str, Field(min_length=1, max_length=256, pattern="^[A-Za-z0-9][A-Za-z0-9._:-]*$")
    ] = Field(description="the provider's id of the node (an EC2 instance id)")
    provider: Annotated[str, Field(min_length=1, max_length=64, pattern="^[a-z0-9][a-z0-9_-]*$")]
    instance_type: Annotated[
        str, Field(min_length=1, max_length=100, pattern="^[A-Za-z0-9][A-Za-z0-9._-]*$")
    ]
    lifecycle: Literal["spot", "on-demand"]
    gpus: Annotated[int, Field(ge=0, le=1024)]


class ScalingReport(BaseModel):
    model_config = _FORBID
    cause: Literal["spend_cap", "capacity", "error", None] = Field(
        description="why placed work waits for a node; null: it no longer does"
    )
    reason: Annotated[str | None, Field(max_length=2000)] = None
    waiting: Annotated[int, Field(ge=0, le=10_000_000)] = 0


class AutoscalerHeartbeat(BaseModel):
    model_config = _FORBID
    interval_s: Annotated[float, Field(ge=0, le=3600)] = Field(
        10,
        description="its round interval: it is lost after the workers' TTL or three "
        "rounds, whichever is longer",
    )


REQUESTS: tuple[type[BaseModel], ...] = (
    TaskSubmission,
    ScheduleCreate,
    SessionStart,
    PipelineRunRequest,
    CancelRequest,
    EngineSwitch,
    TokenRequest,
    TokenRotation,
    SignInRequest,
    LedgerSql,
    WorkerRegistration,
    LeaseRequest,
    Heartbeat,
    TaskReport,
    WorkerReports,
    CloudNodeStart,
    ScalingReport,
    AutoscalerHeartbeat,
)
"""Every request body of the API, by the name its operations use."""
