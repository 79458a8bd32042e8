"""The token an unattended channel runs on (issue 25, item 3).

A schedule, and each pipeline run, record the id of the token that made them (never its
secret). When that token stops working (revoked, expired, or unknown), the schedule or
pipeline is paused, with the reason, so nothing goes on submitting as a user on a credential
that user no longer holds. Its owner resumes it with a live token of theirs, which binds it
to that token. A rotation carries them to the new token: the same user's credential,
renewed (docs/decisions.md, "Schedules outlive no token").

Whether the token still works is ``TokenBook.ended``. Checked at each run and each step
(``schedules.prepare_run``, ``pipelines.prepare_advance``), at each look of the loop (an
expiry has no event of its own), and in the very commit that revokes or rotates a token
(``prepare_revoke``, ``prepare_rotate`` here: the token handler's one call). The pauses and rebinds are ``schedule_changed`` and ``pipeline_changed`` events,
so a restart replays them as they were.
"""

from __future__ import annotations

from typing import Any

from kliqued.daemon.state import pipelines, schedules
from kliqued.daemon.auth import Principal
from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.state.prepared import Overlay, Prepared, merged
from kliqued.daemon.units import iso


def prepare_revoke(d: Daemon, p: Principal, token_id: str, now: int, ov: Overlay) -> Prepared:
    """The token revoked, and in the same commit every active schedule and running pipeline
    bound to it paused: when the revocation answers, none of them sends anything more."""
    revoke = d.prepare_revoke(p, token_id, now, ov)
    why = f"token {token_id} was revoked on {iso(now)}"
    return merged([revoke, _pause_bound(d, token_id, why, now)])


def _pause_bound(d: Daemon, token_id: str, why: str, now: int) -> Prepared:
    parts = [
        schedules.prepare_pause_for(d, s.id, why, now)
        for s in d.schedules.active()
        if s.token == token_id
    ]
    parts += [
        pipelines.prepare_pause_for(d, pr.id, why, now)
        for pr in d.pipelines.running()
        if pr.token == token_id
    ]
    return merged(parts)


def prepare_rotate(
    d: Daemon,
    p: Principal,
    token_id: str,
    grace_ms: int,
    expires_at: int | None,
    now: int,
    ov: Overlay,
) -> Prepared:
    """The token rotated (``Daemon.prepare_rotate``), and every schedule and unended pipeline
    bound to it rebound to the new token in the same commit, their state unchanged. Answers
    what the rotation answers."""
    rotate = d.prepare_rotate(p, token_id, grace_ms, expires_at, now, ov)
    new_id = rotate.events[0].data["id"]
    parts = [
        schedules.prepare_rebind(d, s.id, new_id, now)
        for s in d.schedules.items.values()
        if s.token == token_id
    ]
    parts += [
        pipelines.prepare_rebind(d, pr.id, new_id, now)
        for pr in d.pipelines.unended()
        if pr.token == token_id
    ]
    answer: list[Any] = []
    first = rotate.apply
    rotate.apply = lambda: answer.append(first())
    out = merged([rotate, *parts])
    inner = out.apply

    def apply() -> Any:
        inner()
        return answer[0]

    out.apply = apply
    return out
