"""Query-string parameters, checked: a bad value is a 400 that names it."""

from __future__ import annotations

import re

from aiohttp import web

from klique_util.excerpt import excerpt

from kliqued.daemon.errors import ApiError, bad_request
from kliqued.daemon.api.schema_rules import UTC_TIME_PATTERN
from kliqued.daemon.units import parse_iso


def int_param(request: web.Request, name: str, default: int | None, lo: int, hi: int) -> int | None:
    """An integer parameter; given empty (``?limit=``) it is no integer, as the document
    says (issue 32: an empty value was taken as absent)."""
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        v = int(raw)
    except ValueError:
        raise bad_request(f"{name} must be an integer, found {excerpt(raw)}") from None
    if not lo <= v <= hi:
        raise bad_request(f"{name} must be between {lo} and {hi}, found {v}")
    return v


def str_param(
    request: web.Request, name: str, choices: tuple[str, ...] | None = None
) -> str | None:
    raw = request.query.get(name)
    if raw is None or (raw == "" and choices is None):
        return None
    if choices is not None and raw not in choices:
        raise bad_request(f"{name} must be one of {', '.join(choices)}, found {excerpt(raw)}")
    return raw


_UTC_TIME = re.compile(UTC_TIME_PATTERN)


def time_param(request: web.Request, name: str) -> int:
    """A required UTC time: a 400 for another form, a 422 for one the calendar refuses (a
    30 February: the form is the document's, the calendar is not)."""
    raw = request.query.get(name)
    if not raw:
        raise bad_request(f"{name} is required (RFC 3339 UTC, e.g. 2026-11-01T00:00:00Z)")
    if not _UTC_TIME.match(raw):
        raise bad_request(
            f"{name}: expected an RFC 3339 UTC time such as 2026-11-01T00:00:00Z, "
            f"found {excerpt(raw)}"
        )
    try:
        return parse_iso(raw)
    except ValueError as exc:
        raise ApiError(422, "invalid-field", f"{name}: {exc}", {"field": name}) from None
