"""What the dashboard sends besides pages: the ledger download (CSV, Parquet), task logs, and
the static files (the page script and style, and plotly.js from the installed package)."""

from __future__ import annotations

import asyncio
import os
import tempfile
from importlib import resources
from pathlib import Path

from aiohttp import web

from klique_util.excerpt import excerpt
from kliqued.daemon.state import history
from kliqued.daemon.errors import ApiError
from kliqued.daemon.api.handlers.ledger import scope as ledger_scope
from kliqued.daemon.logs import MAX_READ
from kliqued.daemon.api.request import ctx
from kliqued.ledger import export as ledger_export

from .frame import HERE, error, signed_or_401
from .pages import period

STATIC = HERE / "static"
PLOTLY_JS = Path(str(resources.files("plotly") / "package_data" / "plotly.min.js"))
"""plotly.js as the installed plotly package ships it: served from there, never copied."""


async def export(request: web.Request) -> web.StreamResponse:
    """The ledger rows of the usage page's period: CSV (the API's export), or Parquet (the
    CLI's conversion of that CSV, made here in a private temporary directory)."""
    try:
        p = signed_or_401(request, "usage")
        c = ctx(request)
        groups = ledger_scope(c.daemon, p)
        start, end, a, b = period(request)
    except ApiError as exc:
        return error(request, exc.status, exc.message)
    fmt = request.query.get("format") or "csv"
    if fmt not in ("csv", "parquet"):
        return error(request, 400, f"format must be csv or parquet, found {excerpt(fmt)}")
    name = f"klique-usage-{start}-{end}.{fmt}"
    loop = asyncio.get_running_loop()
    cur = await c.store.cursor()
    try:
        gen = ledger_export.export_csv(cur, a, b, groups=groups)
        if fmt == "csv":
            resp = web.StreamResponse(
                headers={
                    "Content-Type": "text/csv; charset=utf-8",
                    "Content-Disposition": f'attachment; filename="{name}"',
                }
            )
            await resp.prepare(request)
            while (chunk := await loop.run_in_executor(None, next, gen, None)) is not None:
                await resp.write(chunk.encode("utf-8"))
            await resp.write_eof()
            return resp
        with tempfile.TemporaryDirectory(prefix="klique-export-") as tmp:
            csv_path, pq_path = os.path.join(tmp, "u.csv"), os.path.join(tmp, "u.parquet")

            def write() -> bytes:
                with open(csv_path, "w", encoding="utf-8") as fh:
                    for chunk in gen:
                        fh.write(chunk)
                ledger_export.csv_to_parquet(csv_path, pq_path)
                return Path(pq_path).read_bytes()

            body = await loop.run_in_executor(None, write)
        return web.Response(
            body=body,
            headers={
                "Content-Type": "application/vnd.apache.parquet",
                "Content-Disposition": f'attachment; filename="{name}"',
            },
        )
    finally:
        cur.close()


async def task_log(request: web.Request) -> web.StreamResponse:
    """A task's log (its newest attempt), for who may see the task (``GET
    /v1/tasks/{id}/log``'s rule); another user's task is a 404, as in the API."""
    try:
        p = signed_or_401(request, "my-work")
    except ApiError as exc:
        return error(request, exc.status, exc.message)
    c = ctx(request)
    d = c.daemon
    rec = await history.recall(c.store, d, request.match_info["id"])
    if rec is None or not d.acc().sees_task(p, rec.user, rec.group):
        return error(request, 404, f"no task {request.match_info['id'][:40]}")
    if rec.epoch == 0:
        text = b"(no log: the task has not run)"
    else:
        size = (await c.logs.read(rec.id, rec.epoch, 0, 1))[1]
        start = max(0, size - MAX_READ)
        text, _ = await c.logs.read(rec.id, rec.epoch, start, MAX_READ)
    return web.Response(
        body=text,
        content_type="text/plain",
        charset="utf-8",
        headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"},
    )


STATIC_FILES = {
    "app.js": (STATIC / "app.js", "application/javascript"),
    "app.css": (STATIC / "app.css", "text/css"),
    "plotly.min.js": (PLOTLY_JS, "application/javascript"),
}


async def static(request: web.Request) -> web.StreamResponse:
    entry = STATIC_FILES.get(request.match_info["name"])
    if entry is None:
        raise ApiError(404, "not-found", f"no static file {request.match_info['name'][:40]}")
    path, ctype = entry
    return web.FileResponse(
        path,
        headers={
            "Content-Type": ctype,
            "Cache-Control": "public, max-age=3600",
            "X-Content-Type-Options": "nosniff",
        },
    )
