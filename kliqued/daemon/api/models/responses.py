"""The API's plainer answers as pydantic models: the shapes whose schemas the document
generates (``schema.components``), as it does the requests' (``requests``).

The views (``views.py``) still build these answers as dicts; the suite checks every answer
it gets against the document's schema (tests/daemon/test_endpoints.py, test_org_views.py),
so a view and its model cannot drift apart unseen. The larger shapes (a task, a policy, a
pool, a schedule, ...) are still written in ``openapi.py`` (docs/decisions.md, issue 27
item 3).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

_CLOSED = ConfigDict(extra="forbid")

Time = Annotated[
    datetime, Field(description="RFC 3339 UTC, e.g. 2026-11-29T08:00:00Z (milliseconds allowed)")
]


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
    settings: dict[str, str] = Field(
        description="the pool's settings in the estate in force (partition, account, "
        "namespace, ...): docs/executors.md"
    )


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


RESPONSES: tuple[type[BaseModel], ...] = (
    Error,
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
)
"""The answers whose schemas are generated, by the name the operations use."""
