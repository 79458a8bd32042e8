"""A task's log: a page in the site's frame that follows the log as it grows, and the raw
text at its own URL for tools (``curl``, ``less``, a script).

Issue 32: the log was a bare ``text/plain`` page, with no way back to the dashboard and no
new lines without a reload. The page shows the newest attempt's log (its last
:data:`kliqued.daemon.logs.MAX_READ` bytes), HTML-escaped by the template, and ``log.js``
asks the raw URL for the bytes after the ones it has (``?offset=N&epoch=E``) at the engine's
pass rate while the task may still write: the text is appended as a text node, never as
markup. Who may read a log is ``GET /v1/tasks/{id}/log``'s rule (who may see the task);
another user's task is a 404, as in the API.
"""

from __future__ import annotations

from aiohttp import web

from kliqued.daemon.api import views
from kliqued.daemon.auth import Principal
from kliqued.daemon.api.request import ctx
from kliqued.daemon.errors import ApiError
from kliqued.daemon.logs import MAX_READ
from kliqued.daemon.records import TaskRecord
from kliqued.daemon.state import history
from kliqued.daemon.units import iso

from . import data
from .frame import chrome, error, html, signed_in, signed_or_401, to_signin

RAW_HEADERS = {"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"}


def utf8_end(chunk: bytes) -> int:
    """How much of ``chunk`` ends on a whole UTF-8 character: a read cut in the middle of a
    character keeps its first bytes for the next read, so the browser never shows U+FFFD
    where the log has an ``é``."""
    for back in range(1, min(4, len(chunk)) + 1):
        b = chunk[-back]
        if b & 0xC0 == 0x80:  # a continuation byte: look further back for its lead
            continue
        need = 1 if b < 0x80 else 2 if b >> 5 == 0b110 else 3 if b >> 4 == 0b1110 else 4
        return len(chunk) if need <= back else len(chunk) - back
    return len(chunk)


def utf8_start(chunk: bytes) -> int:
    """Where the first whole character of ``chunk`` starts (a tail read from the middle of
    the log may begin inside one)."""
    i = 0
    while i < min(3, len(chunk)) and chunk[i] & 0xC0 == 0x80:
        i += 1
    return i


async def _visible(request: web.Request, p: Principal) -> TaskRecord:
    c = ctx(request)
    d = c.daemon
    tid = request.match_info["id"]
    rec = await history.recall(c.store, d, tid)
    if rec is None or not d.acc().sees_task(p, rec.user, rec.group):
        raise ApiError(404, "not-found", f"no task {tid[:40]}")
    return rec


async def tail(request: web.Request, rec: TaskRecord, offset: int | None) -> tuple[bytes, int]:
    """The log's bytes from ``offset`` (None: its last ``MAX_READ`` bytes), cut at whole
    characters, and the offset after them."""
    logs = ctx(request).logs
    if offset is None:
        size = (await logs.read(rec.id, rec.epoch, 0, 1))[1]
        offset = max(0, size - MAX_READ)
        text, _ = await logs.read(rec.id, rec.epoch, offset, MAX_READ)
        skip = utf8_start(text) if offset else 0
        text, offset = text[skip:], offset + skip
    else:
        text, _ = await logs.read(rec.id, rec.epoch, offset, MAX_READ)
    text = text[: utf8_end(text)]
    return text, offset + len(text)


def _offset(request: web.Request) -> int | None:
    raw = request.query.get("offset")
    if raw is None:
        return None
    if not raw.isdigit() or len(raw) > 15:
        raise ApiError(400, "invalid-request", f"offset must be a byte count, found {raw[:20]}")
    return int(raw)


async def raw(request: web.Request) -> web.StreamResponse:
    """The log as text (``/my-work/{id}/log.txt``): its last ``MAX_READ`` bytes, or with
    ``?offset=N`` the bytes after the first N of attempt ``epoch`` (another attempt started
    since: the new attempt's from its start). Headers say where the next read starts
    (``X-Klique-Log-Next``), the attempt (``X-Klique-Log-Epoch``) and the task's state
    (``X-Klique-Task-State``): the page stops asking once the task ended and nothing is
    left."""
    try:
        p = signed_or_401(request, "my-work")
        rec = await _visible(request, p)
        offset = _offset(request)
    except ApiError as exc:  # a tool reads this: the message as text, not a page
        return web.Response(
            text=exc.message + "\n",
            status=exc.status,
            content_type="text/plain",
            headers=RAW_HEADERS,
        )
    if request.query.get("epoch") not in (None, str(rec.epoch)):
        offset = 0  # the log the browser follows is an older attempt's: the new one
    if rec.epoch == 0:
        body, nxt = (b"" if offset is not None else b"(no log: the task has not run)"), 0
    else:
        body, nxt = await tail(request, rec, offset)
    headers = {
        **RAW_HEADERS,
        "X-Klique-Log-Next": str(nxt),
        "X-Klique-Log-Epoch": str(rec.epoch),
        "X-Klique-Task-State": views.state(rec),
    }
    return web.Response(body=body, content_type="text/plain", charset="utf-8", headers=headers)


async def page(request: web.Request) -> web.StreamResponse:
    """The log in the site's frame (``/my-work/{id}/log``), followed live by ``log.js``."""
    s, p, why = signed_in(request)
    if s is None or p is None:
        return to_signin(request, why)
    d = ctx(request).daemon
    my_work = data.BY_SLUG["my-work"]
    if not data.may_open(d, p, my_work):
        return error(request, 403, f"{p.text} may not read task logs", s, p)
    try:
        rec = await _visible(request, p)
    except ApiError as exc:
        return error(request, exc.status, exc.message, s, p)
    text, nxt = (b"", 0) if rec.epoch == 0 else await tail(request, rec, None)
    return html(
        request,
        "task-log.html",
        task=views.task(d, rec),
        log=text.decode("utf-8", "replace"),
        cut=nxt > len(text),
        next=nxt,
        epoch=rec.epoch,
        done=rec.state == "ended",
        max_mib=MAX_READ // (1024 * 1024),
        now=iso(d.clock.now()),
        **chrome(request, p, s, my_work),
    )
