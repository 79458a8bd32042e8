"""The browser's 404 and 405: an HTML page in the site's frame, not the API's JSON.

The daemon answers an unknown route or a wrong method with the contract's JSON error (its
error middleware), which is right for a client and reads as raw JSON in a browser (issue
32). This middleware, installed outermost by the dashboard, looks at that answer: for a
browser's page request (GET or HEAD asking for ``text/html``, outside the API's paths) it
renders the same message as a page with the site's frame; everything else passes unchanged,
so no API client ever gets HTML.
"""

from __future__ import annotations

import json

from aiohttp import web
from aiohttp.typedefs import Handler

from .frame import error, signed_in

API_PREFIXES = ("/v1", "/mcp", "/.well-known/", "/metrics", "/static/")
"""Paths a program calls: their errors stay the contract's JSON whatever the Accept."""

HTML_ERRORS = (404, 405)


def wants_page(request: web.Request) -> bool:
    """A person's browser asking for a page: GET/HEAD, ``text/html`` accepted, not an API
    path, not a live fragment (the pages' own script reads those)."""
    if request.method not in ("GET", "HEAD") or request.query.get("live"):
        return False
    if request.path.startswith(API_PREFIXES):
        return False
    return "text/html" in request.headers.get("Accept", "")


@web.middleware
async def html_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    resp = await handler(request)
    if resp.status not in HTML_ERRORS or not wants_page(request):
        return resp
    if not isinstance(resp, web.Response) or resp.content_type != "application/json":
        return resp
    try:
        message = json.loads(resp.text or "{}")["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return resp
    if resp.status == 404:
        message = f"There is no page at {request.path}."
    s, p, _ = signed_in(request)
    page = error(request, resp.status, message, s, p)
    if "Allow" in resp.headers:  # RFC 9110: a 405 names what the path serves
        page.headers["Allow"] = resp.headers["Allow"]
    return page
