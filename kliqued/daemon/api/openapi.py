"""The OpenAPI 3.1 document served at ``/v1/openapi.json``.

It is the API's authority (api-contract.md): request bodies are validated against its own
schemas (``validator``), so the document and the checks cannot drift, and the test suite
validates the document and fuzzes the API from it. Every schema, request bodies' and
answers', is generated from its model (``kliqued/api_models``: ``requests.py``,
``responses.py``, ``estate.py``; ``SCHEMAS``), the models the SDK and the MCP tools build
their bodies with too; the operations are written here as data
(docs/decisions.md, issue 27 item 3).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, Iterable, Protocol

from klique_util.jsonschema_import import import_jsonschema

import_jsonschema()  # before jsonschema's first import: without the IRI grammar (2.3 s)

from jsonschema import Draft202012Validator  # noqa: E402
from referencing import Registry, Resource  # noqa: E402
from referencing.jsonschema import DRAFT202012  # noqa: E402

from kliqued.daemon.state.channels import DECLARED, HEADER  # noqa: E402
from kliqued.api_models.requests import REQUESTS  # noqa: E402
from kliqued.api_models.responses import RESPONSES  # noqa: E402
from kliqued.api_models.estate import ESTATE_ANSWERS  # noqa: E402
from kliqued.api_models.schema import components  # noqa: E402
from kliqued.daemon.api.schema_rules import (  # noqa: E402
    SINCE_PATTERN,
    UTC_TIME_PATTERN,
    name_rule,
    with_name_rule,
)
from kliqued.ledger.focus import MONTH_PATTERN  # noqa: E402

URN = "urn:kliqued:openapi"

TIME = {
    "type": "string",
    "format": "date-time",
    "description": "RFC 3339 UTC, e.g. 2026-11-29T08:00:00Z (milliseconds allowed)",
}


UTC_TIME = {**TIME, "pattern": UTC_TIME_PATTERN}
"""A time parameter: what ``params.time_param`` reads (``Z`` only)."""


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


SCHEMAS: dict[str, Any] = with_name_rule(
    components((*REQUESTS, *RESPONSES, *ESTATE_ANSWERS)), [m.__name__ for m in REQUESTS]
)
"""The document's schemas, all generated from models: every request body
(``api_models/requests.py``) and every answer (``api_models/responses.py``, ``estate.py``);
the request bodies' names with the rule that they hold no control character
(``schema_rules``)."""

_ERRORS = {
    "400": "invalid request (`invalid-request`, `invalid-json`); the message starts with "
    "the JSON pointer of the field (`/command/1`) or the parameter it is about. "
    "Refused at the edge: lone UTF-16 surrogates anywhere, control characters in "
    "names and ids, NUL in commands, NaN, Infinity and numbers beyond a double or "
    "64 bits, nesting deeper than 32",
    "401": "no token, an unknown token or a revoked one (`unauthenticated`)",
    "403": "the principal may not do this (`forbidden`)",
    "404": "no such object, or not visible to the caller (`not-found`)",
    "405": "the method is not served here (`method-not-allowed`)",
    "406": "MCP: the Accept header must take application/json and text/event-stream",
    "413": "body over 1 MiB (`request-too-large`), or a task's command or payload over "
    "64 KiB (`too-large`)",
    "415": "MCP: the body must be application/json",
    "409": "a stale fencing epoch (`stale-epoch`: stop this copy of the task), or a "
    "conflict (`conflict`)",
    "422": "the estate does not allow it (`submission-refused`, `unknown-pool`), a task "
    "with neither command nor payload (`invalid-task`), or data the event log cannot "
    "store (`unstorable`), a cloud node for a pool that does not autoscale "
    "(`not-autoscaled`), or a value of the right form that no schema can judge: a date "
    "the calendar lacks, an unknown time zone, what only an admin's call needs "
    "(`invalid-field`)",
    "429": "the user's tasks not yet ended already hold 16 MiB of commands and payloads "
    "(`user-quota`): wait for some to end, or cancel some",
    "500": "an unexpected error, logged with the id in the message (`internal`)",
    "503": "shutting down, or the log cannot be written (`unavailable`)",
}


def _err(*codes: str) -> dict[str, Any]:
    return {
        c: {"description": _ERRORS[c], "content": {"application/json": {"schema": _ref("Error")}}}
        for c in codes
    }


def _ok(schema: str, code: str = "200", desc: str = "OK") -> dict[str, Any]:
    return {code: {"description": desc, "content": {"application/json": {"schema": _ref(schema)}}}}


def _q(name: str, schema: dict[str, Any], desc: str) -> dict[str, Any]:
    """A query parameter; a name's text holds no control character (``schema_rules``)."""
    return {
        "name": name,
        "in": "query",
        "required": False,
        "schema": name_rule(schema),
        "description": desc,
    }


def _p(name: str, desc: str, example: str | None = None) -> dict[str, Any]:
    out = {
        "name": name,
        "in": "path",
        "required": True,
        "schema": name_rule({"type": "string", "minLength": 1}),
        "description": desc,
    }
    if example is not None:
        out["example"] = example
    return out


EXAMPLES: dict[str, Any] = {
    "TaskSubmission": {
        "resource": "llm-research/h100",
        "command": ["python", "train.py"],
        "project": "rlhf",
        "labels": {"run": "r42"},
        "user": "alice",
    },
    "EngineSwitch": {"enabled": True},
    "TokenRequest": {"user": "alice", "name": "alice's laptop"},
    "SignInRequest": {"id_token": "eyJhbGciOiJSUzI1NiIs..."},
    "LedgerSql": {"sql": 'SELECT "group", sum(gpu_hours) FROM usage GROUP BY 1', "limit": 100},
    "WorkerRegistration": {
        "worker_id": "w-gpu01-1a2b3c4d",
        "hostname": "gpu01",
        "pool": "onprem-baremetal",
        "executor": "process",
        "gpus": [{"index": 0, "uuid": "GPU-0", "memory_mb": 49152, "model": "NVIDIA L40S"}],
        "version": "0.1.0",
    },
    "LeaseRequest": {"free_gpus": [0, 1]},
    "CloudNodeStart": {
        "node": "i-0abc1234def567890",
        "provider": "ec2",
        "instance_type": "g6e.xlarge",
        "lifecycle": "spot",
        "gpus": 1,
    },
    "AutoscalerHeartbeat": {"interval_s": 10},
    "ScalingReport": {
        "cause": "capacity",
        "waiting": 2,
        "reason": "ec2: no on-demand capacity for 1 GPU(s): g6e.xlarge: "
        "InsufficientInstanceCapacity",
    },
    "Heartbeat": {"running": [{"task": "t-01M8K8MWK70000", "epoch": 1, "state": "running"}]},
    "TaskReport": {
        "epoch": 1,
        "event": "finished",
        "exit_code": 0,
        "signal": None,
        "at": "2026-11-29T08:00:00Z",
        "message": None,
    },
}


def _body(schema: str) -> dict[str, Any]:
    media: dict[str, Any] = {"schema": _ref(schema)}
    if schema in EXAMPLES:
        media["example"] = EXAMPLES[schema]
    return {"required": True, "content": {"application/json": media}}


AUTH_ERR = ("400", "401", "403", "413", "500", "503")
CHANNEL_HEADER = {
    "name": HEADER,
    "in": "header",
    "required": False,
    "schema": {"type": "string", "enum": list(DECLARED)},
    "description": "the client's channel, recorded with the task and in the "
    "ledger (the CLI sends `cli`, the SDK `sdk`); absent: `api`. "
    "Any other value is a 400",
}
LIMIT = {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100}


def _op(
    op_id: str,
    summary: str,
    responses: dict[str, Any],
    params: list[dict[str, Any]] | None = None,
    body: str | None = None,
    errors: tuple[str, ...] = AUTH_ERR,
) -> dict[str, Any]:
    """An operation; who may call it is added by ``document`` from the route tables."""
    out: dict[str, Any] = {
        "operationId": op_id,
        "summary": summary,
        "responses": {**responses, **_err(*errors)},
    }
    if params:
        out["parameters"] = params
    if body:
        out["requestBody"] = _body(body)
    return out


_MCP_ANSWER = {
    "200": {
        "description": "the MCP exchange's answer (JSON-RPC)",
        "content": {"application/json": {"schema": {"type": "object"}}},
    }
}

PATHS: dict[str, Any] = {
    "/mcp": {
        "post": _op(
            "mcp",
            "Model Context Protocol, streamable HTTP (docs/channels.md): an "
            "agent's tool calls, run with its user's rights; JSON-RPC "
            "bodies, as the MCP specification defines them",
            _MCP_ANSWER,
            errors=("400", "401", "403", "406", "413", "415", "500"),
        ),
        "get": _op(
            "mcpStream",
            "MCP: the server-to-client stream (stateless here: 405)",
            {},
            errors=("401", "403", "405"),
        ),
        "delete": _op(
            "mcpEnd", "MCP: end a session (stateless here: 405)", {}, errors=("401", "403", "405")
        ),
    },
    "/.well-known/oauth-protected-resource/mcp": {
        "get": _op(
            "mcpResourceMetadata",
            "the protected resource metadata of /mcp (RFC 9728), named by its 401 answers",
            {
                "200": {
                    "description": "resource, bearer_methods_supported, resource_name",
                    "content": {"application/json": {"schema": {"type": "object"}}},
                }
            },
            errors=("500",),
        )
    },
    "/v1/health": {
        "get": _op("health", "liveness, revision and engine switch", _ok("Health"), errors=("500",))
    },
    "/v1/leader": {
        "get": _op(
            "leader",
            "which daemon leads (docs/ha.md); a standby answers it too, with status standby",
            {
                "200": {
                    "description": "status, role (leader or standby), self (this daemon's "
                    "URL), leader (url, epoch, holder; null while none)",
                    "content": {"application/json": {"schema": {"type": "object"}}},
                }
            },
            errors=("500",),
        )
    },
    "/v1/openapi.json": {
        "get": _op(
            "openapi",
            "this document",
            {
                "200": {
                    "description": "the OpenAPI 3.1 document",
                    "content": {"application/json": {"schema": {"type": "object"}}},
                }
            },
            errors=("500",),
        )
    },
    "/metrics": {
        "get": _op(
            "metrics",
            "Prometheus metrics (docs/metrics.md)",
            {
                "200": {
                    "description": "the Prometheus text exposition format 0.0.4",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                }
            },
        )
    },
    "/v1/whoami": {"get": _op("whoami", "the caller's principal, groups and roles", _ok("WhoAmI"))},
    "/v1/tasks": {
        "post": _op(
            "submitTask",
            "send a task to a compute resource",
            {
                **_ok("Task", "201", "created"),
                "200": {
                    "description": "a retry: the task first created with this "
                    "Idempotency-Key; or, with `dry_run: true`, what the engine would do "
                    "(nothing stored)",
                    "content": {
                        "application/json": {"schema": {"oneOf": [_ref("Task"), _ref("DryRun")]}}
                    },
                },
            },
            params=[
                {
                    "name": "Idempotency-Key",
                    "in": "header",
                    "required": False,
                    "schema": {"type": "string", "minLength": 1, "maxLength": 256},
                    "description": "a retry with the same key and principal returns the "
                    "first task (200) instead of creating another",
                },
                CHANNEL_HEADER,
            ],
            body="TaskSubmission",
            errors=AUTH_ERR + ("422", "429"),
        ),
        "get": _op(
            "listTasks",
            "tasks, oldest first (or newest first: `order`), in pages (a page also stops "
            "once its tasks "
            "hold 4 MiB of commands and payloads: follow `next`)",
            _ok("TaskList"),
            params=[
                _q(
                    "state",
                    {"type": "string", "enum": ["queued", "placed", "ended"]},
                    "only tasks in this state (`placed` includes `running` ones)",
                ),
                _q("resource", {"type": "string"}, "only this compute resource"),
                _q("user", {"type": "string"}, "only this user's tasks"),
                _q("group", {"type": "string"}, "only this group's tasks"),
                _q("pool", {"type": "string"}, "only tasks placed (or last placed) on this pool"),
                _q(
                    "order",
                    {"type": "string", "enum": ["oldest", "newest"]},
                    "`newest`: newest first (as `kliqued status` and the dashboard list them); "
                    "default `oldest`",
                ),
                _q("limit", LIMIT, "page size"),
                _q("after", {"type": "string"}, "the `next` of the previous page"),
            ],
        ),
    },
    "/v1/tasks/{id}": {
        "get": _op(
            "getTask",
            "one task, with its place in line and reason",
            _ok("Task"),
            params=[_p("id", "task id")],
            errors=AUTH_ERR + ("404",),
        )
    },
    "/v1/tasks/{id}/cancel": {
        "post": _op(
            "cancelTask",
            "cancel a queued or placed task (idempotent)",
            _ok("Task"),
            params=[_p("id", "task id"), CHANNEL_HEADER],
            body="CancelRequest",
            errors=AUTH_ERR + ("404",),
        )
    },
    "/v1/tasks/{id}/report": {
        "post": _op(
            "reportTask",
            "a worker reports a lease's start or end (idempotent; fenced by epoch)",
            _ok("ReportAnswer"),
            params=[_p("id", "task id")],
            body="TaskReport",
            errors=AUTH_ERR + ("404", "409"),
        )
    },
    "/v1/tasks/{id}/log": {
        "post": {
            **_op(
                "uploadTaskLog",
                "a worker uploads a task's log from byte `offset` (idempotent "
                "by offset; at most 256 KiB a call)",
                _ok("LogSize"),
                params=[
                    _p("id", "task id"),
                    {
                        **_q(
                            "offset",
                            {"type": "integer", "minimum": 0},
                            "byte offset of this chunk in the attempt's log",
                        ),
                        "required": True,
                    },
                    _q(
                        "epoch",
                        {"type": "integer", "minimum": 1},
                        "the lease's epoch (default: the task's latest); a fenced one is 409",
                    ),
                ],
                errors=AUTH_ERR + ("404", "409"),
            ),
            "requestBody": {
                "required": True,
                "content": {
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
                },
            },
        },
        "get": _op(
            "getTaskLog",
            "a task's log (one attempt), from byte `offset`",
            {
                "200": {
                    "description": "the log as text; headers X-Klique-Epoch, "
                    "X-Klique-Epochs, X-Klique-Log-Size, "
                    "X-Klique-Next-Offset, X-Klique-Log-Complete",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                }
            },
            params=[
                _p("id", "task id"),
                _q("offset", {"type": "integer", "minimum": 0, "default": 0}, "from this byte"),
                _q(
                    "epoch",
                    {"type": "integer", "minimum": 0},
                    "which attempt (default: the latest)",
                ),
                _q(
                    "limit",
                    {"type": "integer", "minimum": 1, "maximum": 4194304},
                    "at most this many bytes",
                ),
            ],
            errors=AUTH_ERR + ("404",),
        ),
    },
    "/v1/workers": {
        "get": _op(
            "listWorkers",
            "registered workers and their leases",
            _ok("WorkerList"),
            params=[
                _q("pool", {"type": "string"}, "only this pool's workers"),
                _q("limit", {**LIMIT, "default": 1000}, "page size (by worker id)"),
                _q("after", {"type": "string"}, "the `next` of the previous page"),
            ],
        )
    },
    "/v1/pools/{pool}/nodes": {
        "post": _op(
            "recordCloudNode",
            "a node the autoscaler started: its interval opens in the ledger "
            "(cloud_nodes) at its price; the same node again answers 200",
            {**_ok("CloudNode", "201", "recorded"), **_ok("CloudNode", "200", "already recorded")},
            params=[_p("pool", "an autoscaled cloud pool")],
            body="CloudNodeStart",
            errors=AUTH_ERR + ("404", "409", "422"),
        )
    },
    "/v1/pools/{pool}/nodes/{node}": {
        "delete": _op(
            "endCloudNode",
            "a node the autoscaler released: its interval closes",
            _ok("CloudNode"),
            params=[
                _p("pool", "the node's pool"),
                _p("node", "the node's id"),
                _q("reason", {"type": "string", "maxLength": 500}, "why it was released"),
            ],
            errors=AUTH_ERR + ("404",),
        )
    },
    "/v1/pools/{pool}/autoscaler": {
        "post": _op(
            "autoscalerHeartbeat",
            "the pool's autoscaler runs (each round): an autoscaled pool "
            "with no live worker takes work only while it does",
            _ok("AutoscalerAlive"),
            params=[_p("pool", "an autoscaled cloud pool")],
            body="AutoscalerHeartbeat",
            errors=AUTH_ERR + ("404", "422"),
        )
    },
    "/v1/pools/{pool}/scaling": {
        "post": _op(
            "reportScaling",
            "why placed work waits for a node (logged when it changes; the "
            "month's first spend-cap wait raises spend_cap_reached)",
            _ok("PoolCloud"),
            params=[_p("pool", "an autoscaled cloud pool")],
            body="ScalingReport",
            errors=AUTH_ERR + ("404", "422"),
        )
    },
    "/v1/workers/{id}": {
        "delete": _op(
            "deregisterWorker",
            "a worker leaves: its active leases' tasks go back to the front "
            "of their queues (see docs/worker-protocol.md)",
            _ok("Deregistered"),
            params=[_p("id", "worker id")],
            errors=AUTH_ERR + ("404",),
        )
    },
    "/v1/workers/{id}/reports": {
        "post": _op(
            "reportTasks",
            "several reports of one worker in one request and one transaction; "
            "one result each (200, or the error the single report would get)",
            _ok("ReportResults"),
            params=[_p("id", "worker id")],
            body="WorkerReports",
            errors=AUTH_ERR + ("404",),
        )
    },
    "/v1/workers/register": {
        "post": _op(
            "registerWorker",
            "a worker registers with its pool and GPUs; the answer lists the "
            "leases the control plane believes it holds",
            _ok("Registered"),
            body="WorkerRegistration",
            errors=AUTH_ERR + ("409", "422"),
        )
    },
    "/v1/workers/{id}/lease": {
        "post": _op(
            "leaseTasks",
            "long poll: placed tasks of the worker's pool that fit its free GPUs",
            _ok("Leases"),
            params=[
                _p("id", "worker id"),
                _q(
                    "wait",
                    {"type": "number", "minimum": 0, "maximum": 3600},
                    "seconds to wait for work at most (capped by poll_wait_s)",
                ),
            ],
            body="LeaseRequest",
            errors=AUTH_ERR + ("404",),
        )
    },
    "/v1/workers/{id}/heartbeat": {
        "post": _op(
            "workerHeartbeat",
            "renews the worker's TTL; answers stop instructions",
            _ok("HeartbeatAnswer"),
            params=[_p("id", "worker id")],
            body="Heartbeat",
            errors=AUTH_ERR + ("404",),
        )
    },
    "/v1/resources": {
        "get": _op(
            "listResources", "the compute resources the caller may use or see", _ok("ResourceList")
        )
    },
    "/v1/resources/{policy}/{profile}/queue": {
        "get": _op(
            "getQueue",
            "a compute resource's queue, in order",
            _ok("Queue"),
            params=[
                _p("policy", "policy name", "llm-research"),
                _p("profile", "profile name", "h100"),
                _q(
                    "limit",
                    {"type": "integer", "minimum": 1, "maximum": 10000, "default": 1000},
                    "at most this many entries, from the head",
                ),
            ],
            errors=AUTH_ERR + ("404",),
        )
    },
    "/v1/policies": {
        "get": _op(
            "listPolicies",
            "use against reservation and limit, budgets, burn rate, alerts",
            _ok("PolicyList"),
        )
    },
    "/v1/policies/{name}": {
        "get": _op(
            "getPolicy",
            "one policy",
            _ok("Policy"),
            params=[_p("name", "policy name", "llm-research")],
            errors=AUTH_ERR + ("404",),
        )
    },
    "/v1/pools": {
        "get": _op("listPools", "pools with capacity, used, borrowed and free", _ok("PoolList"))
    },
    "/v1/events": {
        "get": _op(
            "listEvents",
            "the event and audit log, in pages (a page also stops after 4 MiB "
            "of event data: follow `next`)",
            _ok("EventList"),
            params=[
                _q(
                    "task",
                    {"type": "string"},
                    "one task's events (404 for a task the caller may not see)",
                ),
                _q("kind", {"type": "string"}, "one kind, e.g. preempted"),
                _q(
                    "since",
                    {"type": "integer", "minimum": 0},
                    "events after this seq (the `next` of the previous page)",
                ),
                _q("limit", LIMIT, "page size"),
            ],
            errors=AUTH_ERR + ("404",),
        )
    },
    "/v1/engine": {
        "get": _op("getEngine", "the engine switch and its last pass", _ok("Engine")),
        "post": _op("setEngine", "switch the engine on or off", _ok("Engine"), body="EngineSwitch"),
    },
    "/v1/estate": {
        "get": _op(
            "getEstate", "the running estate revision, and the last refused one", _ok("Estate")
        )
    },
    "/v1/plan/state": {
        "get": _op(
            "getPlanState",
            "the running revision and the live counts `kliqued plan --against` "
            "reads: per compute resource, policy and pool; GPU-hours per GPU type and month",
            _ok("PlanState"),
        )
    },
    "/v1/demand": {
        "get": _op(
            "getDemand",
            "the work submitted in a window, as a trace CSV (id, submit, resource, "
            "user, project, gpus, runtime, channel, status): what `kliqued plan --what-if-from` "
            "replays; the running revision in X-Klique-Revision",
            {
                "200": {
                    "description": "CSV, tasks in submission order",
                    "content": {"text/csv": {"schema": {"type": "string"}}},
                }
            },
            params=[
                _q(
                    "since",
                    {"type": "string", "default": "14d", "pattern": SINCE_PATTERN},
                    "a duration back from now (14d, 36h) or an RFC 3339 time",
                )
            ],
            errors=AUTH_ERR + ("422",),
        )
    },
    "/v1/tokens": {
        "post": _op(
            "createToken",
            "a token for a user, a worker (one pool) or a role",
            _ok("TokenCreated", "201", "created: the only time the token is shown"),
            body="TokenRequest",
            errors=AUTH_ERR + ("422",),
        ),
        "get": _op("listTokens", "every token (never the secret)", _ok("TokenList")),
    },
    "/v1/signin": {
        "get": _op(
            "listIdentityProviders",
            "the identity providers people sign in with (settings.identity): what "
            "`kliqued login` and the dashboard start a sign-in from",
            _ok("IdentityProviders"),
            errors=("500",),
        ),
        "post": _op(
            "signIn",
            "an ID token of a trusted provider for a short-lived Klique token "
            "(settings.identity.token_lifetime) of the estate user it names; the audit "
            "records the provider and subject",
            _ok("TokenCreated", "201", "signed in: the only time the token is shown"),
            body="SignInRequest",
            errors=("400", "401", "403", "413", "422", "500", "503"),
        ),
    },
    "/v1/tokens/{id}/rotate": {
        "post": _op(
            "rotateToken",
            "a new secret for the same principal and name; the old token stops "
            "at once, or after `grace`",
            _ok("TokenCreated", "201"),
            params=[_p("id", "token id")],
            body="TokenRotation",
            errors=AUTH_ERR + ("404", "409", "422"),
        )
    },
    "/v1/tokens/{id}": {
        "delete": _op(
            "revokeToken",
            "revoke a token (idempotent)",
            {"204": {"description": "revoked"}},
            params=[_p("id", "token id")],
            errors=AUTH_ERR + ("404",),
        )
    },
    "/v1/ledger/sql": {
        "post": _op(
            "ledgerSql",
            "read-only SQL on the usage ledger (one statement, a snapshot, no file "
            "or network access, a time limit)",
            _ok("SqlResult"),
            body="LedgerSql",
            errors=AUTH_ERR + ("422",),
        )
    },
    "/v1/ledger/export": {
        "get": _op(
            "ledgerExport",
            "ledger intervals overlapping [from, to), as CSV",
            {
                "200": {
                    "description": "CSV, streamed",
                    "content": {"text/csv": {"schema": {"type": "string"}}},
                }
            },
            params=[
                {**_q("from", UTC_TIME, "start (inclusive)"), "required": True},
                {**_q("to", UTC_TIME, "end (exclusive)"), "required": True},
                _q(
                    "format",
                    {"type": "string", "enum": ["csv"], "default": "csv"},
                    "csv (the CLI writes parquet from it)",
                ),
            ],
        )
    },
    "/v1/schedules": {
        "post": _op(
            "createSchedule",
            "a schedule: a command or a pipeline run by cron as the user who makes it",
            _ok("Schedule", "201", "created"),
            body="ScheduleCreate",
            errors=AUTH_ERR + ("422", "429"),
        ),
        "get": _op("listSchedules", "the schedules the caller may see", _ok("ScheduleList")),
    },
    "/v1/schedules/{id}": {
        "get": _op(
            "getSchedule",
            "one schedule, with its next and last runs",
            _ok("Schedule"),
            params=[_p("id", "schedule id")],
            errors=AUTH_ERR + ("404",),
        ),
        "delete": _op(
            "deleteSchedule",
            "delete a schedule (its running tasks go on)",
            {"204": {"description": "deleted"}},
            params=[_p("id", "schedule id")],
            errors=AUTH_ERR + ("404",),
        ),
    },
    "/v1/schedules/{id}/pause": {
        "post": _op(
            "pauseSchedule",
            "no run until resumed (idempotent)",
            _ok("Schedule"),
            params=[_p("id", "schedule id")],
            errors=AUTH_ERR + ("404", "409"),
        )
    },
    "/v1/schedules/{id}/resume": {
        "post": _op(
            "resumeSchedule",
            "runs again from the next due time (a stopped one: once its "
            "owner may send its work again); by its owner, it runs on the "
            "caller's token from now on; anyone else resumes it only while "
            "the token it runs on still works",
            _ok("Schedule"),
            params=[_p("id", "schedule id")],
            errors=AUTH_ERR + ("404", "409"),
        )
    },
    "/v1/sessions": {
        "post": _op(
            "startSession",
            "start an interactive server (a session) as a task",
            _ok("Session", "201", "started"),
            body="SessionStart",
            errors=AUTH_ERR + ("422", "429"),
        ),
        "get": _op("listSessions", "the sessions the caller may see", _ok("SessionList")),
    },
    "/v1/sessions/{id}": {
        "get": _op(
            "getSession",
            "one session",
            _ok("Session"),
            params=[_p("id", "session id")],
            errors=AUTH_ERR + ("404",),
        )
    },
    "/v1/sessions/{id}/stop": {
        "post": _op(
            "stopSession",
            "stop a session (idempotent)",
            _ok("Session"),
            params=[_p("id", "session id")],
            errors=AUTH_ERR + ("404",),
        )
    },
    "/v1/sessions/{id}/link": {
        "post": _op(
            "linkSession",
            "a one-time link (2 minutes) that opens the session in a browser",
            _ok("SessionLink"),
            params=[_p("id", "session id")],
            errors=AUTH_ERR + ("404",),
        )
    },
    "/v1/sessions/{id}/tunnel": {
        "get": _op(
            "sessionTunnel",
            "a WebSocket from the worker running the session: its requests are relayed over it",
            {"101": {"description": "switching to the WebSocket protocol"}},
            params=[
                _p("id", "session id"),
                _q("epoch", {"type": "integer", "minimum": 1}, "the lease's epoch"),
            ],
            errors=AUTH_ERR + ("404", "409"),
        )
    },
    "/v1/pipelines": {
        "post": _op(
            "runPipeline",
            "run a pipeline file (every step checked first)",
            _ok("Pipeline", "201", "started"),
            body="PipelineRunRequest",
            errors=AUTH_ERR + ("422", "429"),
        ),
        "get": _op("listPipelines", "the pipelines the caller may see", _ok("PipelineList")),
    },
    "/v1/pipelines/{id}": {
        "get": _op(
            "getPipeline",
            "one pipeline with its steps",
            _ok("Pipeline"),
            params=[_p("id", "pipeline id")],
            errors=AUTH_ERR + ("404",),
        )
    },
    "/v1/pipelines/{id}/cancel": {
        "post": _op(
            "cancelPipeline",
            "cancel a running pipeline: its steps' tasks too (idempotent)",
            _ok("Pipeline"),
            params=[_p("id", "pipeline id")],
            errors=AUTH_ERR + ("404",),
        )
    },
    "/v1/pipelines/{id}/resume": {
        "post": _op(
            "resumePipeline",
            "resume a pipeline paused because its token stopped working: by "
            "its owner only, bound to the caller's token from now on",
            _ok("Pipeline"),
            params=[_p("id", "pipeline id")],
            errors=AUTH_ERR + ("404", "409"),
        )
    },
    "/v1/ledger/focus": {
        "get": _op(
            "ledgerFocus",
            "one billing period (a UTC month) as a FOCUS 1.2 cost and usage "
            "dataset, CSV; usage without a price is refused (`no-price`, naming "
            "the GPU types)",
            {
                "200": {
                    "description": "CSV, streamed",
                    "content": {"text/csv": {"schema": {"type": "string"}}},
                }
            },
            params=[
                {
                    **_q(
                        "period",
                        {"type": "string", "pattern": MONTH_PATTERN},
                        "the month, YYYY-MM",
                    ),
                    "required": True,
                }
            ],
            errors=AUTH_ERR + ("422",),
        )
    },
    "/v1/ledger/statement": {
        "get": _op(
            "ledgerStatement",
            "the chargeback statement of a group's subtree (a team, department "
            "or business unit) for one month: lines by team, project, user, "
            "GPU type and price, to the cent, with the budgets used",
            {
                "200": {
                    "description": "the statement (JSON), or as CSV or a printable HTML page",
                    "content": {
                        "application/json": {"schema": {"type": "object"}},
                        "text/csv": {"schema": {"type": "string"}},
                        "text/html": {"schema": {"type": "string"}},
                    },
                }
            },
            params=[
                {**_q("group", {"type": "string", "minLength": 1}, "the group"), "required": True},
                {
                    **_q(
                        "period",
                        {"type": "string", "pattern": MONTH_PATTERN},
                        "the month, YYYY-MM",
                    ),
                    "required": True,
                },
                _q(
                    "format",
                    {"type": "string", "enum": ["json", "csv", "html"], "default": "json"},
                    "json, csv or html",
                ),
            ],
            errors=AUTH_ERR + ("404", "422"),
        )
    },
    "/v1/ledger/feed": {
        "get": _op(
            "ledgerFeed",
            "the billing feed: closed intervals in the order they closed, after "
            "`cursor`; pass the answer's `cursor` to the next call (no row twice, "
            "none missed, across restarts)",
            {
                "200": {
                    "description": "`{columns, rows, cursor, more}`",
                    "content": {"application/json": {"schema": {"type": "object"}}},
                }
            },
            params=[
                _q(
                    "cursor",
                    {"type": "string", "pattern": "^[0-9]{0,19}$"},
                    "the `cursor` of the previous answer; none: from the start",
                ),
                _q(
                    "limit",
                    {"type": "integer", "minimum": 1, "maximum": 10000, "default": 1000},
                    "at most this many rows",
                ),
            ],
            errors=AUTH_ERR + ("422",),
        )
    },
    "/v1/ledger/cio": {
        "get": _op(
            "ledgerCio",
            "the CIO's figures for a month: use of the estate per pool, GPU-hours and "
            "spend by business unit, idle capacity and who pays for it, cloud "
            "capacity and spend in use now",
            {
                "200": {
                    "description": "`{period, period_start, period_end, estate_use, "
                    "business_units, idle, in_use_now}`",
                    "content": {"application/json": {"schema": {"type": "object"}}},
                }
            },
            params=[
                {
                    **_q(
                        "period",
                        {"type": "string", "pattern": MONTH_PATTERN},
                        "the month, YYYY-MM",
                    ),
                    "required": True,
                }
            ],
            errors=AUTH_ERR + ("422",),
        )
    },
}
PATHS["/v1/tasks/{id}/cancel"]["post"]["requestBody"]["required"] = False  # reason: optional


class Declared(Protocol):
    """What the document needs of a route declaration (``routes.Route``), read-only (a
    ``Route`` is frozen)."""

    @property
    def method(self) -> str: ...

    @property
    def path(self) -> str: ...

    @property
    def operation_id(self) -> str: ...

    @property
    def allowed(self) -> tuple[str, ...]: ...

    @property
    def public(self) -> bool: ...

    @property
    def who(self) -> str: ...


def _paths(routes: Iterable[Declared]) -> dict[str, Any]:
    """``PATHS`` with each operation's "Who" (description, ``x-klique-roles``, and no
    security for a public route) taken from its route declaration."""
    declared = {(r.method.lower(), r.path): r for r in routes}
    out: dict[str, Any] = {}
    for path, ops in PATHS.items():
        out[path] = {}
        for method, op in ops.items():
            r = declared.get((method, path))
            if r is None:
                raise ValueError(f"{method.upper()} {path} has no route declaration")
            if r.operation_id != op["operationId"]:
                raise ValueError(
                    f"{method.upper()} {path}: operation {op['operationId']} "
                    f"is declared as {r.operation_id}"
                )
            who = {"description": f"Who: {r.who}.", "x-klique-roles": list(r.allowed)}
            out[path][method] = {**op, **who, **({"security": []} if r.public else {})}
    return out


def document(
    server_url: str | None = None, routes: Iterable[Declared] | None = None
) -> dict[str, Any]:
    """The document; with ``routes`` (the daemon's route tables), each operation says who
    may call it (without: the schemas and operations only, as request validation needs)."""
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "kliqued",
            "version": "1",
            "description": "Klique control plane API: tasks, queues, policies, pools, "
            "the audit log, the engine switch, tokens and the usage "
            'ledger. Errors are `{"error": {"code", "message"}}`. '
            "GPU amounts are numbers with at most 3 decimals; times are "
            "RFC 3339 UTC.",
        },
        "jsonSchemaDialect": "https://spec.openapis.org/oas/3.1/dialect/base",
        "paths": PATHS if routes is None else _paths(routes),
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "kq_... token"}
            },
        },
        "security": [{"bearer": []}],
    }
    if server_url:
        doc["servers"] = [{"url": server_url}]
    return doc


_SUBMISSION = SCHEMAS["TaskSubmission"]["properties"]
_SUBMISSION_KEYS = frozenset(_SUBMISSION)
_RESOURCE = (_SUBMISSION["resource"]["minLength"], _SUBMISSION["resource"]["maxLength"])
_COMMAND_MAX = _SUBMISSION["command"]["maxItems"]
_NAME_MAX = min(_SUBMISSION["project"]["maxLength"], _SUBMISSION["user"]["maxLength"])
_LABELS_MAX = _SUBMISSION["labels"]["maxProperties"]
_LABEL_KEY = (
    _SUBMISSION["labels"]["propertyNames"]["minLength"],
    _SUBMISSION["labels"]["propertyNames"]["maxLength"],
)
_LABEL_MAX = _SUBMISSION["labels"]["additionalProperties"]["maxLength"]
"""The fast check's bounds, read from the model's schema (``models.requests.TaskSubmission``)
so that a bound changed there is changed here (the names' minimum is 1 in both)."""


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
"""What ``schema_rules.NAME_PATTERN`` refuses in a name."""


def _name(v: Any, hi: int) -> bool:
    return type(v) is str and 1 <= len(v) <= hi and _CONTROL.search(v) is None


def _opt_str(v: Any, hi: int) -> bool:
    return v is None or _name(v, hi)


def submission_surely_valid(body: Any) -> bool:
    """True only for bodies ``TaskSubmission`` surely accepts; False means "ask the schema"
    (which then says why, or accepts after all). The hot path of 1,000 submissions/s: a full
    JSON Schema validation costs ~0.25 ms a request here, this ~5 us. A test checks it never
    accepts what the schema refuses."""
    if type(body) is not dict or not body.keys() <= _SUBMISSION_KEYS:
        return False
    r = body.get("resource")
    if type(r) is not str or not _RESOURCE[0] <= len(r) <= _RESOURCE[1] or _CONTROL.search(r):
        return False
    c = body.get("command")
    if c is not None and (
        type(c) is not list or len(c) > _COMMAND_MAX or any(type(x) is not str for x in c)
    ):
        return False
    if "dry_run" in body and type(body["dry_run"]) is not bool:
        return False
    g = body.get("gpus")
    if g is not None and (type(g) is not int or g < 0):
        return False  # fractions: the schema checks multipleOf
    if not (_opt_str(body.get("project"), _NAME_MAX) and _opt_str(body.get("user"), _NAME_MAX)):
        return False
    if "labels" in body:  # an object, never null
        labels = body["labels"]
        if type(labels) is not dict or len(labels) > _LABELS_MAX:
            return False
        for k, v in labels.items():
            if not _LABEL_KEY[0] <= len(k) <= _LABEL_KEY[1] or type(v) is not str:
                return False
            if len(v) > _LABEL_MAX or _CONTROL.search(k) or _CONTROL.search(v):
                return False
    return True


@lru_cache(maxsize=None)
def validator(schema: str) -> Draft202012Validator:
    """A validator for ``components.schemas[schema]``, references resolved in the document."""
    resource = Resource.from_contents(
        {"$defs": {}, **document()}, default_specification=DRAFT202012
    )
    registry = Registry().with_resource(URN, resource)
    return Draft202012Validator({"$ref": f"{URN}#/components/schemas/{schema}"}, registry=registry)
