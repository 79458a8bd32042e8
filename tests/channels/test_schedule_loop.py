"""The schedule loop with an injectable clock, in process: a real Daemon, DuckDB store and
Sequencer, and ``Unattended`` driven at chosen times (cron has minutes; tests do not wait for
them). Then the same log replayed into a new Daemon: what a restart rebuilds."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from compiler.api import compile_dir
from kliqued.daemon.state import schedules
from kliqued.daemon.auth import Principal
from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.state.submission import Submission
from kliqued.daemon.api.metrics import Metrics
from kliqued.daemon.state.loop import Sequencer
from kliqued.daemon.state.replay import rebuild
from kliqued.daemon.storage.store import Store
from kliqued.daemon.state.unattended import Unattended

from tests.daemon.fleet import ESTATE, write_estate
from tests.harness.typed import present

ALICE = Principal("user", "alice")
T0 = int(datetime(2026, 12, 1, 10, 0, tzinfo=timezone.utc).timestamp() * 1000)
MIN = 60_000


class Harness:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.db = str(tmp / "k.duckdb")
        self.now = T0

    async def __aenter__(self) -> "Harness":
        self.store = Store(self.db)
        self.store.ensure_schema()
        self.d = Daemon()
        rebuild(self.d, self.store)
        self.seq = Sequencer(self.d, self.store, 3600.0, metrics=Metrics(self.d))
        self.runner = asyncio.create_task(self.seq.run())
        self.loop = Unattended(self.d, self.seq, now=lambda: self.now)
        if not self.d.ready:
            await self.estate(ESTATE)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.seq.stop()
        await self.runner
        self.store.close()

    async def estate(self, files: dict[str, str]) -> None:
        where = write_estate(self.tmp / f"estate-{len(list(self.tmp.iterdir()))}", files)
        compiled = compile_dir(where).estate
        assert compiled is not None
        await self.seq.submit(
            lambda now, ov: self.d.prepare_estate(compiled, "t", "t", now, ov), barrier=True
        )

    async def create(self, **f: Any) -> str:
        fields = {
            "cron": "*/10 * * * *",
            "timezone": "UTC",
            "concurrency": "allow",
            "missed": "run-once",
            "deadline_s": None,
            "name": None,
            "resource": "team-a/one",
            "command": ["sleep", "100"],
            "project": None,
            "gpus_milli": None,
            "labels": {},
            **f,
        }
        return await self.seq.submit(
            lambda now, ov: schedules.prepare_create(
                self.d, ALICE, {**fields, "cursor": self.now}, now, ov
            )
        )

    async def at(self, t: int) -> int:
        self.now = t
        return await self.loop.tick()

    def sched(self, sid: str) -> schedules.Schedule:
        return self.d.schedules.items[sid]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_due_runs_once_per_due_time_as_the_owner(tmp_path: Path) -> None:
    async def go() -> None:
        async with Harness(tmp_path) as h:
            sid = await h.create()
            assert await h.at(T0 + 9 * MIN) == 0  # not due yet
            assert await h.at(T0 + 10 * MIN) == 1
            assert await h.at(T0 + 10 * MIN + 500) == 0  # the same due time: done
            s = h.sched(sid)
            (r,) = s.runs
            assert (r.due, r.outcome) == (T0 + 10 * MIN, "submitted")
            rec = h.d.records[present(r.task)]
            assert (rec.user, rec.actor) == ("alice", "user:alice")
            assert rec.labels == {"klique.schedule": sid, "klique.channel": "schedule"}
            assert rec.channel == "schedule"  # issue 14, part 5: beside the user
            assert rec.idempotency_key == f"schedule:{sid}:{T0 + 10 * MIN}"

    run(go())


def test_forbid_skips_while_the_previous_run_runs(tmp_path: Path) -> None:
    async def go() -> None:
        async with Harness(tmp_path) as h:
            sid = await h.create(concurrency="forbid")
            await h.at(T0 + 10 * MIN)
            await h.at(T0 + 20 * MIN)
            first, second = h.sched(sid).runs
            assert second.outcome == "skipped" and second.task is None
            assert (
                f"the previous run ({first.task}) still runs (concurrency: forbid)" == second.text
            )
            assert len(h.d.records) == 1

    run(go())


def test_replace_cancels_the_previous_run_first(tmp_path: Path) -> None:
    async def go() -> None:
        async with Harness(tmp_path) as h:
            sid = await h.create(concurrency="replace")
            await h.at(T0 + 10 * MIN)
            await h.at(T0 + 20 * MIN)
            first, second = h.sched(sid).runs
            assert second.outcome == "submitted"
            old = h.d.records[present(first.task)]
            assert old.state == "ended" and old.end_reason == "cancelled"
            assert "replaced by schedule" in (old.end_note or "")
            assert h.d.records[present(second.task)].state != "ended"

    run(go())


def test_allow_runs_beside_the_previous_run(tmp_path: Path) -> None:
    async def go() -> None:
        async with Harness(tmp_path) as h:
            sid = await h.create()
            await h.at(T0 + 10 * MIN)
            await h.at(T0 + 20 * MIN)
            runs = h.sched(sid).runs
            assert [r.outcome for r in runs] == ["submitted", "submitted"]
            assert all(h.d.records[present(r.task)].state != "ended" for r in runs)

    run(go())


def test_an_owner_who_left_the_group_stops_the_schedule(tmp_path: Path) -> None:
    """Checked when the estate changes, and again at each run (a run refused for access
    stops it too: test_a_run_the_owner_may_no_longer_send_stops_it)."""

    async def go() -> None:
        async with Harness(tmp_path) as h:
            sid = await h.create()
            left = dict(ESTATE)
            left["groups.yaml"] = ESTATE["groups.yaml"].replace(
                "    users: [alice]\n", "    users: [carol]\n"
            )
            await h.estate(left)
            assert await h.at(T0 + 1 * MIN) == 1  # the estate changed: stopped at once,
            s = h.sched(sid)  # not at its next run
            assert s.state == "stopped" and not s.runs
            await h.at(T0 + 10 * MIN)
            assert s.state == "stopped"
            assert s.reason == (
                "stopped: alice may no longer send to team-a/one: user "
                "'alice' is not in the users of group 'team-a'"
            )
            assert not s.runs and not h.d.records
            assert await h.at(T0 + 20 * MIN) == 0  # stopped: no more looks

    run(go())


def test_pause_skips_the_due_times_until_resume(tmp_path: Path) -> None:
    async def go() -> None:
        async with Harness(tmp_path) as h:
            sid = await h.create()
            await h.seq.submit(
                lambda now, ov: schedules.prepare_change(
                    h.d, "user:alice", sid, "paused", "paused by user:alice", now, ov
                )
            )
            assert await h.at(T0 + 30 * MIN) == 0
            await h.seq.submit(
                lambda now, ov: schedules.prepare_change(
                    h.d, "user:alice", sid, "active", None, now, ov, T0 + 31 * MIN
                )
            )
            s = h.sched(sid)
            assert s.cursor == T0 + 31 * MIN  # resumed at 10:31
            await h.at(T0 + 40 * MIN)
            assert [r.due for r in s.runs] == [T0 + 40 * MIN]  # not 10:10, 10:20, 10:30

    run(go())


def test_a_restart_rebuilds_each_schedule_and_runs_nothing_twice(tmp_path: Path) -> None:
    async def first() -> str:
        async with Harness(tmp_path) as h:
            sid = await h.create(missed="run-once")
            await h.at(T0 + 10 * MIN)
            return sid

    async def second(sid: str) -> None:
        async with Harness(tmp_path) as h:
            s = h.sched(sid)
            assert s.cursor == T0 + 10 * MIN and len(s.runs) == 1
            assert await h.at(T0 + 10 * MIN + 30_000) == 0  # the same due time: nothing
            # down from 10:10 to 10:45: 10:20, 10:30 missed, 10:40 runs once
            assert await h.at(T0 + 45 * MIN) == 1
            last = s.runs[-1]
            assert (last.due, last.outcome, last.missed) == (T0 + 40 * MIN, "submitted", 2)
            assert len(h.d.records) == 2

    sid = run(first())
    run(second(sid))


PIPE = """\
pipeline: nightly
params:
  day: monday
steps:
  - name: first
    resource: team-a/one
    command: [echo, "${params.day}"]
  - name: second
    resource: team-a/one
    needs: [first]
    command: [echo, two]
"""


def test_a_pipeline_is_the_command_of_a_schedule(tmp_path: Path) -> None:
    async def go() -> None:
        async with Harness(tmp_path) as h:
            sid = await h.create(
                resource=None,
                command=None,
                concurrency="forbid",
                pipeline={
                    "file": "n.yaml",
                    "text": PIPE,
                    "params": {"day": "friday"},
                    "name": "nightly",
                },
            )
            await h.at(T0 + 10 * MIN)
            (r,) = h.sched(sid).runs
            assert r.outcome == "submitted" and r.pipeline is not None
            pr = h.d.pipelines.items[r.pipeline]
            assert (pr.owner, pr.schedule, pr.params) == ("alice", sid, {"day": "friday"})
            await h.at(T0 + 10 * MIN + 1)  # the loop sends the first step
            (tid,) = pr.steps["first"].tasks
            rec = h.d.records[tid]
            assert rec.command == ["echo", "friday"] and rec.actor == "user:alice"
            assert pr.steps["second"].tasks == []  # waits for first
            await h.at(T0 + 20 * MIN)  # forbid: the pipeline still runs
            assert h.sched(sid).runs[-1].outcome == "skipped"

    run(go())


def test_a_run_the_owner_may_no_longer_send_stops_it(tmp_path: Path) -> None:
    async def go() -> None:
        async with Harness(tmp_path) as h:
            sid = await h.create()
            await h.at(T0)  # the loop has seen this revision
            h.loop.revision = "pretend-unchanged"  # the estate check is skipped...
            left = dict(ESTATE)
            left["groups.yaml"] = ESTATE["groups.yaml"].replace(
                "    users: [alice]\n", "    users: [carol]\n"
            )
            await h.estate(left)
            h.loop.revision = h.d.estate.revision  # ...so the run's own check stops it
            await h.at(T0 + 10 * MIN)
            s = h.sched(sid)
            assert s.state == "stopped" and s.reason is not None
            assert s.reason.startswith("stopped: alice may no longer send to team-a/one")
            assert s.runs[-1].outcome == "failed" and not h.d.records

    run(go())


def test_a_key_already_used_by_the_owner_is_recorded_not_retried_forever(tmp_path: Path) -> None:
    """The owner sent a task with the key a run would use: the run records that task (the
    loop must not find the same due time again and again)."""

    async def go() -> None:
        async with Harness(tmp_path) as h:
            sid = await h.create()
            key = f"schedule:{sid}:{T0 + 10 * MIN}"
            fields: dict[str, Any] = {
                "resource": "team-a/one",
                "user": "alice",
                "project": None,
                "gpus_milli": None,
                "command": ["echo"],
                "payload": None,
                "labels": {},
            }
            _, mine = await h.seq.submit(
                lambda now, ov: h.d.prepare_submit(
                    ALICE, Submission(**fields, idempotency_key=key), now, ov
                )
            )
            assert await h.at(T0 + 10 * MIN) == 1
            assert await h.at(T0 + 10 * MIN + 1) == 0
            (r,) = h.sched(sid).runs
            assert (r.outcome, r.task) == ("submitted", mine)
            assert len(h.d.records) == 1

    run(go())


def test_a_user_has_a_bounded_number_of_schedules_and_running_pipelines(
    tmp_path: Path, monkeypatch: Any
) -> None:
    from kliqued.daemon.state import pipelines
    from kliqued.daemon.errors import ApiError

    monkeypatch.setattr(schedules, "MAX_PER_OWNER", 2)
    monkeypatch.setattr(pipelines, "MAX_RUNNING_PER_OWNER", 1)

    async def go() -> None:
        async with Harness(tmp_path) as h:
            await h.create()
            await h.create()
            try:
                await h.create()
            except ApiError as exc:
                assert exc.status == 429 and "alice has 2 schedules" in exc.message
            else:
                raise AssertionError("a third schedule was made")
            spec = {"file": "n.yaml", "text": PIPE, "params": {}}
            await h.seq.submit(lambda now, ov: pipelines.prepare_start(h.d, ALICE, spec, now, ov))
            try:
                await h.seq.submit(
                    lambda now, ov: pipelines.prepare_start(h.d, ALICE, spec, now, ov)
                )
            except ApiError as exc:
                assert exc.status == 429 and "1 pipelines running" in exc.message
            else:
                raise AssertionError("a second pipeline started")

    run(go())
