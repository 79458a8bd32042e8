"""The SDK's request bodies, made by the API's own models (``kliqued/api_models/requests.py``).

The OpenAPI document's request schemas are generated from the same models, so a body the SDK
sends has the document's shape by construction, and an argument the API would refuse for its
shape (a ``gpus`` of 0.0005, an unknown ``app``, a 40-character duration) is refused here,
before any request, as a :class:`KliqueError` (``invalid-request``) that names the argument
and says what it should be, never a pydantic traceback. What needs the estate, the clock or
the caller (a resource the user may use, a cron's grammar, a duration's words) is still the
server's to say.

What the models take is what the SDK takes: pydantic's lax mode, so ``gpus="2"`` is 2.0, as
the API would read it. A body carries the fields the caller gave, not the models' defaults
(the handlers apply theirs), and no ``null`` but where it means something
(``report_scaling``'s ``cause``). A task's ``payload`` is any JSON value: the model checks
nothing in it, and it is sent as given (pydantic's JSON mode would turn a NaN into ``null``;
the API refuses a NaN in its own words).

This module imports pydantic and the models (~0.2 s): the client imports it at the first
call that sends a body, so ``import kliqued.sdk`` (and every ``kliqued`` command that sends
none) stays quick.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Mapping, Sequence

from pydantic import BaseModel, ValidationError

from klique_util.excerpt import clip, excerpt

from kliqued.api_models import requests as m

from .errors import KliqueError

SHOWN = 5
"""Problems a refusal lists (the rest are counted)."""


def task(
    call: str,
    resource: str,
    command: Sequence[str] | str | None,
    payload: Any,
    gpus: float | None,
    project: str | None,
    labels: Mapping[str, str] | None,
    user: str | None,
    dry_run: bool = False,
) -> dict[str, Any]:
    """A ``TaskSubmission``, as ``submit`` and ``dry_run`` send it: a command given as one
    string is split as a shell would; ``user`` only when acting for someone."""
    body = checked(
        call,
        m.TaskSubmission,
        {
            "resource": resource,
            "command": _command(call, command),
            "payload": payload,
            "gpus": gpus,
            "project": project,
            "labels": {} if labels is None else labels,
            "user": user,
            "dry_run": dry_run or None,
        },
    )
    if payload is not None:
        body["payload"] = payload
    if type(gpus) is int:  # valid as given; the daemon's fast check of a submission takes ints
        body["gpus"] = gpus
    return body


def schedule(
    call: str,
    cron: str,
    resource: str | None,
    command: Sequence[str] | str | None,
    pipeline: str | Path | None,
    params: Mapping[str, str] | None,
    timezone: str,
    concurrency: str,
    missed: str,
    deadline: str | None,
    name: str | None,
    project: str | None,
    gpus: float | None,
    labels: Mapping[str, str] | None,
) -> dict[str, Any]:
    """A ``ScheduleCreate``: of a command, or of the pipeline file ``pipeline``."""
    data: dict[str, Any] = {
        "cron": cron,
        "timezone": timezone,
        "name": name,
        "concurrency": concurrency,
        "missed": missed,
        "deadline": deadline,
    }
    names: dict[tuple[str | int, ...], str] = {}
    if pipeline is not None:
        data["pipeline"] = _pipeline_data(pipeline, params, project)
        names = {
            ("pipeline", "text"): f"the pipeline file {pipeline}",
            ("pipeline", "params"): "params",
        }
    else:
        data.update(
            {
                "resource": resource,
                "project": project,
                "gpus": gpus,
                "command": _command(call, command),
                "labels": {} if labels is None else labels,
            }
        )
    return checked(call, m.ScheduleCreate, data, names)


def session(
    call: str,
    resource: str,
    app: str,
    command: Sequence[str] | None,
    project: str | None,
    gpus: float | None,
    idle: Mapping[str, str | int] | None,
) -> dict[str, Any]:
    """A ``SessionStart``; no ``idle`` when no limit is lowered."""
    data = {
        "resource": resource,
        "app": app,
        "command": _command(call, command) or None,
        "project": project,
        "gpus": gpus,
        "idle": idle or None,
    }
    return checked(call, m.SessionStart, data)


def pipeline(
    call: str, path: str | Path, params: Mapping[str, str] | None, project: str | None = None
) -> dict[str, Any]:
    """A ``PipelineRunRequest``: the file's name (for positions in errors), its text, and
    the run's project for the steps that name none."""
    names: dict[tuple[str | int, ...], str] = {("text",): f"the pipeline file {path}"}
    return checked(call, m.PipelineRunRequest, _pipeline_data(path, params, project), names)


def token(
    call: str,
    user: str | None,
    worker: bool,
    pool: str | None,
    role: str | None,
    name: str | None,
    expires_in: str | None,
) -> dict[str, Any]:
    """A ``TokenRequest`` of the one kind asked: a user's, a pool's workers' or a role's."""
    kinds = [
        k
        for k, given in (("user", user is not None), ("worker", worker), ("role", role is not None))
        if given
    ]
    if len(kinds) != 1:
        said = f"{' and '.join(kinds)} were given" if kinds else "none was given"
        raise KliqueError(
            None,
            "invalid-request",
            f"{call}: give exactly one of user, worker=True (with pool) or role; {said}",
            {"arguments": kinds},
        )
    options = {"name": name, "expires_in": expires_in}
    if user is not None:
        return checked(call, m.UserTokenRequest, {"user": user, **options})
    if worker:
        return checked(call, m.WorkerTokenRequest, {"worker": True, "pool": pool, **options})
    return checked(call, m.RoleTokenRequest, {"role": role, **options})


def signin(call: str, id_token: str, role: str | None) -> dict[str, Any]:
    """A ``SignInRequest``: a provider's ID token, and the role to act as, if any."""
    return checked(call, m.SignInRequest, {"id_token": id_token, "role": role})


def rotation(call: str, grace: str | None, expires_in: str | None) -> dict[str, Any]:
    return checked(call, m.TokenRotation, {"grace": grace, "expires_in": expires_in})


def cancel(call: str, reason: str | None) -> dict[str, Any] | None:
    """A ``CancelRequest``, or no body without a reason (as the SDK always sent it)."""
    return checked(call, m.CancelRequest, {"reason": reason}) if reason else None


def engine(call: str, enabled: bool) -> dict[str, Any]:
    return checked(call, m.EngineSwitch, {"enabled": bool(enabled)})


def ledger_sql(call: str, sql: str, limit: int) -> dict[str, Any]:
    return checked(call, m.LedgerSql, {"sql": sql, "limit": limit})


def cloud_node(
    call: str, node: str, provider: str, instance_type: str, lifecycle: str, gpus: int
) -> dict[str, Any]:
    data = {
        "node": node,
        "provider": provider,
        "instance_type": instance_type,
        "lifecycle": lifecycle,
        "gpus": gpus,
    }
    return checked(call, m.CloudNodeStart, data)


def autoscaler_heartbeat(call: str, interval_s: float) -> dict[str, Any]:
    return checked(call, m.AutoscalerHeartbeat, {"interval_s": interval_s})


def scaling(call: str, cause: str | None, reason: str | None, waiting: int) -> dict[str, Any]:
    """A ``ScalingReport``: ``cause`` null says placed work no longer waits for a node."""
    data = {"cause": cause, "reason": reason[:2000] if reason else reason, "waiting": waiting}
    return checked(call, m.ScalingReport, data, nulls=True)


def _command(call: str, command: Sequence[str] | str | None) -> Any:
    """A command as a list: one string split as a shell would (an unclosed quote is the
    caller's error, said as one); anything else is left for the model to judge."""
    if isinstance(command, str):
        try:
            return shlex.split(command)
        except ValueError as exc:
            raise KliqueError(
                None,
                "invalid-request",
                f"{call}: command: {exc} in {excerpt(command)}: close the quote, or give "
                "the command as a list of arguments",
                {"argument": "command"},
            ) from None
    if isinstance(command, (list, tuple)):
        return list(command)
    return command


def _pipeline_data(
    path: str | Path, params: Mapping[str, str] | None, project: str | None = None
) -> dict[str, Any]:
    p = Path(path)
    return {
        "file": p.name,
        "text": p.read_text(encoding="utf-8"),
        "params": {str(k): str(v) for k, v in (params or {}).items()},
        "project": project,
    }


def checked(
    call: str,
    model: type[BaseModel],
    data: dict[str, Any],
    names: Mapping[tuple[str | int, ...], str] | None = None,
    *,
    nulls: bool = False,
) -> dict[str, Any]:
    """``data`` validated by ``model`` and dumped as the JSON the API reads: the fields
    given (``None`` ones left out unless ``nulls``), none of the model's defaults. A value
    the model refuses is a ``KliqueError`` naming the argument (``names`` words a place
    whose field is not an argument of ``call``: a pipeline file's text)."""
    given = data if nulls else {k: v for k, v in data.items() if v is not None}
    try:
        made = model.model_validate(given)
    except ValidationError as exc:
        raise refusal(call, model, given, exc, names or {}) from None
    return made.model_dump(mode="json", exclude_unset=True, exclude_none=not nulls)


def refusal(
    call: str,
    model: type[BaseModel],
    data: Mapping[str, Any],
    exc: ValidationError,
    names: Mapping[tuple[str | int, ...], str],
) -> KliqueError:
    """The model's errors as the SDK's: one line per place (``gpus``, ``labels['run']``,
    ``command[2]``), its problems joined (a union's branches each say theirs), the value
    given (an excerpt)."""
    places: dict[str, list[str]] = {}
    given: dict[str, Any] = {}
    for err in exc.errors(include_url=False):
        place = _place(err["loc"], data, names)
        places.setdefault(place, [])
        if err["msg"] not in places[place]:
            places[place].append(err["msg"])
        if err["type"] != "missing" and place not in given:
            given[place] = err.get("input")
    lines = []
    for place, msgs in places.items():
        value = f" (given {_shown(given[place])})" if place in given else ""
        lines.append(f"{place}: {' or '.join(msgs)}{value}")
    more = len(lines) - SHOWN
    text = "; ".join(lines[:SHOWN]) + (f"; and {more} more" if more > 0 else "")
    return KliqueError(
        None,
        "invalid-request",
        clip(f"{call}: {text} (the API's {model.__name__}: /v1/openapi.json)"),
        {"model": model.__name__, "arguments": list(places)},
    )


def _place(
    loc: tuple[str | int, ...], data: Any, names: Mapping[tuple[str | int, ...], str]
) -> str:
    """Where an error is, written as the caller wrote the value: the argument, then
    ``[key]`` and ``[index]`` into it. A step that is not in the value is a union's branch
    (pydantic names the branch it tried: ``constrained-str``) and is left out, unless the
    error is a missing field, which is named."""
    steps: list[str | int] = []
    value = data
    for i, step in enumerate(loc):
        if step == "[key]":
            steps.append("(a key)")
            break
        if isinstance(value, Mapping) and step in value:
            steps.append(step)
            value = value[step]
        elif isinstance(value, list) and isinstance(step, int) and 0 <= step < len(value):
            steps.append(step)
            value = value[step]
        elif isinstance(value, Mapping) and i == len(loc) - 1 and isinstance(step, str):
            steps.append(step)  # a field missing, or one the model does not know
        else:
            continue
    for n in range(len(steps), 0, -1):
        word = names.get(tuple(steps[:n]))
        if word is not None:
            return word + _tail(steps[n:])
    if not steps:
        return "the body"
    return str(steps[0]) + _tail(steps[1:])


def _tail(steps: Sequence[str | int]) -> str:
    out = ""
    for s in steps:
        out += " (a key)" if s == "(a key)" else f"[{s!r}]"
    return out


def _shown(value: Any) -> str:
    return excerpt(value) if isinstance(value, str) else excerpt(value, quoted=False)
