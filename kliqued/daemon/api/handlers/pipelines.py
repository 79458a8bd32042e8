"""Pipelines: run a pipeline file, list, show, cancel (docs/channels.md, "Pipelines").

The file's text is sent as it is, so that the daemon's errors point into it
(``file:line:col``); every step is checked for the user before anything is submitted.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from klique_util.excerpt import excerpt

from kliqued.daemon.state import history, pipeline_cache, pipelines
from kliqued.daemon.state.channel_state import PipelineRun
from kliqued.daemon.errors import ApiError
from kliqued.daemon.api.request import ctx, principal, read_json, reply
from kliqued.daemon.api.routes import Route


def _get(request: web.Request) -> pipelines.PipelineRun:
    d = ctx(request).daemon
    pid = request.match_info["id"]
    pr = d.pipelines.items.get(pid)
    if pr is None or not pipelines.visible(d, principal(request), pr):
        raise ApiError(404, "not-found", f"no pipeline {excerpt(pid, quoted=False)}")
    return pr


async def run(request: web.Request) -> web.Response:
    c = ctx(request)
    d = c.daemon
    p = principal(request)
    body = await read_json(request, "PipelineRunRequest")
    spec = {
        "file": body.get("file") or "pipeline.yaml",
        "text": body["text"],
        "params": body.get("params") or {},
        "project": body.get("project"),
    }
    loaded = await pipeline_cache.load_async(spec)  # parsed off the event loop, once
    pipelines.check_access(d, p.name, loaded, spec["file"])  # fail fast
    pid = await c.seq.submit(
        lambda now, ov: pipelines.prepare_start(d, p, spec, now, ov, loaded=loaded)
    )
    return reply(pipelines.view(d, d.pipelines.items[pid]), 201)


async def _view(request: web.Request, pr: PipelineRun) -> dict[str, Any]:
    """The pipeline's view, its steps' evicted tasks read back first."""
    c = ctx(request)
    known = await history.recall_all(c.store, c.daemon, pipelines.step_tasks(pr))
    return pipelines.view(c.daemon, pr, known)


async def list_pipelines(request: web.Request) -> web.Response:
    c = ctx(request)
    d = c.daemon
    p = principal(request)
    shown = [pr for pr in d.pipelines.items.values() if pipelines.visible(d, p, pr)]
    # every listed step's evicted task in one read, not one per pipeline
    known = await history.recall_all(
        c.store, d, (t for pr in shown for t in pipelines.step_tasks(pr))
    )
    return reply({"pipelines": [pipelines.view(d, pr, known) for pr in shown]})


async def get_pipeline(request: web.Request) -> web.Response:
    return reply(await _view(request, _get(request)))


async def cancel(request: web.Request) -> web.Response:
    c = ctx(request)
    d = c.daemon
    p = principal(request)
    pr = _get(request)
    await c.seq.submit(lambda now, ov: pipelines.prepare_cancel(d, p, pr.id, now, ov))
    return reply(await _view(request, pr))


async def resume(request: web.Request) -> web.Response:
    """A pipeline paused because its token ended, resumed by its owner on this request's
    token (binding.py)."""
    c = ctx(request)
    d = c.daemon
    p = principal(request)
    pr = _get(request)
    await c.seq.submit(lambda now, ov: pipelines.prepare_resume(d, p, pr.id, now, ov))
    return reply(await _view(request, pr))


SEE = "a user: their own pipelines and those of users in groups they administer"

ROUTES = [
    Route(
        "POST",
        "/v1/pipelines",
        run,
        "runPipeline",
        ("user",),
        rule="a user: every step to their groups' compute resources",
        hint="use a user's token: a pipeline runs as the user who starts it",
    ),
    Route("GET", "/v1/pipelines", list_pipelines, "listPipelines", ("admin", "user"), rule=SEE),
    Route("GET", "/v1/pipelines/{id}", get_pipeline, "getPipeline", ("admin", "user"), rule=SEE),
    Route(
        "POST", "/v1/pipelines/{id}/cancel", cancel, "cancelPipeline", ("admin", "user"), rule=SEE
    ),
    Route(
        "POST",
        "/v1/pipelines/{id}/resume",
        resume,
        "resumePipeline",
        ("admin", "user"),
        rule=SEE + "; only its owner resumes a paused one (on their own token)",
    ),
]
