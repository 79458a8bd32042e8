"""A submission once checked: the one record every channel makes and the state keeps.

``from_body`` turns a request's body (its shape already checked against ``TaskSubmission``)
into a :class:`Submission`, running every check of a submission in one place: a command or
a payload, their sizes, the reserved channel label, on whose behalf, the idempotency key, the
size in GPUs, and the estate's ``check_submission``. The API, MCP and sessions make one at
their edge; the unattended channels (schedules, pipelines) make theirs from what their owner
stored. What crosses from the API to the state is this record, never the body: the
``submitted`` event's payload is built from it (:meth:`Submission.event`), and the state
reads that typed payload back into the task's record (issue 27, item 2).

A channel that checks before it submits (a schedule when it is made, a pipeline's steps when
the run starts) asks :func:`refusal` or :func:`check`, the same call ``from_body`` makes, so
no channel has a copy of the rule. It lives in ``state/`` because both the API (above) and
the state's own unattended channels and the sequencer's re-check (here) use it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from kliqued.engine import EstateIndex, SubmissionError, check_submission

from kliqued.daemon import events, limits
from kliqued.daemon.auth import Principal
from kliqued.daemon.errors import ApiError, bad_request, forbidden
from kliqued.daemon.state.channels import CHANNELS, Channel
from kliqued.daemon.units import to_milli

RESERVED_LABEL = "klique.channel"
"""The label the control plane sets (channels.py): never taken from a body."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Submission:
    """A task as submitted and checked: what the ``submitted`` event records.

    ``data_bytes`` (the command's and payload's bytes, counted against the user's quota) is
    derived, so the record and its count cannot disagree."""

    resource: str
    user: str
    project: str | None = None
    gpus_milli: int | None = None
    command: list[str] | None = None
    payload: Any = None
    labels: Mapping[str, str] = field(default_factory=dict)
    channel: Channel = "api"
    idempotency_key: str | None = None
    data_bytes: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_bytes", limits.task_bytes(self.command, self.payload))

    def event(self) -> events.Submitted:
        """The ``submitted`` event's typed payload."""
        return events.Submitted(
            resource=self.resource,
            user=self.user,
            project=self.project,
            gpus_milli=self.gpus_milli,
            command=self.command,
            payload=self.payload,
            labels=dict(self.labels),
            idempotency_key=self.idempotency_key,
            channel=self.channel,
        )


def submittable(idx: EstateIndex, user: str) -> list[str]:
    """The compute resources ``user`` may send work to: those of the groups listing them in
    ``users``."""
    return sorted(n for n, cr in idx.resources.items() if user in idx.users.get(cr.group, ()))


def refusal(
    idx: EstateIndex, resource: str, user: str, project: str | None, gpus_milli: int | None
) -> SubmissionError | None:
    """Why the estate refuses this submission, or None: the daemon's one call of the
    engine's rule, with a project required (the ledger records use against it)."""
    try:
        check_submission(idx, resource, user, project, gpus_milli, require_project=True)
    except SubmissionError as exc:
        return exc
    return None


def with_options(idx: EstateIndex, user: str, resource: str, exc: SubmissionError) -> str:
    """A refusal's text; a resource the user may not send to names the ones they may
    (issue 10)."""
    cr = idx.resources.get(resource)
    if cr is not None and user in idx.users.get(cr.group, ()):
        return str(exc)
    mine = submittable(idx, user)
    return f"{exc}; {user} may submit to " + (", ".join(mine) if mine else "nothing")


def check(
    idx: EstateIndex, resource: str, user: str, project: str | None, gpus_milli: int | None
) -> None:
    """A 422 ``submission-refused`` naming the field at fault (and, for a resource not
    theirs, what the user may use) when the estate refuses the submission."""
    exc = refusal(idx, resource, user, project, gpus_milli)
    if exc is not None:
        raise ApiError(
            422,
            "submission-refused",
            with_options(idx, user, resource, exc),
            {"field": exc.field},
        )


def gpus_of(body: Mapping[str, Any]) -> int | None:
    """The body's ``gpus`` as milli-GPUs (None: the profile's size); a 400 saying why not."""
    try:
        return None if body.get("gpus") is None else to_milli(body["gpus"])
    except ValueError as exc:
        raise bad_request(str(exc)) from None


def from_body(
    idx: EstateIndex,
    p: Principal,
    body: Mapping[str, Any],
    channel: Channel,
    key: str | None = None,
    *,
    retry: bool = False,
) -> Submission:
    """The checked submission of ``body`` (a valid ``TaskSubmission``) by ``p`` through
    ``channel``; an ``ApiError`` with nothing submitted: 400 a wrong field, 403 on someone
    else's behalf, 413 too large, 422 refused by the estate.

    ``retry``: ``key`` names a task the daemon already holds, whose answer is that task
    whatever the estate says now; the estate is not asked then (the sequencer answers by the
    key). Every other check runs, so a wrong body is refused even on a retry."""
    if channel not in CHANNELS:
        raise ValueError(f"unknown channel {channel!r}")  # a bug in the caller, not input
    command = body.get("command")
    payload = body.get("payload")
    if not command and payload is None:
        raise ApiError(
            422,
            "invalid-task",
            "a task needs `command` (a non-empty list of "
            "arguments) or `payload` (data for its channel); both are missing",
            {"fields": ["command", "payload"]},
        )
    _sized(command, payload)
    labels = body.get("labels") or {}
    if RESERVED_LABEL in labels:
        raise ApiError(
            422,
            "invalid-field",
            "labels.klique.channel: the control plane sets "
            "a task's channel (a session is started with POST /v1/sessions)",
            {"field": "labels.klique.channel"},
        )
    user = body.get("user")
    if p.is_admin:
        if not user:  # who calls decides it, which no schema can say: 422 (issue 32)
            raise ApiError(
                422,
                "invalid-field",
                "user: an admin sends work only on behalf of a user: give `user`",
                {"field": "user"},
            )
    elif user is None:
        user = p.name
    elif user != p.name:
        raise forbidden("only an admin may send work on behalf of another user")
    if key is not None and not 1 <= len(key) <= 256:
        raise bad_request("Idempotency-Key must be 1 to 256 characters")
    gpus = gpus_of(body)
    resource = body["resource"]
    project = body.get("project")
    if not retry:  # fail fast; the sequencer checks again against the estate of the commit
        check(idx, resource, user, project, gpus)
    return Submission(
        resource=resource,
        user=user,
        project=project,
        gpus_milli=gpus,
        command=command,
        payload=payload,
        labels=labels,
        channel=channel,
        idempotency_key=key,
    )


def _sized(command: list[str] | None, payload: Any) -> int:
    """The task's data bytes; a command or payload over its cap is a 413 naming it."""
    cmd = limits.command_bytes(command)
    if cmd > limits.MAX_COMMAND_BYTES:
        raise ApiError(
            413,
            "too-large",
            f"/command: {limits.mib(cmd)}; a task's command may "
            f"hold {limits.mib(limits.MAX_COMMAND_BYTES)} at most (put data in a "
            f"file the task reads)",
            {"pointer": "/command", "bytes": cmd, "limit_bytes": limits.MAX_COMMAND_BYTES},
        )
    pay = limits.payload_bytes(payload)
    if pay > limits.MAX_PAYLOAD_BYTES:
        raise ApiError(
            413,
            "too-large",
            f"/payload: {limits.mib(pay)}; a task's payload may "
            f"hold {limits.mib(limits.MAX_PAYLOAD_BYTES)} at most (send a "
            f"reference to the data instead)",
            {"pointer": "/payload", "bytes": pay, "limit_bytes": limits.MAX_PAYLOAD_BYTES},
        )
    return cmd + pay
