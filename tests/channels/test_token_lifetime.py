"""A schedule runs on the token that made it (issue 25, item 3): revoked or expired, the
schedule is paused with the reason and submits nothing more; its owner resumes it with a
live token, which binds it to that token; nobody else resumes it on a dead token; a rotation
carries it to the new token. Driven in process with the loop's injectable clock (the
``Harness`` of test_schedule_loop.py), then replayed into a new Daemon: what a restart
rebuilds. The real daemon's side (the API, the CLI, a pipeline in flight, a restart) is
tests/security/test_token_lifetime.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
import pytest

from kliqued.daemon.state import binding, schedules
from kliqued.daemon.auth import Principal
from kliqued.daemon.errors import ApiError
from kliqued.daemon.ids import TokenHasher

from tests.channels.test_schedule_loop import MIN, T0, Harness

ADMIN = Principal("role", "admin")
EVERY_MINUTE: dict[str, Any] = {
    "cron": "* * * * *",
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
}


async def token(h: Harness, user: str = "alice", expires_at: int | None = None) -> str:
    """A new token of ``user``'s, its id (the secret is not needed in process)."""
    if h.d.tokens.hasher is None:
        h.d.tokens.hasher = TokenHasher(b"k" * 32)
    rec, _ = await h.seq.submit(
        lambda now, ov: h.d.prepare_token(
            ADMIN, f"user:{user}", None, now, ov, expires_at=expires_at
        )
    )
    return str(rec.id)


async def create(h: Harness, tid: str) -> str:
    alice = Principal("user", "alice", tid)
    return str(
        await h.seq.submit(
            lambda now, ov: schedules.prepare_create(
                h.d, alice, {**EVERY_MINUTE, "cursor": h.now}, now, ov
            )
        )
    )


async def resume(h: Harness, p: Principal, sid: str) -> None:
    await h.seq.submit(lambda now, ov: schedules.prepare_resume(h.d, p, sid, now, ov, h.now))


def submitted(h: Harness, sid: str) -> list[int]:
    return [r.due for r in h.sched(sid).runs if r.outcome == "submitted"]


def test_a_revoked_token_pauses_its_schedule_with_the_reason_and_a_restart_keeps_it(
    tmp_path: Path,
) -> None:
    async def first() -> tuple[str, str]:
        async with Harness(tmp_path) as h:
            tid = await token(h)
            sid = await create(h, tid)
            assert h.sched(sid).token == tid  # the id that made it, never the secret
            assert await h.at(T0 + MIN) == 1
            assert submitted(h, sid) == [T0 + MIN]
            await h.seq.submit(lambda now, ov: binding.prepare_revoke(h.d, ADMIN, tid, now, ov))
            s = h.sched(sid)
            assert s.state == "paused"  # in the revocation's own commit
            assert s.reason is not None and s.reason.startswith(
                f"paused: token {tid} was revoked on "
            )
            assert f"alice resumes it with a live token (kliqued schedule resume {sid})" in s.reason
            for minute in (2, 3, 4):
                assert await h.at(T0 + minute * MIN) == 0
            assert submitted(h, sid) == [T0 + MIN] and len(h.d.records) == 1
            return sid, s.reason

    async def second(sid: str, reason: str) -> None:
        async with Harness(tmp_path) as h:  # replayed from the log
            s = h.sched(sid)
            assert (s.state, s.reason) == ("paused", reason)
            assert await h.at(T0 + 5 * MIN) == 0
            assert submitted(h, sid) == [T0 + MIN] and len(h.d.records) == 1

    sid, reason = asyncio.run(first())
    asyncio.run(second(sid, reason))


def test_an_expired_token_pauses_its_schedule_at_the_next_look(tmp_path: Path) -> None:
    async def go() -> None:
        async with Harness(tmp_path) as h:
            tid = await token(h, expires_at=T0 + 90_000)
            sid = await create(h, tid)
            assert await h.at(T0 + MIN) == 1
            assert await h.at(T0 + 2 * MIN) == 1  # the pause, not a run
            s = h.sched(sid)
            assert s.state == "paused"
            assert s.reason is not None and s.reason.startswith(
                f"paused: token {tid} expired on 2026-12-01T10:01:30Z"
            )
            assert submitted(h, sid) == [T0 + MIN]
            assert await h.at(T0 + 3 * MIN) == 0
            assert submitted(h, sid) == [T0 + MIN]

    asyncio.run(go())


def test_only_the_owner_resumes_it_and_it_then_runs_on_the_resuming_token(tmp_path: Path) -> None:
    async def go() -> None:
        async with Harness(tmp_path) as h:
            dead = await token(h)
            sid = await create(h, dead)
            await h.seq.submit(lambda now, ov: binding.prepare_revoke(h.d, ADMIN, dead, now, ov))
            h.now = T0 + 2 * MIN
            erin = Principal("user", "erin", await token(h, "erin"))
            for other in (ADMIN, erin):  # an admin, another user: not on alice's dead token
                with pytest.raises(ApiError) as err:
                    await resume(h, other, sid)
                assert err.value.status == 409
                assert (
                    f"only alice may resume it, with a live token of theirs "
                    f"(kliqued schedule resume {sid})"
                ) in err.value.message
                assert h.sched(sid).state == "paused"
            assert await h.at(T0 + 3 * MIN) == 0
            live = await token(h)
            await resume(h, Principal("user", "alice", live), sid)
            s = h.sched(sid)
            assert (s.state, s.reason, s.token) == ("active", None, live)
            assert await h.at(T0 + 4 * MIN) == 1
            assert submitted(h, sid) == [T0 + 4 * MIN]  # not the minutes it was paused
            # an admin pauses and resumes it while alice's token works: still hers
            await h.seq.submit(
                lambda now, ov: schedules.prepare_change(
                    h.d, ADMIN.text, sid, "paused", "paused by role:admin", now, ov
                )
            )
            await resume(h, ADMIN, sid)
            assert (s.state, s.token) == ("active", live)

    asyncio.run(go())


def test_a_rotation_carries_the_schedule_to_the_new_token(tmp_path: Path) -> None:
    async def go() -> None:
        async with Harness(tmp_path) as h:
            old = await token(h)
            sid = await create(h, old)
            rec, _, was = await h.seq.submit(
                lambda now, ov: binding.prepare_rotate(h.d, ADMIN, old, 0, None, now, ov)
            )
            assert was.id == old and was.revoked_at is not None
            s = h.sched(sid)
            assert (s.state, s.token) == ("active", rec.id)
            assert await h.at(T0 + MIN) == 1
            assert submitted(h, sid) == [T0 + MIN]

    asyncio.run(go())
