"""The MCP tools: what an agent may do for its user, each one an API operation of the CLI's.

Every tool runs as the principal that called ``/mcp`` (its bearer token, checked like any API
call), through the same functions as the HTTP handlers: first the route's role check
(``routes.Route.check`` of the operation it stands for), then the handler's own object-level
rules (a task the user may not see is "no task", a resource they may not use is refused with
the ones they may). So an agent can never do what its user cannot. What a tool changes goes
through ``submission.submit_as`` / ``tasks.cancel_as`` with the channel ``mcp``: the event
log's actor is the user, the channel says an agent did it.

A refusal is a tool error (``isError``) whose text is the API's message and status, never a
traceback; an agent reads it and tells its user.

A tool's input schema is the MCP SDK's, from the function's signature, with each argument
that is a field of the API's request body (``BODIES``: the body's model, from
``kliqued/api_models/requests.py``, the models the document and the SDK use) described by the
document's schema of that field: an agent sees the bounds and words the API applies. An
argument of such a tool is a field of its model or one of ``NOT_FIELDS``; any other is an
error when the server is built (``with_api_fields``), so a field renamed in the model cannot
leave a tool behind unseen. A tool's body holds only its model's fields (``api_body``); the
API still checks the values (``submit_as`` validates the body against the document), so its
refusals keep their words.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Any, Awaitable, Callable, Iterator, TypeVar

from pydantic import BaseModel

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp_types import ToolAnnotations

from klique_util.excerpt import clip, excerpt

from kliqued.api_models.requests import CancelRequest, TaskSubmission
from kliqued.daemon.api import views
from kliqued.daemon.state import history
from kliqued.daemon.auth import Principal
from kliqued.daemon.errors import ApiError
from kliqued.daemon.api.handlers import meta, policies, pools, resources, tasks, workers
from kliqued.daemon.api.openapi import SCHEMAS
from kliqued.daemon.api.request import Context
from kliqued.daemon.api.routes import Route
from kliqued.daemon.api.submission import submit_as
from kliqued.daemon.api.dryrun import dry_run_as
from kliqued.daemon.api.agents.explain import explain, explain_kind

ACTING_AS: ContextVar[Principal | None] = ContextVar("klique_mcp_principal", default=None)
"""The principal the current MCP request acts as: set by the ``/mcp`` endpoint from the
request's token (``endpoint.py``), or by an in-process caller (``acting_as``). The SDK carries
it from the HTTP request to the tool call (it copies the sender's context per message)."""

OPS: dict[str, Route] = {
    r.operation_id: r
    for r in (
        *meta.ROUTES,
        *tasks.ROUTES,
        *workers.ROUTES,
        *resources.ROUTES,
        *policies.ROUTES,
        *pools.ROUTES,
    )
}
"""The API operations the tools stand for, with who may call them (the route tables)."""

LOG_BYTES = 64 * 1024
"""A log read's default size: an agent's context is small, and it can page with ``offset``."""

INSTRUCTIONS = (
    "Klique allocates GPUs. You act as the user whose token you hold, with exactly their "
    "rights. list_resources shows where they may send work (may_submit); dry_run_task says "
    "what would happen if a task were sent now (where, whom it displaces, budget, cost, "
    "earliest start) without sending it; submit_task sends a "
    "command there; show_task says where a task is, why it waits and its earliest start; explain_task says what a "
    "reason means and what the user can do; read_log reads a task's output; cancel_task stops "
    "it; budget shows the group's GPU-hours used, left, burn rate and projected run-out; "
    "list_pools shows capacity. Everything you submit or cancel is recorded as the user's, "
    "through the mcp channel."
)

T = TypeVar("T")


@contextlib.contextmanager
def acting_as(p: Principal) -> Iterator[None]:
    """Tool calls made inside run as ``p`` (the endpoint's, and in-process callers')."""
    token = ACTING_AS.set(p)
    try:
        yield
    finally:
        ACTING_AS.reset(token)


def _principal() -> Principal:
    p = ACTING_AS.get()
    if p is None:  # a server wired without the endpoint: refuse rather than guess
        raise ToolError("unauthenticated: this MCP server has no caller identity")
    return p


async def _as(op: str, fn: Callable[[Principal], Awaitable[T]]) -> T:
    """``fn`` run as the caller, once the route of ``op`` admits their role; an API refusal
    becomes the tool's error, with the API's words and status."""
    p = _principal()
    try:
        OPS[op].check(p)
        return await fn(p)
    except ApiError as exc:
        raise ToolError(f"{exc.message} ({exc.status} {exc.code})") from None


async def _now(value: T) -> T:
    return value


READ = ToolAnnotations(read_only_hint=True, open_world_hint=False)
CHANGE = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False
)
STOP = ToolAnnotations(
    read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False
)


BODIES: dict[str, type[BaseModel]] = {
    "submit_task": TaskSubmission,
    "dry_run_task": TaskSubmission,
    "cancel_task": CancelRequest,
}
"""The tools whose arguments are fields of an API request body, and that body's model."""

NOT_FIELDS = {
    "idempotency_key": "the Idempotency-Key header",
    "task_id": "the task in the path",
}
"""The arguments of a ``BODIES`` tool that are not fields of its body, and where they go."""

REASON_MAX: int = SCHEMAS["CancelRequest"]["properties"]["reason"]["maxLength"]
"""A cancellation's reason at most: the model's bound, checked before the task is looked up
(``tasks.cancel_as`` takes the reason, not a body)."""


def api_body(model: type[BaseModel], **fields: Any) -> dict[str, Any]:
    """A tool's body for ``model``: the fields given, none of them ``null``. A name that is
    no field of ``model`` is the tool's own bug, said at once (the API would refuse it as an
    unexpected property, naming no tool)."""
    unknown = set(fields) - set(model.model_fields)
    if unknown:
        raise TypeError(f"{', '.join(sorted(unknown))}: no field of {model.__name__}")
    return {k: v for k, v in fields.items() if v is not None}


def _required(schema: dict[str, Any]) -> dict[str, Any]:
    """A field's schema for an argument the tool requires: without ``null`` (the signature
    has no default, so an agent must give a value)."""
    kinds = schema.get("type")
    if isinstance(kinds, list) and "null" in kinds:
        rest = [k for k in kinds if k != "null"]
        return {**schema, "type": rest[0] if len(rest) == 1 else rest}
    return schema


def with_api_fields(tool: Tool) -> Tool:
    """``tool`` with the input schema of each argument that is a field of its API body
    replaced by the document's schema of that field (generated from the body's model). An
    argument that is neither a field of the model nor one of ``NOT_FIELDS`` is an error."""
    model = BODIES.get(tool.name)
    if model is None:
        return tool
    body = SCHEMAS[model.__name__]["properties"]
    params = tool.parameters
    required = set(params.get("required", []))
    props = dict(params.get("properties", {}))
    strays = set(props) - set(body) - set(NOT_FIELDS)
    if strays:
        raise ValueError(
            f"MCP tool {tool.name}: {', '.join(sorted(strays))} is no field of "
            f"{model.__name__} (kliqued/api_models/requests.py): rename the argument, or "
            "add it to NOT_FIELDS with where it goes"
        )
    for name in props.keys() & body.keys():
        props[name] = _required(body[name]) if name in required else body[name]
    return tool.model_copy(update={"parameters": {**params, "properties": props}})


def build(c: Context) -> MCPServer:
    """The MCP server of a running daemon (``c``), with its tools."""
    d = c.daemon
    made: list[tuple[Callable[..., Any], ToolAnnotations]] = []

    def tool(annotations: ToolAnnotations) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """A tool of the server (made below, once all are defined: ``with_api_fields``)."""

        def add(fn: Callable[..., Any]) -> Callable[..., Any]:
            made.append((fn, annotations))
            return fn

        return add

    @tool(READ)
    async def whoami() -> dict[str, Any]:
        """Who the agent acts as: the user, their groups and the groups they administer."""
        return await _as("whoami", lambda p: _now(views.whoami(d, p)))

    @tool(READ)
    async def list_resources() -> dict[str, Any]:
        """The compute resources (POLICY/PROFILE) the user may see, with `may_submit` for
        the ones they may send work to, their GPUs per task, pools, queue length and their
        group's room (GPUs used against reservation and limit, budget left)."""
        return await _as("listResources", lambda p: _now(resources.resources_of(d, p)))

    @tool(CHANGE)
    async def submit_task(
        resource: str,
        command: list[str],
        gpus: float | None = None,
        project: str | None = None,
        labels: dict[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Send a task (a command and its arguments, e.g. ["python", "train.py"]) to a
        compute resource the user may use (list_resources, `may_submit`). `gpus` only for a
        resource whose size comes from the task; `project` where the group asks for one.
        Give the same `idempotency_key` when retrying, so a retry never sends it twice.
        Returns the task: its id, state and, while it waits, why."""
        body = api_body(
            TaskSubmission,
            resource=resource,
            command=command,
            gpus=gpus,
            project=project,
            labels=labels,
        )

        async def go(p: Principal) -> dict[str, Any]:
            _, rec = await submit_as(c, p, body, "mcp", idempotency_key)
            return views.task(d, rec)

        return await _as("submitTask", go)

    @tool(READ)
    async def dry_run_task(
        resource: str,
        command: list[str],
        gpus: float | None = None,
        project: str | None = None,
        labels: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Ask before sending: what the engine would do with this task if submit_task sent
        it now, with nothing stored and nothing changed. Returns `outcome` (placed or
        waiting); placed: `pool`, `phase` and the `victims` it would take GPUs from (with
        their protection); waiting: `waiting_reason` and `position`; the group's `budgets`
        with it running (burn rate, run-out, whether the start check passes);
        `cost_per_hour`; `forecast`, the earliest start the estate can know. Refused
        exactly where submit_task would be."""
        body = api_body(
            TaskSubmission,
            resource=resource,
            command=command,
            gpus=gpus,
            project=project,
            labels=labels,
            dry_run=True,
        )
        return await _as("submitTask", lambda p: _now(dry_run_as(c, p, body, "mcp")))

    @tool(READ)
    async def show_task(task_id: str) -> dict[str, Any]:
        """A task: its state, where it is (pool, worker), its place in line and why it waits
        (`waiting_reason`), or why it ended (`end`); with the reason explained."""

        async def go(p: Principal) -> dict[str, Any]:
            await history.recall(c.store, d, task_id)  # an ended task evicted since
            view = views.task(d, tasks.visible_task(d, p, task_id))
            return {**view, "explained": explain(view)}

        return await _as("getTask", go)

    @tool(READ)
    async def explain_task(task_id: str | None = None, kind: str | None = None) -> dict[str, Any]:
        """A task's reason in plain words: what it means and what the user can do. Give a
        `task_id`, or a reason `kind` alone (order, user_limit, limit, budget, capacity,
        pending, worker)."""
        if (task_id is None) == (kind is None):
            raise ToolError("give either task_id or kind")
        if kind is not None:
            try:
                return explain_kind(kind)
            except ValueError as exc:
                raise ToolError(clip(str(exc))) from None
        tid = task_id or ""
        await history.recall(c.store, d, tid)  # an ended task evicted since
        return await _as(
            "getTask", lambda p: _now(explain(views.task(d, tasks.visible_task(d, p, tid))))
        )

    @tool(STOP)
    async def cancel_task(task_id: str, reason: str | None = None) -> dict[str, Any]:
        """Cancel a queued or running task of the user's (a running one is stopped and
        frees its GPUs). Cancelling an ended task changes nothing. `reason` is recorded."""
        if reason is not None and len(reason) > REASON_MAX:
            raise ToolError(f"reason: at most {REASON_MAX} characters")
        return await _as("cancelTask", lambda p: tasks.cancel_as(c, p, task_id, reason, "mcp"))

    @tool(READ)
    async def read_log(
        task_id: str, attempt: int | None = None, offset: int = 0, max_bytes: int = LOG_BYTES
    ) -> dict[str, Any]:
        """A task's output (stdout and stderr), from byte `offset`, at most `max_bytes`
        (up to 1 MiB). `attempt` is a placement's number (default: the latest; `attempts`
        lists them). Read on from `next_offset`; `complete` says the attempt has ended."""
        if (
            offset < 0
            or not 1 <= max_bytes <= workers.MAX_READ
            or (attempt is not None and attempt < 1)
        ):
            raise ToolError(f"offset must be >= 0, max_bytes 1 to {workers.MAX_READ}, attempt >= 1")

        async def go(p: Principal) -> dict[str, Any]:
            log = await workers.log_of(c, p, task_id, attempt, offset, max_bytes)
            return {
                "task": task_id,
                "attempt": log.epoch,
                "attempts": log.epochs,
                "text": log.data.decode("utf-8", "replace"),
                "offset": offset,
                "next_offset": log.next_offset,
                "size": log.size,
                "complete": log.complete,
            }

        return await _as("getTaskLog", go)

    @tool(READ)
    async def budget(policy: str | None = None) -> dict[str, Any]:
        """The budgets of the user's groups (or one `policy`): GPU-hours used and left in
        the period, the burn rate (budget hours per hour), the projected run-out (null: not
        before the reset), when it resets, and GPUs used against reservation and limit."""

        def go(p: Principal) -> dict[str, Any]:
            out = policies.policies_of(d, p)
            if policy is not None:
                out["policies"] = [x for x in out["policies"] if x["name"] == policy]
                if not out["policies"]:
                    name = excerpt(policy, quoted=False)
                    raise ApiError(
                        404, "not-found", f"no policy {name} among those {p.text} may see"
                    )
            return out

        return await _as("listPolicies", lambda p: _now(go(p)))

    @tool(READ)
    async def list_pools() -> dict[str, Any]:
        """The pools: GPU type, capacity, GPUs used, borrowed and free, live workers."""
        return await _as("listPools", lambda p: _now(pools.pools_of(d, p)))

    return MCPServer(
        "klique",
        title="Klique GPU allocation",
        instructions=INSTRUCTIONS,
        version="1",
        warn_on_duplicate_tools=True,
        tools=[with_api_fields(Tool.from_function(fn, annotations=a)) for fn, a in made],
    )
