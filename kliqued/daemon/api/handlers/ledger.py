"""The usage ledger for finance and group admins: read-only SQL and CSV export (the SQL
sandbox, the export and a group admin's scope are ``kliqued.ledger``'s; here: who may call
them and on which rows, and running them off the event loop on their own cursor, which sees a
consistent snapshot of committed data)."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from klique_util.excerpt import excerpt
from kliqued.ledger import cio as ledger_cio
from kliqued.ledger import export as ledger_export
from kliqued.ledger import feed as ledger_feed
from kliqued.ledger import focus as ledger_focus
from kliqued.ledger import render as ledger_render
from kliqued.ledger import statement as ledger_statement
from kliqued.ledger import writer as ledger_writer
from kliqued.ledger import sql as ledger_sql

from kliqued.daemon.auth import Principal
from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.errors import ApiError, bad_request, forbidden
from kliqued.daemon.storage.querypool import Busy, Expired, QueryPool
from kliqued.daemon.api.request import ctx, principal, read_json, reply
from kliqued.daemon.api.routes import Route
from kliqued.daemon.api.handlers.params import str_param, time_param


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
    raise forbidden(
        "the ledger is for finance, admins and group admins (who read their groups' subtrees)"
    )


def _pool(c, groups: list[str] | None) -> tuple[QueryPool, bool]:
    """Where a ledger read runs, and whether that is PostgreSQL: the whole ledger there (as
    the read-only role, on the replica if any) with ``--db postgresql://``; a group admin's
    subtree, and everything on DuckDB, on the DuckDB file (its copy with PostgreSQL)."""
    if groups is None and c.store.finance_queries is not None:
        return c.store.finance_queries, True
    return c.store.ledger_queries, False


TIMEOUT_S = 10.0
"""A ledger query's time limit, counted from its arrival (a request may ask for less)."""

STATUS = {"timeout": 422, "too-large": 413, "unavailable": 503}
"""HTTP status of a refused or failed query by its code; the others are 400."""


async def sql(request: web.Request) -> web.Response:
    arrived = time.monotonic()
    groups = _scope(request)
    c = ctx(request)
    body = await read_json(request, "LedgerSql")
    limit = body.get("limit", 10000)
    timeout = float(body.get("timeout_s", TIMEOUT_S))
    deadline = arrived + timeout
    pool, pg = _pool(c, groups)
    run = lambda cur: ledger_sql.run_readonly(
        cur, body["sql"], limit=limit, timeout_s=timeout, deadline=deadline, groups=groups
    )
    if pg:  # PostgreSQL's privileges, not DuckDB's sandbox (docs/ha.md)
        from kliqued.ledger import pgsql

        run = lambda conn: pgsql.run_readonly(
            conn, body["sql"], limit=limit, timeout_s=timeout, deadline=deadline
        )
    try:
        res = await pool.run(run, deadline)
    except Busy as exc:
        raise ApiError(
            503, "busy", f"{exc}; try again in a few seconds", {"retry_after_s": 2}
        ) from None
    except Expired:
        err = ledger_sql.timeout_error(timeout, queued=True)
        raise ApiError(STATUS["timeout"], err.code, err.message) from None
    except ledger_sql.LedgerSqlError as exc:
        raise ApiError(STATUS.get(exc.code, 400), exc.code, exc.message) from None
    return reply(res.to_json())


async def export(request: web.Request) -> web.StreamResponse:
    groups = _scope(request)
    fmt = str_param(request, "format", ("csv",)) or "csv"
    start, end = time_param(request, "from"), time_param(request, "to")
    if end < start:
        raise bad_request("`to` is before `from`")
    pg = _pool(ctx(request), groups)[1]
    return await _stream_csv(
        request,
        lambda cur: ledger_export.export_csv(cur, start, end, groups=groups, pg=pg),
        f"ledger.{fmt}",
        pg=pg,
    )


def _borrowed(request: web.Request) -> str:
    """``settings.attribution.borrowed`` of the estate in force (``borrower`` without one)."""
    index = ctx(request).daemon.index
    attribution = index.estate.settings.attribution if index is not None else None
    return attribution.borrowed if attribution is not None else "borrower"


async def focus(request: web.Request) -> web.StreamResponse:
    """One billing period (a UTC month) as a FOCUS 1.2 dataset, CSV (kliqued.ledger.focus).
    Usage without a price is refused before any row, naming the GPU types."""
    groups = _scope(request)
    raw = str_param(request, "period")
    if raw is None:
        raise bad_request("period is required: the month to export, YYYY-MM (2026-11)")
    try:
        period = ledger_focus.parse_period(raw)
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    borrowed = _borrowed(request)
    # PostgreSQL's ledger when it has all the rows asked for (the split's lending rows are
    # derived on DuckDB only for now: docs/ha.md)
    pg = _pool(ctx(request), groups)[1] and borrowed != "split"
    try:
        return await _stream_csv(
            request,
            lambda cur: ledger_focus.focus_csv(
                cur, period, groups=groups, borrowed=borrowed, pg=pg
            ),
            f"focus-{period:%Y-%m}.csv",
            pg=pg,
        )
    except ledger_focus.NoPrice as exc:
        raise ApiError(422, "no-price", str(exc), {"gpu_types": exc.gpu_types}) from None


STATEMENT_FORMATS = ("json", "csv", "html")


async def statement(request: web.Request) -> web.Response:
    """The chargeback statement of a group's subtree for one month (kliqued.ledger.statement),
    as JSON, CSV or a printable HTML page. A group admin may ask for a group in their
    subtrees only."""
    arrived = time.monotonic()
    groups = _scope(request)
    c = ctx(request)
    group = str_param(request, "group")
    raw = str_param(request, "period")
    fmt = str_param(request, "format", STATEMENT_FORMATS) or "json"
    if not group:
        raise bad_request("group is required: a team, department or business unit")
    if raw is None:
        raise bad_request("period is required: the month, YYYY-MM (2026-11)")
    try:
        period = ledger_focus.parse_period(raw)
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    index = c.daemon.index
    estate = index.estate if index is not None else None
    paths = ledger_writer.group_paths(estate) if estate is not None else {}
    if groups is not None and group in paths and not set(paths[group].split("/")) & set(groups):
        raise forbidden(
            f"the statement of {group} is outside the groups you administer ({', '.join(groups)})"
        )

    borrowed = _borrowed(request)
    # the statement reads the local file's ledger (with PostgreSQL, its copy): its lines
    # derive borrowing and lending, not yet written for PostgreSQL (docs/ha.md)
    pool = c.store.ledger_queries

    def run(cur):
        cur.execute("BEGIN TRANSACTION READ ONLY")  # one snapshot for every query of it
        try:
            attribution = estate.settings.attribution if estate else None
            return ledger_statement.build(
                cur,
                group,
                period,
                paths,
                estate.settings.currency if estate else "EUR",
                estate.policies if estate else (),
                visible=groups,
                reserved_idle=attribution is not None and attribution.reserved_idle == "group",
                borrowed=borrowed,
                lost_work=attribution.lost_work if attribution is not None else "owner",
            ).to_json()
        finally:
            cur.execute("ROLLBACK")

    try:
        body = await pool.run(run, arrived + TIMEOUT_S)
    except ledger_statement.UnknownGroup as exc:
        raise ApiError(404, "not-found", str(exc)) from None
    except ledger_sql.LedgerSqlError as exc:  # PostgreSQL's reader cannot be reached
        raise ApiError(STATUS.get(exc.code, 400), exc.code, exc.message) from None
    except Busy as exc:
        raise ApiError(
            503, "busy", f"{exc}; try again in a few seconds", {"retry_after_s": 2}
        ) from None
    except Expired:
        raise ApiError(422, "timeout", "the statement did not finish in time") from None
    if fmt == "csv":
        return web.Response(
            text=ledger_render.statement_csv(body), content_type="text/csv", charset="utf-8"
        )
    if fmt == "html":
        return web.Response(
            text=ledger_render.statement_html(body), content_type="text/html", charset="utf-8"
        )
    return reply(body)


async def feed(request: web.Request) -> web.Response:
    """The billing feed (kliqued.ledger.feed): closed intervals after ``cursor``, in the
    order they closed."""
    arrived = time.monotonic()
    groups = _scope(request)
    c = ctx(request)
    try:
        after = ledger_feed.parse_cursor(request.query.get("cursor"))
    except ledger_feed.BadCursor as exc:
        raise bad_request(str(exc)) from None
    raw = request.query.get("limit", "1000")
    if not raw.isdigit() or not 1 <= int(raw) <= ledger_feed.MAX_LIMIT:
        raise bad_request(
            f"limit must be a whole number from 1 to {ledger_feed.MAX_LIMIT}, found {excerpt(raw)}"
        )
    pool, pg = _pool(c, groups)
    try:
        body = await pool.run(
            lambda cur: ledger_feed.pull(cur, after, int(raw), groups, pg=pg), arrived + TIMEOUT_S
        )
    except Busy as exc:
        raise ApiError(
            503, "busy", f"{exc}; try again in a few seconds", {"retry_after_s": 2}
        ) from None
    except Expired:
        raise ApiError(422, "timeout", "the feed did not answer in time") from None
    except ledger_sql.LedgerSqlError as exc:  # PostgreSQL's reader cannot be reached
        raise ApiError(STATUS.get(exc.code, 400), exc.code, exc.message) from None
    return reply(body)


async def cio(request: web.Request) -> web.Response:
    """The CIO's figures for a month (kliqued.ledger.cio): use of the estate, spend by
    business unit, idle capacity and who pays, cloud in use now."""
    arrived = time.monotonic()
    groups = _scope(request)
    c = ctx(request)
    raw = str_param(request, "period")
    if raw is None:
        raise bad_request("period is required: the month, YYYY-MM (2026-11)")
    try:
        period = ledger_focus.parse_period(raw)
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    try:  # on the local file's ledger: the figures derive lending (docs/ha.md)
        body = await c.store.ledger_queries.run(
            lambda cur: ledger_cio.figures(cur, period, groups), arrived + TIMEOUT_S
        )
    except Busy as exc:
        raise ApiError(
            503, "busy", f"{exc}; try again in a few seconds", {"retry_after_s": 2}
        ) from None
    except Expired:
        raise ApiError(422, "timeout", "the figures did not finish in time") from None
    except ledger_sql.LedgerSqlError as exc:
        raise ApiError(STATUS.get(exc.code, 400), exc.code, exc.message) from None
    return reply(body)


async def _stream_csv(
    request: web.Request, make, filename: str, pg: bool = False
) -> web.StreamResponse:
    """Streams the CSV chunks of ``make(cursor)`` (a generator, run off the event loop on a
    cursor of its own); an error raised before the first chunk propagates before any byte
    is sent, so it becomes an ordinary error answer. ``pg``: ``make`` gets a connection of
    its own to PostgreSQL's ledger instead, as finance's read-only role (on the replica if
    any)."""
    loop = asyncio.get_running_loop()
    store = ctx(request).store
    conn = None
    if pg and store.finance_queries is not None:
        readers = store.finance_queries.handles
        try:
            conn = cur = await loop.run_in_executor(None, getattr(readers, "stream"))
        except ledger_sql.LedgerSqlError as exc:
            raise ApiError(STATUS.get(exc.code, 400), exc.code, exc.message) from None
    else:
        cur = await store.cursor()
    try:
        gen = make(cur)
        first = await loop.run_in_executor(None, next, gen, None)
        resp = web.StreamResponse(
            headers={
                "Content-Type": "text/csv; charset=utf-8",
                "Content-Disposition": f'attachment; filename="{filename}"',
            }
        )
        await resp.prepare(request)
        chunk = first
        while chunk is not None:
            await resp.write(chunk.encode("utf-8"))
            chunk = await loop.run_in_executor(None, next, gen, None)
        await resp.write_eof()
        return resp
    finally:
        if conn is not None:  # its cursor and read-only transaction end with it
            await loop.run_in_executor(None, conn.close)
        else:
            cur.close()


READERS = ("admin", "finance", "user")
SCOPE = "a user: only an admin of some group, reading their groups' subtrees"

ROUTES = [
    Route("POST", "/v1/ledger/sql", sql, "ledgerSql", READERS, rule=SCOPE),
    Route("GET", "/v1/ledger/export", export, "ledgerExport", READERS, rule=SCOPE),
    Route("GET", "/v1/ledger/focus", focus, "ledgerFocus", READERS, rule=SCOPE),
    Route("GET", "/v1/ledger/statement", statement, "ledgerStatement", READERS, rule=SCOPE),
    Route("GET", "/v1/ledger/feed", feed, "ledgerFeed", READERS, rule=SCOPE),
    Route("GET", "/v1/ledger/cio", cio, "ledgerCio", READERS, rule=SCOPE),
]
