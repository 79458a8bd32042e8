"""What the dashboard sends besides pages: the ledger download (CSV, Parquet) and
the static files (the page script and style, and plotly.js from the installed package)."""

from __future__ import annotations

import asyncio
import os
import tempfile
from importlib import resources
from pathlib import Path

from aiohttp import web

from klique_util.excerpt import excerpt
from kliqued.daemon.errors import ApiError
from kliqued.daemon.api.handlers.ledger import scope as ledger_scope
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


STATIC_FILES = {
    "app.js": (STATIC / "app.js", "application/javascript"),
    "app.css": (STATIC / "app.css", "text/css"),
    "log.js": (STATIC / "log.js", "application/javascript"),
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
