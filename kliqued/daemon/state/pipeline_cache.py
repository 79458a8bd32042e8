"""Pipeline files parsed once: the parsed form of each file text the daemon holds, shared.

Parsing a pipeline (``kliqued.schedule.pipeline.parse``) is the costly part of running one;
its parameters are bound per run (``bind``, cheap). A schedule keeps its file's parsed form
from its creation, a run keeps its own (``PipelineRun.loaded.parsed``), and a file met again
(the reducer after the handler, each run of a schedule, a replay of many runs of one file)
is found here by its content while anything still holds it: a weak map, so it holds no
memory of its own. The handlers parse in a thread (:func:`parse_async`), so a large or
hostile file never stalls the event loop; the reducers then find it here.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import weakref
from typing import Any

from kliqued.schedule import pipeline as P

from kliqued.daemon.errors import ApiError

_held: "weakref.WeakValueDictionary[str, P.Parsed]" = weakref.WeakValueDictionary()
_lock = threading.Lock()
parses = 0
"""Files actually parsed in this process (a file found here is not counted): the tests'
evidence that a schedule's runs and a replay do not parse again (:func:`count`)."""


def count() -> int:
    return parses


def _key(file: str, text: str) -> str:
    h = hashlib.sha256(file.encode("utf-8", "surrogatepass"))
    h.update(b"\0")
    h.update(text.encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def parse(file: str, text: str) -> P.Parsed:
    """The parsed form of ``text``, parsed only if nothing holds it yet; a
    ``PipelineError`` as ``pipeline.parse`` raises it."""
    global parses
    key = _key(file, text)
    with _lock:
        found = _held.get(key)
    if found is not None:
        return found
    parsed = P.parse(file, text)
    with _lock:
        parses += 1
        return _held.setdefault(key, parsed)


def api_error(exc: P.PipelineError) -> ApiError:
    """A 422 listing the (capped) problems."""
    return ApiError(422, "invalid-pipeline", "; ".join(exc.errors), {"errors": exc.errors})


def load(spec: dict[str, Any]) -> P.Loaded:
    """A stored pipeline (``{file, text, params, project}``) bound to its parameters and
    project; a 422 naming each problem."""
    try:
        parsed = parse(spec.get("file") or "pipeline.yaml", spec.get("text") or "")
        return P.bind(parsed, spec.get("params") or {}, spec.get("project"))
    except P.PipelineError as exc:
        raise api_error(exc) from None


async def load_async(spec: dict[str, Any]) -> P.Loaded:
    """:func:`load` in a thread: a request's file is parsed off the event loop."""
    return await asyncio.to_thread(load, spec)
