"""Query-string parameters, checked: a bad value is a 400 that names it."""

from __future__ import annotations

from aiohttp import web

from klique_util.excerpt import excerpt

from kliqued.daemon.errors import bad_request
from kliqued.daemon.units import parse_iso


def int_param(request: web.Request, name: str, default: int | None, lo: int, hi: int) -> int | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
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
    if raw is None or raw == "":
        return None
    if choices is not None and raw not in choices:
        raise bad_request(f"{name} must be one of {', '.join(choices)}, found {excerpt(raw)}")
    return raw


def time_param(request: web.Request, name: str) -> int:
    raw = request.query.get(name)
    if not raw:
        raise bad_request(f"{name} is required (RFC 3339 UTC, e.g. 2026-11-01T00:00:00Z)")
    try:
        return parse_iso(raw)
    except ValueError as exc:
        raise bad_request(f"{name}: {exc}") from None
