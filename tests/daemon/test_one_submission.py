"""One submission from the edge to the ledger (issue 27, item 2), in process.

``state.submission.from_body`` is the one check of a submission: each refusal it makes, and
what it lets through as a typed ``Submission``. That record is the ``submitted`` event's
payload, the task's record is read from the typed payload, and the ledger's ``IntervalRow``
from the record. And every channel (``POST /v1/tasks``, MCP, sessions, schedules, pipelines)
refuses the same bad submission with the same error: they all ask the same function."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from mcp import Client

from compiler.api import compile_dir
from kliqued.daemon import events as E
from kliqued.daemon.api.agents import tools
from kliqued.daemon.api.app import make_app
from kliqued.daemon.api.metrics import Metrics
from kliqued.daemon.api.request import Context
from kliqued.daemon.auth import Principal
from kliqued.daemon.errors import ApiError
from kliqued.daemon.logs import LogStore
from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.state.loop import Sequencer
from kliqued.daemon.state.prepared import Overlay
from kliqued.daemon.state.submission import Submission, from_body
from kliqued.daemon.storage import keyfile
from kliqued.daemon.storage.store import Store
from kliqued.engine import EstateIndex
from kliqued.ledger import ops as ledger_ops

from tests.harness.daemon import SMALL_ESTATE

BOB = Principal("user", "bob")
ADMIN = Principal("role", "admin")


def _index() -> EstateIndex:
    estate = compile_dir(SMALL_ESTATE).estate
    assert estate is not None
    return EstateIndex.build(estate)


def _refused(idx: EstateIndex, p: Principal, body: dict[str, Any], **kw: Any) -> ApiError:
    with pytest.raises(ApiError) as err:
        from_body(idx, p, body, "api", **kw)
    return err.value


def test_from_body_makes_the_typed_submission() -> None:
    idx = _index()
    body = {
        "resource": "team-a/sized",
        "gpus": 0.5,
        "project": "evals",
        "command": ["python", "train.py"],
        "labels": {"run": "7"},
    }
    sub = from_body(idx, BOB, body, "cli", "key-1")
    assert sub == Submission(
        resource="team-a/sized",
        user="bob",
        project="evals",
        gpus_milli=500,
        command=["python", "train.py"],
        payload=None,
        labels={"run": "7"},
        channel="cli",
        idempotency_key="key-1",
    )
    assert sub.data_bytes > 0
    # an admin on behalf of a user: the user's submission
    on_behalf = from_body(idx, ADMIN, {**body, "user": "alice"}, "api")
    assert (on_behalf.user, on_behalf.channel, on_behalf.idempotency_key) == ("alice", "api", None)
    # the event's payload carries every field, and reads back to the same values
    data = sub.event().to_data()
    back = E.payload(E.Event("submitted", "t-1", "user:bob", data=data))
    assert back == sub.event() and not back.extra


def test_from_body_refuses_each_wrong_submission_as_the_api_did() -> None:
    idx = _index()
    ok = {"resource": "team-a/one", "command": ["true"]}
    err = _refused(idx, BOB, {"resource": "team-a/one"})
    assert (err.status, err.code) == (422, "invalid-task")
    err = _refused(idx, BOB, {**ok, "command": ["x" * (64 * 1024 + 1)]})
    assert (err.status, err.code) == (413, "too-large")
    assert err.details is not None and err.details["pointer"] == "/command"
    err = _refused(idx, BOB, {**ok, "payload": {"x": "y" * (64 * 1024)}})
    assert (err.status, err.code) == (413, "too-large")
    assert err.details is not None and err.details["pointer"] == "/payload"
    err = _refused(idx, BOB, {**ok, "labels": {"klique.channel": "mcp"}})
    assert (err.status, err.code) == (422, "invalid-field")
    assert err.details == {"field": "labels.klique.channel"}
    err = _refused(idx, ADMIN, ok)
    assert err.status == 422 and "on behalf of a user" in err.message  # issue 32
    err = _refused(idx, BOB, {**ok, "user": "alice"})
    assert err.status == 403 and "only an admin" in err.message
    err = _refused(idx, BOB, ok, key="k" * 257)
    assert err.status == 400 and "Idempotency-Key" in err.message
    err = _refused(idx, BOB, {"resource": "team-a/sized", "gpus": 0.0001, "command": ["x"]})
    assert err.status == 400 and "more than 3 decimal places" in err.message
    # the estate's rule: a resource not theirs names the ones they may use
    err = _refused(idx, BOB, {**ok, "resource": "team-b/one"})
    assert (err.status, err.code, err.details) == (422, "submission-refused", {"field": "user"})
    assert err.message.endswith("bob may submit to team-a/one, team-a/sized"), err.message
    err = _refused(idx, BOB, {"resource": "team-a/one", "gpus": 2, "command": ["x"]})
    assert (err.status, err.code, err.details) == (422, "submission-refused", {"field": "gpus"})
    assert "may submit to" not in err.message  # their own resource: no list
    # a retry of a key the daemon holds is answered by the key, whatever the estate says now
    sub = from_body(idx, BOB, {**ok, "resource": "team-b/one"}, "api", "k", retry=True)
    assert sub.resource == "team-b/one"


def test_the_task_record_and_its_interval_come_from_the_typed_submission() -> None:
    d = Daemon()
    estate = compile_dir(SMALL_ESTATE).estate
    assert estate is not None
    now = d.clock.now()
    d.prepare_estate(estate, "test", "test", now, Overlay()).apply()
    sub = from_body(
        d.idx(),
        BOB,
        {"resource": "team-a/one", "project": "evals", "command": ["true"], "labels": {"a": "b"}},
        "sdk",
        "key-2",
    )
    prep = d.prepare_submit(BOB, sub, now, Overlay())
    (ev,) = prep.events
    assert ev.data == sub.event().to_data() and (ev.usr, ev.grp) == ("bob", "team-a")
    status, tid = prep.apply()
    rec = d.records[tid]
    assert status == 201
    assert (rec.user, rec.project, rec.channel, rec.labels, rec.command) == (
        "bob",
        "evals",
        "sdk",
        {"a": "b"},
        ["true"],
    )
    assert d.idem[("user:bob", "key-2")] == tid
    _, ops, _ = d.run_pass(now + 1)
    (opens,) = [op for op in ops if isinstance(op, ledger_ops.OpenIntervals)]
    (row,) = opens.rows
    assert (row.task, row.user, row.project, row.channel, row.group) == (
        tid,
        "bob",
        "evals",
        "sdk",
        "team-a",
    )


# ------------------------------------------------------------ the same refusal, every channel


async def _context(tmp: Path) -> tuple[Context, asyncio.Task[None]]:
    store = Store(str(tmp / "k.duckdb"))
    store.ensure_schema()
    d = Daemon()
    d.tokens.hasher, _ = keyfile.open_hasher(tmp / "k.duckdb", store)
    seq = Sequencer(d, store, 3600.0, metrics=Metrics(d))
    runner = asyncio.create_task(seq.run())
    compiled = compile_dir(SMALL_ESTATE).estate
    assert compiled is not None
    await seq.submit(
        lambda now, ov: d.prepare_estate(compiled, "test", "test", now, ov), barrier=True
    )
    return Context(d, seq, store, 3600.0, LogStore(tmp / "logs")), runner


PIPELINE = """\
pipeline: theirs
steps:
  - name: only
    resource: team-b/one
    command: [echo, no]
"""


def test_every_channel_refuses_the_same_submission_with_the_same_error(tmp_path: Path) -> None:
    """bob sends to team-b's resource through each channel: one 422 ``submission-refused``
    naming the field and what bob may use, the same words everywhere (a pipeline's prefixed
    with its step), and nothing submitted."""

    async def go() -> None:
        c, runner = await _context(tmp_path)
        d = c.daemon
        _, secret = await c.seq.submit(
            lambda now, ov: d.prepare_token(None, "user:bob", "t", now, ov)
        )
        client = TestClient(TestServer(make_app(c)))
        await client.start_server()
        try:
            auth = {"Authorization": f"Bearer {secret}"}

            async def post(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
                r = await client.post(path, json=body, headers=auth)
                return r.status, await r.json()

            bad = {"resource": "team-b/one", "command": ["echo", "no"]}
            answers = {
                "tasks": await post("/v1/tasks", bad),
                "sessions": await post("/v1/sessions", {"resource": "team-b/one", "app": "shell"}),
                "schedules": await post("/v1/schedules", {"cron": "0 2 * * *", **bad}),
            }
            with tools.acting_as(BOB):
                async with Client(tools.build(c)) as mcp:
                    res = await mcp.call_tool("submit_task", bad)
            mcp_text = "".join(getattr(b, "text", "") for b in res.content)
            st, pipe = await post("/v1/pipelines", {"file": "p.yaml", "text": PIPELINE})
        finally:
            await client.close()
            await c.seq.stop()
            await runner
            c.store.close()
        want = (
            "user 'bob' is not in the users of group 'team-b'; bob may submit to "
            "team-a/one, team-a/sized"
        )
        for channel, (status, body) in answers.items():
            err = body["error"]
            assert (status, err["code"], err["message"]) == (422, "submission-refused", want), (
                channel,
                body,
            )
            assert err["details"]["field"] == "user", (channel, body)
        assert res.is_error and "422 submission-refused" in mcp_text and want in mcp_text
        assert st == 422 and pipe["error"]["code"] == "submission-refused", pipe
        assert pipe["error"]["message"] == f"p.yaml: step only: {want}", pipe
        assert not d.records and not d.schedules.items

    asyncio.run(go())
