"""The daemon's own changes: ``Daemon``, the live state (``core.DaemonState``: the engine's
``State`` and index, the records, tokens, idempotency keys and books, with one ``on_<kind>``
applier per event kind) and the changes prepared on it.

The live path and replay apply events through the same appliers (``reducers.apply``), so a
rebuilt daemon equals the one that stopped. On the live path a request's change is
*prepared* (validated, its events and ledger writes built) before the commit and *applied*
after it (``Prepared.apply``); an engine pass has already changed the State when its
decisions are logged (the sequencer orders both, see loop.py). The appliers are a base
class below the dispatch table and these prepares above it: no import cycle (issue 27).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from compiler.compiled import CompiledEstate
from klique_util.excerpt import excerpt
from kliqued.engine import (
    Alert,
    Cancellation,
    Placement,
    Preemption,
)
from kliqued.ledger import lost as ledger_lost
from kliqued.ledger import ops as ledger_ops
from kliqued.ledger import writer as ledger


from kliqued.daemon import limits
from kliqued.daemon.state import reducers, submission
from kliqued.daemon.auth import Principal, TokenRecord
from kliqued.daemon.errors import ApiError, not_found
from kliqued.daemon.events import Event
from kliqued.daemon.ids import new_token
from kliqued.daemon.identity.mapping import SignedIn, signin_creator
from kliqued.daemon.records import TaskRecord
from kliqued.daemon.storage.eventlog import TokenInsert, TokenUpdate
from kliqued.daemon.storage.store import DbOp
from kliqued.daemon.state.core import DaemonState
from kliqued.daemon.state.prepared import Overlay, Prepared
from kliqued.daemon.state.submission import Submission


log = logging.getLogger(__name__)


class Daemon(DaemonState):
    """The live state (``core.DaemonState``) and the changes prepared on it: an engine pass,
    and the requests that are the daemon's own (submit, cancel, the engine switch, the estate,
    tokens)."""

    # ------------------------------------------------------------------ the engine pass
    def run_pass(self, now: int) -> tuple[list[Event], list[DbOp], Counter[str]]:
        """One engine pass at ``now``: the State changes at once; the returned events and
        ledger writes are committed by the sequencer before any later change."""
        from kliqued.engine import run_pass

        idx, st = self.idx(), self.st()
        res = run_pass(idx, st, now)
        self.last_result = res
        self.passes += 1
        self.last_pass_at = now
        events: list[Event] = []
        ops: list[DbOp] = []
        opens: list[ledger.IntervalRow] = []
        closes: list[tuple[str, int, str]] = []
        lost_rows: list[ledger_lost.PreemptionRow] = []
        counts: Counter[str] = Counter()
        rev = idx.revision
        for d in res.decisions:
            if isinstance(d, Placement):
                rec = self.records[d.task]
                ev = Event(
                    "placed",
                    d.task,
                    "engine",
                    rev,
                    rec.group,
                    rec.user,
                    {
                        "pool": d.pool,
                        "resource": d.resource,
                        "size_milli": d.size_milli,
                        "phase": d.phase,
                        "interval": None,
                    },
                )
                reducers.apply(self, ev, now, decided=True)
                ev.data["interval"] = rec.interval_id  # the one this placement opened
                events.append(ev)
                t = st.tasks[d.task]
                opens.append(self._interval_row(rec, d.pool, t.size, t.weight, now, rev))
                counts["placed"] += 1
            elif isinstance(d, Preemption):
                rec = self.records[d.task]
                interval = rec.interval_id
                ev = Event(
                    "preempted",
                    d.task,
                    "engine",
                    rev,
                    rec.group,
                    rec.user,
                    {
                        "pool": d.pool,
                        "kind": d.kind,
                        "text": d.text,
                        "by": d.by,
                        "interval": interval,
                        **self.lost_work(d.task, d.size_milli, d.lost_ms),
                    },
                )
                reducers.apply(self, ev, now, decided=True)
                events.append(ev)
                closes.append((interval, now, d.text))
                if interval is not None:
                    lost_rows.append(self._preemption_row(rec, d, interval, now, rev))
                counts["preempted"] += 1
            elif isinstance(d, Cancellation):
                known = self.records.get(d.task)
                ev = Event(
                    "cancelled",
                    d.task,
                    "engine",
                    rev,
                    d.group,
                    known.user if known else None,
                    {"text": d.text, "by": "estate", "interval": None},
                )
                reducers.apply(self, ev, now, decided=True)
                events.append(ev)
                counts["cancelled"] += 1
            elif isinstance(d, Alert):
                data = {
                    "policy": d.policy,
                    "group": d.group,
                    "threshold_milli": d.threshold_milli,
                    "period_start": d.period_start,
                    "used_units": d.used_units,
                    "budget_units": d.budget_units,
                    "text": d.text,
                }
                ev = Event("alert", None, "engine", rev, d.group, None, data)
                reducers.apply(self, ev, now, decided=True)
                events.append(ev)
                counts["alerts"] += 1
        if opens:  # opened before closed: a task lent and reclaimed in one pass has both
            ops.append(ledger_ops.opens(opens))
        if closes:
            ops.append(ledger_ops.closes(closes))
        if lost_rows:
            ops.append(ledger_ops.RecordPreemptions(tuple(lost_rows)))
        return events, ops, counts

    def _interval_row(
        self, rec: TaskRecord, pool: str, size: int, weight: int, now: int, rev: str
    ) -> ledger.IntervalRow:
        """The ledger's row of a placement, from the task's typed record: its user, project
        and channel are what its ``submitted`` event recorded (``Submission.event``)."""
        return ledger.IntervalRow(
            interval_id=rec.interval_id,
            task=rec.id,
            user=rec.user,
            project=rec.project,
            group=rec.group,
            policy=rec.policy,
            profile=rec.profile,
            resource=rec.resource,
            pool=pool,
            gpu_type=self.gpu_type.get(pool, ""),
            gpus_milli=size,
            weight_milli=weight,
            start_ms=now,
            revision=rev,
            group_path=self.group_path.get(rec.group),
            channel=rec.channel,
        )

    def _preemption_row(
        self, rec: TaskRecord, d: Preemption, interval: str, now: int, rev: str
    ) -> ledger_lost.PreemptionRow:
        """The ledger's row of an engine preemption (lending.md: task, group, user,
        project, reason, the group that took the GPUs back, its lost GPU-hours)."""
        return ledger_lost.PreemptionRow(
            interval_id=interval,
            task=rec.id,
            user=rec.user,
            project=rec.project,
            group=rec.group,
            group_path=self.group_path.get(rec.group),
            policy=rec.policy,
            pool=d.pool,
            gpu_type=self.gpu_type.get(d.pool, ""),
            gpus_milli=d.size_milli,
            at_ms=now,
            kind=d.kind,
            reason=d.text,
            taker=d.by,
            taker_path=None if d.by is None else self.group_path.get(d.by),
            lost_ms=d.lost_ms,
            revision=rev,
        )

    # ------------------------------------------------------------------ requests
    def prepare_submit(self, p: Principal, sub: Submission, now: int, ov: Overlay) -> Prepared:
        """The ``submitted`` event of ``sub`` (checked at its edge by
        ``submission.from_body``) sent by ``p``: the answer of its idempotency key if it
        names a task already, a 429 over the user's quota, and the estate's check again,
        against the estate of this commit (it may have changed since the edge)."""
        key = sub.idempotency_key
        if key is not None:
            existing = ov.keys.get((p.text, key)) or self.idem.get((p.text, key))
            if existing is not None:
                return Prepared(apply=lambda: (200, existing))
        data_bytes = sub.data_bytes
        user = sub.user
        held = self.stored[user] + ov.stored[user]
        if data_bytes and held + data_bytes > self.max_user_bytes:
            raise ApiError(
                429,
                "user-quota",
                f"{user}'s tasks not yet ended hold "
                f"{limits.mib(held)} of commands and payloads; this one "
                f"({limits.mib(data_bytes)}) would pass the limit of "
                f"{limits.mib(self.max_user_bytes)} per user: wait for some to "
                f"end, or cancel some",
                {"held_bytes": held, "task_bytes": data_bytes, "limit_bytes": self.max_user_bytes},
            )
        idx = self.idx()
        exc = submission.refusal(idx, sub.resource, user, sub.project, sub.gpus_milli)
        if exc is not None:
            raise ApiError(422, "submission-refused", str(exc), {"field": exc.field})
        cr = idx.resources[sub.resource]
        task_id = self.task_ids.next(now)
        data = sub.event().to_data()
        ev = Event("submitted", task_id, p.text, idx.revision, cr.group, user, data)
        if key is not None:
            ov.keys[(p.text, key)] = task_id
        ov.stored[user] += data_bytes

        def apply() -> tuple[int, str]:
            reducers.apply(self, ev, now)
            return 201, task_id

        return Prepared([ev], [], apply, wants_pass=True)

    def prepare_cancel(
        self,
        p: Principal,
        task_id: str,
        now: int,
        ov: Overlay,
        reason: str | None = None,
        channel: str = "api",
    ) -> Prepared:
        """Cancels a task at ``p``'s request made through ``channel`` (recorded in the
        event, as a submission's is: the audit trail tells an agent's cancel from a
        person's). A task no longer in memory ended long ago (history.py): nothing to do,
        as for any ended task (the caller found it, in memory or in the history)."""
        rec = self.records.get(task_id)
        if rec is None or rec.state == "ended" or task_id in ov.ended:
            return Prepared(apply=lambda: task_id)
        ov.ended.add(task_id)
        placed = rec.state == "placed" and task_id not in ov.requeued
        interval = rec.interval_id if placed else None
        text = f"cancelled by {p.text}" + (f": {reason}" if reason else "")
        ev = Event(
            "cancelled",
            task_id,
            p.text,
            self.idx().revision,
            rec.group,
            rec.user,
            {
                "text": text,
                "by": "request",
                "was": rec.state if placed or rec.state != "placed" else "queued",
                "pool": rec.pool,
                "interval": interval,
                "channel": channel,
            },
        )
        ops: list[DbOp] = []
        if interval is not None:
            ops.append(ledger_ops.closes([(interval, now, "cancelled")]))

        def apply() -> str:
            reducers.apply(self, ev, now)
            return task_id

        return Prepared([ev], ops, apply, wants_pass=True)

    def prepare_engine(self, p: Principal, enabled: bool, now: int, ov: Overlay) -> Prepared:
        current = ov.enabled if ov.enabled is not None else self.st().enabled
        if current == enabled:
            return Prepared()
        ov.enabled = enabled
        ev = Event(
            "engine_enabled" if enabled else "engine_disabled", None, p.text, self.idx().revision
        )

        def apply() -> None:
            reducers.apply(self, ev, now)

        return Prepared([ev], [], apply, wants_pass=True)

    def prepare_estate(
        self,
        compiled: CompiledEstate,
        source: str | None,
        actor: str,
        now: int,
        ov: Overlay,
        commit: str | None = None,
    ) -> Prepared:
        data: dict[str, Any] = {"source": source, "estate": compiled.model_dump(mode="json")}
        if commit is not None:
            data["commit"] = commit
        ev = Event("estate_applied", None, actor, compiled.revision, None, None, data)
        ops: list[DbOp] = [
            ledger_ops.ReplacePrices(compiled),
            ledger_ops.RecordEstate(compiled, now),
        ]

        def apply() -> str:
            # What the ``estate_applied`` reducer does, minus reading the estate back from
            # its JSON: the compiled estate is at hand.
            self.on_estate(compiled, source, now, commit)
            return compiled.revision

        return Prepared([ev], ops, apply, wants_pass=True)

    def prepare_refused(self, refused: dict[str, Any], now: int, ov: Overlay) -> Prepared:
        """An estate revision that does not compile: logged, shown by GET /v1/estate, while
        the running revision keeps running."""
        ev = Event("estate_refused", None, "kliqued", self.estate.revision, None, None, refused)

        def apply() -> None:
            reducers.apply(self, ev, now)

        return Prepared([ev], [], apply)

    def prepare_token(
        self,
        p: Principal | None,
        principal: str,
        name: str | None,
        now: int,
        ov: Overlay,
        secret: str | None = None,
        expires_at: int | None = None,
        rotated_from: str | None = None,
        created_by: str | None = None,
    ) -> Prepared:
        """A new token for ``principal``; ``secret`` is given only for KLIQUE_ADMIN_TOKEN.
        Only its keyed hash is stored (ids.TokenHasher). ``created_by``: a sign-in's
        ``signin:<provider>:<person>`` (identity.mapping), else the caller."""
        token = secret or new_token()
        tid = self.token_ids.next(now)
        rec = TokenRecord(
            tid,
            self.tokens.hash(token),
            principal,
            name,
            now,
            created_by or (p.text if p else "kliqued"),
            expires_at=expires_at,
        )
        data: dict[str, Any] = {"id": tid, "principal": principal, "name": name}
        if expires_at is not None:
            data["expires_at"] = expires_at
        if rotated_from is not None:
            data["rotated_from"] = rotated_from
        ev = Event("token_created", None, rec.created_by, None, None, None, data)

        op = TokenInsert(
            rec.id,
            rec.hash,
            rec.principal,
            rec.name,
            rec.created_at,
            rec.created_by,
            rec.expires_at,
        )

        def apply() -> tuple[TokenRecord, str]:
            self.tokens.add(rec)
            return rec, token

        return Prepared([ev], [op], apply)

    def prepare_signed_in(self, s: SignedIn, via: str, now: int, ov: Overlay) -> Prepared:
        """The audit's record of a sign-in: the provider and subject, whom they act as."""
        return Prepared([self._signed_in_event(s, via, None)], [], lambda: None)

    def _signed_in_event(self, s: SignedIn, via: str, token: str | None) -> Event:
        data: dict[str, Any] = {
            "provider": s.provider,
            "subject": s.subject,
            "principal": s.principal.text,
            "via": via,
        }
        if s.person is not None:
            data["person"] = s.person
        if token is not None:
            data["token"] = token
        return Event("signed_in", None, s.principal.text, None, None, s.person, data)

    def prepare_signin_token(
        self, s: SignedIn, via: str, lifetime_ms: int, now: int, ov: Overlay
    ) -> Prepared:
        """A sign-in that gets a Klique token (``kliqued login``, the dashboard): the audit's
        record and the token, in one commit. The token ends with its lifetime, or at once
        when its person leaves the estate (identity.mapping.signin_refusal)."""
        created = self.prepare_token(
            None,
            s.principal.text,
            f"sign-in through {s.provider}",
            now,
            ov,
            expires_at=now + lifetime_ms,
            created_by=signin_creator(s),
        )
        tid = created.events[0].data["id"]
        created.events.insert(0, self._signed_in_event(s, via, tid))
        return created

    def prepare_revoke(self, p: Principal, token_id: str, now: int, ov: Overlay) -> Prepared:
        rec = self.tokens.by_id.get(token_id)
        if rec is None:
            raise not_found(f"no token {excerpt(token_id, quoted=False)}")
        if rec.revoked_at is not None or token_id in ov.revoked:
            return Prepared()
        ov.revoked.add(token_id)
        ev = Event("token_revoked", None, p.text, None, None, None, {"id": token_id})

        op = TokenUpdate(token_id, "revoked_at_ms", now)

        def apply() -> None:
            rec.revoked_at = now

        return Prepared([ev], [op], apply)

    def prepare_rotate(
        self,
        p: Principal,
        token_id: str,
        grace_ms: int,
        expires_at: int | None,
        now: int,
        ov: Overlay,
    ) -> Prepared:
        """A new secret for the principal of ``token_id`` (same name; the same lifetime
        unless ``expires_at`` is given), and the old token ends: now, or after
        ``grace_ms`` (so the holders can switch without a gap)."""
        old = self.tokens.by_id.get(token_id)
        if old is None:
            raise not_found(f"no token {excerpt(token_id, quoted=False)}")
        why = old.refusal(now)
        if why is not None or token_id in ov.revoked:
            raise ApiError(
                409,
                "conflict",
                f"{why or f'token {token_id} was revoked'}: "
                f"create a new token instead (kliqued token create)",
            )
        ov.revoked.add(token_id)
        if expires_at is None and old.expires_at is not None:
            expires_at = now + (old.expires_at - old.created_at)
        created = self.prepare_token(
            p, old.principal, old.name, now, ov, expires_at=expires_at, rotated_from=token_id
        )
        new_id = created.events[0].data["id"]
        end = now + grace_ms
        if old.expires_at is not None:
            end = min(end, old.expires_at)
        ev = Event(
            "token_rotated",
            None,
            p.text,
            None,
            None,
            None,
            {"id": token_id, "to": new_id, "old_ends_at": end},
        )

        op = (
            TokenUpdate(token_id, "expires_at_ms", end)
            if grace_ms > 0
            else TokenUpdate(token_id, "revoked_at_ms", now)
        )

        def apply() -> tuple[TokenRecord, str, TokenRecord]:
            if grace_ms > 0:
                old.expires_at = end
            else:
                old.revoked_at = now
            rec, token = created.apply()
            return rec, token, old

        return Prepared(created.events + [ev], created.ops + [op], apply)
