"""The MCP tools in-process: the SDK's client connected straight to the daemon's MCP server
(no HTTP), over a real Daemon, Store (DuckDB) and Sequencer. The identity is the one the
endpoint would set (``tools.acting_as``); without one, every tool refuses."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from compiler.api import compile_dir
from kliqued.daemon.api.agents import tools
from kliqued.daemon.auth import Principal
from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.logs import LogStore
from kliqued.daemon.api.metrics import Metrics
from kliqued.daemon.state.loop import Sequencer
from kliqued.daemon.api.request import Context
from kliqued.daemon.storage.store import Store

from tests.harness.daemon import SMALL_ESTATE

BOB, ERIN = Principal("user", "bob"), Principal("user", "erin")


async def _daemon(tmp: Path) -> tuple[Context, asyncio.Task]:
    store = Store(str(tmp / "k.duckdb"))
    store.ensure_schema()
    d = Daemon()
    seq = Sequencer(d, store, 3600.0, metrics=Metrics(d))
    runner = asyncio.create_task(seq.run())
    compiled = compile_dir(SMALL_ESTATE).estate
    assert compiled is not None
    await seq.submit(
        lambda now, ov: d.prepare_estate(compiled, "test", "test", now, ov), barrier=True
    )
    return Context(d, seq, store, 3600.0, LogStore(tmp / "logs")), runner


async def _stop(c: Context, runner: asyncio.Task) -> None:
    await c.seq.stop()
    await runner
    c.store.close()


async def _call(server: Any, who: Principal | None, tool: str, args: dict) -> Any:
    """One tool call as ``who`` through the SDK's in-process client."""

    async def go() -> Any:
        async with Client(server) as client:
            return await client.call_tool(tool, args)

    if who is None:
        return await go()
    with tools.acting_as(who):
        return await go()


def _text(res: Any) -> str:
    return "".join(getattr(b, "text", "") for b in res.content)


def test_tools_in_process_act_as_the_principal(tmp_path: Path) -> None:
    async def go() -> None:
        c, runner = await _daemon(tmp_path)
        try:
            server = tools.build(c)
            res = await _call(
                server, BOB, "submit_task", {"resource": "team-a/one", "command": ["true"]}
            )
            assert not res.is_error, _text(res)
            t = res.structured_content
            assert (t["user"], t["actor"], t["channel"]) == ("bob", "user:bob", "mcp")
            rec = c.daemon.records[t["id"]]
            assert rec.channel == "mcp" and rec.actor == "user:bob"
            # On a cursor of its own, as the daemon's readers do: the store's connection is
            # its writer's, and DuckDB refuses a second call on it while a commit runs.
            rows = await c.store.read(
                lambda cur: cur.execute(
                    "SELECT actor, data->>'channel' FROM events WHERE kind = 'submitted'"
                ).fetchall()
            )
            assert rows == [("user:bob", "mcp")]
            # erin's agent: not hers, not even visible
            res = await _call(server, ERIN, "cancel_task", {"task_id": t["id"]})
            assert res.is_error and f"no task {t['id']} (404 not-found)" in _text(res)
            assert c.daemon.records[t["id"]].state != "ended"
            res = await _call(server, BOB, "cancel_task", {"task_id": t["id"]})
            assert not res.is_error and res.structured_content["state"] == "ended"
            # no identity at all: refused, nothing done
            res = await _call(
                server, None, "submit_task", {"resource": "team-a/one", "command": ["true"]}
            )
            assert res.is_error and "unauthenticated" in _text(res)
            assert len(c.daemon.records) == 1
        finally:
            await _stop(c, runner)

    asyncio.run(go())


@pytest.mark.parametrize(
    "who, allowed", [(Principal("role", "finance"), False), (Principal("role", "admin"), True)]
)
def test_the_route_s_roles_apply_to_its_tool(tmp_path: Path, who: Principal, allowed: bool) -> None:
    """finance may read budgets but not submit (submitTask is for users and admins); an
    admin's submission needs a user, as in the API."""

    async def go() -> None:
        c, runner = await _daemon(tmp_path)
        try:
            server = tools.build(c)
            res = await _call(server, who, "budget", {})
            assert not res.is_error and res.structured_content["policies"]
            res = await _call(
                server, who, "submit_task", {"resource": "team-a/one", "command": ["true"]}
            )
            assert res.is_error
            if allowed:
                assert "an admin sends work only on behalf of a user" in _text(res)
            else:
                assert "may not call submitTask" in _text(res) and "(403 forbidden)" in _text(res)
            assert not c.daemon.records
        finally:
            await _stop(c, runner)

    asyncio.run(go())


def test_dry_run_task_answers_and_stores_nothing(tmp_path: Path) -> None:
    """Issue 31: an agent asks before it sends. bob's dry run on team-a/one answers placed
    on pool-1 within team-a's reservation, with its cost and the budget with it; nothing is
    stored (no task, no event); erin (not in team-a) is refused as submit_task refuses her;
    a task that then waits shows its forecast in show_task."""

    async def go() -> None:
        c, runner = await _daemon(tmp_path)
        try:
            server = tools.build(c)
            args = {"resource": "team-a/one", "command": ["true"]}
            res = await _call(server, BOB, "dry_run_task", args)
            assert not res.is_error, _text(res)
            a = res.structured_content
            assert (a["outcome"], a["pool"], a["phase"]) == ("placed", "pool-1", "reserve")
            assert a["cost_per_hour"] == 2.5 and a["budgets"][0]["burn_rate_with"] == 1
            assert a["forecast"]["basis"] == "now"
            assert c.daemon.records == {}
            rows = await c.store.read(
                lambda cur: cur.execute(
                    "SELECT count(*) FROM events WHERE task IS NOT NULL"
                ).fetchall()
            )
            assert rows == [(0,)]
            # a task that waits: show_task carries its forecast (pool-2 holds 8 GPUs)
            sized = {"resource": "team-a/sized", "command": ["true"], "gpus": 3}
            ids = []
            for _ in range(3):
                res = await _call(server, BOB, "submit_task", sized)
                ids.append(res.structured_content["id"])
            d = c.daemon
            for _ in range(200):  # two placed, and a pass has seen the third
                recs = [d.records[t] for t in ids]
                if sum(r.state == "placed" for r in recs) == 2 and all(
                    r.submitted_pass < d.passes for r in recs
                ):
                    break
                await asyncio.sleep(0.05)
            waiting = next(t for t in ids if c.daemon.records[t].state == "queued")
            res = await _call(server, BOB, "show_task", {"task_id": waiting})

            assert res.structured_content["forecast"] == {
                "start_at": None,
                "basis": "unknown",
                "text": "unknown: waits for capacity",
            }
            res = await _call(server, ERIN, "dry_run_task", args)
            sub = await _call(server, ERIN, "submit_task", args)
            assert res.is_error and sub.is_error
            assert _text(res).replace("dry_run_task", "submit_task") == _text(sub)
            assert len(c.daemon.records) == 3  # bob's three; no dry run left a task
        finally:
            await _stop(c, runner)

    asyncio.run(go())
