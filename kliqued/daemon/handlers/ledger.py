"""The usage ledger for finance and group admins: read-only SQL and CSV export (the SQL
sandbox, the export and a group admin's scope are ``kliqued.ledger``'s; here: who may call
them and on which rows, and running them off the event loop on their own cursor, which sees a
consistent snapshot of committed data)."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from kliqued.ledger import export as ledger_export
from kliqued.ledger import sql as ledger_sql

from ..auth import Principal
from ..core import Daemon
from ..errors import ApiError, bad_request, forbidden
from ..querypool import Busy, Expired
from ..request import ctx, principal, read_json, reply
from ..routes import Route
from .params import str_param, time_param


def _scope(request: web.Request) -> list[str] | None:
    return scope(ctx(request).daemon, principal(request))


def scope(d: Daemon, p: Principal) -> list[str] | None:
    """The groups whose subtrees the caller reads, or None for the whole ledger (finance and
    platform admins). A group admin (of a department, or of a team: a subtree of one) reads
    the rows whose recorded group path passes through a group whose ``admins`` list them;
    a user who administers no group is refused (the object-level rule of ``ROUTES``)."""
    if p.is_finance or p.is_admin:
        return None
    index = d.index
    if p.is_user and index is not None:
        heads = sorted(g.name for g in index.estate.groups if p.name in g.admins)
        if heads:
            return heads
    raise forbidden("the ledger is for finance, admins and group admins (who read their "
                    "groups' subtrees)")


TIMEOUT_S = 10.0
"""A ledger query's time limit, counted from its arrival (a request may ask for less)."""

STATUS = {"timeout": 422, "too-large": 413}
"""HTTP status of a refused or failed query by its code; the others are 400."""


async def sql(request: web.Request) -> web.Response:
    arrived = time.monotonic()
    groups = _scope(request)
    c = ctx(request)
    body = await read_json(request, "LedgerSql")
    limit = body.get("limit", 10000)
    timeout = float(body.get("timeout_s", TIMEOUT_S))
    deadline = arrived + timeout
    try:
        res = await c.store.ledger_queries.run(
            lambda cur: ledger_sql.run_readonly(cur, body["sql"], limit=limit,
                                                timeout_s=timeout, deadline=deadline,
                                                groups=groups),
            deadline)
    except Busy as exc:
        raise ApiError(503, "busy", f"{exc}; try again in a few seconds",
                       {"retry_after_s": 2}) from None
    except Expired:
        err = ledger_sql.timeout_error(timeout, queued=True)
        raise ApiError(STATUS["timeout"], err.code, err.message) from None
    except ledger_sql.LedgerSqlError as exc:
        raise ApiError(STATUS.get(exc.code, 400), exc.code, exc.message) from None
    return reply(res.to_json())


async def export(request: web.Request) -> web.StreamResponse:
    groups = _scope(request)
    c = ctx(request)
    fmt = str_param(request, "format", ("csv",)) or "csv"
    start, end = time_param(request, "from"), time_param(request, "to")
    if end < start:
        raise bad_request("`to` is before `from`")
    loop = asyncio.get_running_loop()
    cur = c.store.conn.cursor()
    try:
        gen = ledger_export.export_csv(cur, start, end, groups=groups)
        first = await loop.run_in_executor(None, next, gen, None)
        resp = web.StreamResponse(headers={
            "Content-Type": "text/csv; charset=utf-8",
            "Content-Disposition": f'attachment; filename="ledger.{fmt}"'})
        await resp.prepare(request)
        chunk = first
        while chunk is not None:
            await resp.write(chunk.encode("utf-8"))
            chunk = await loop.run_in_executor(None, next, gen, None)
        await resp.write_eof()
        return resp
    finally:
        cur.close()


READERS = ("admin", "finance", "user")
SCOPE = "a user: only an admin of some group, reading their groups' subtrees"

ROUTES = [
    Route("POST", "/v1/ledger/sql", sql, "ledgerSql", READERS, rule=SCOPE),
    Route("GET", "/v1/ledger/export", export, "ledgerExport", READERS, rule=SCOPE),
]
