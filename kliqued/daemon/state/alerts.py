"""Alerts that reach people: the event log's alert-worthy events, delivered to the channels
the estate declares (``settings.alerts``; docs/alerts.md).

Why it is shaped this way:
- The sequencer only *offers* committed rows (``offer``: a non-blocking put on a bounded
  queue); everything slow (HTTP, SMTP, backoff) runs in this module's own tasks with a time
  limit on every call, so a failing or slow endpoint never delays a pass.
- At least once, never twice: each (alert, channel) delivery has an idempotency key, sent
  with it; every attempt's outcome is an ``alert_delivery`` event in the log. After a restart
  the log says what was raised and what was delivered, and only the rest is sent again. A
  queue overflow loses nothing either: the alert is in the log and goes out at the next
  start.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
import smtplib
import time
from dataclasses import dataclass, field
from email.message import EmailMessage
from typing import Any

import aiohttp

from klique_util import fmt

from compiler.compiled import CAlertChannel, CompiledEstate

from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.state.prepared import Prepared
from kliqued.daemon.events import COLUMNS, Event
from kliqued.daemon.state.loop import Sequencer
from kliqued.daemon.storage.store import Store

log = logging.getLogger(__name__)

WAITING = "waiting_alert"
SPEND_CAP = "spend_cap_reached"
CLOCK_STEP = "clock_step"
ALERTING = ("alert", "worker_lost", "estate_refused", WAITING, SPEND_CAP, CLOCK_STEP)
"""Event kinds that are alerts (``alert``: a budget's ``alert_at`` threshold crossed;
``waiting_alert`` [resource, waited_s]: a queue's head waited past ``waiting_after``;
``spend_cap_reached`` [pool, month, spent, spend_cap]: a cloud pool's autoscaler adds no node
this month, cloud.py; ``clock_step`` [direction, step_ms, offset_ms]: the wall clock of the
daemon's machine jumped, clock.py)."""
DELIVERY = "alert_delivery"
FINAL = ("delivered", "given_up")
RESEND_WINDOW_MS = 24 * 3600 * 1000
"""After a restart, undelivered alerts raised within this long are sent again; older ones
are stale news (and an estate that newly declares channels does not flood them)."""


@dataclass(frozen=True, slots=True)
class AlertNote:
    """One alert as people read it."""

    seq: int
    at_ms: int
    kind: str
    group: str | None
    title: str
    text: str
    data: dict[str, Any]


def describe(seq: int, at_ms: int, kind: str, grp: str | None, data: dict[str, Any]) -> AlertNote:
    """The words of an alert, from its event."""
    if kind == "alert":
        used, total = data.get("used_units", 0), data.get("budget_units", 0) or 1
        title = "budget used up" if used >= total else "budget threshold crossed"
        title = f"{data.get('policy')}: {title}"
        text = data.get("text") or title
    elif kind == WAITING:
        waited = fmt.span(int(data.get("waited_s") or 0))
        why = data.get("reason")
        title = f"{data.get('resource')}: work waiting for {waited}"
        text = (
            f"task {data.get('task')} of {data.get('user')} at the head of "
            f"{data.get('resource')} has waited {waited} since its submission"
            + (f": {why}" if why else "")
            + f" (`kliqued queue {data.get('resource')}`)"
        )
    elif kind == SPEND_CAP:
        title = f"cloud spend cap reached: pool {data.get('pool')} ({data.get('month')})"
        text = (
            f"pool {data.get('pool')} spent {data.get('spent')} {data.get('currency')} of "
            f"its {data.get('spend_cap')} {data.get('currency')} cap in "
            f"{data.get('month')}: the autoscaler adds no node until the next month or a "
            f"higher autoscale.spend_cap; {data.get('waiting')} placed task(s) wait "
            f"(`kliqued pools`)"
        )
    elif kind == CLOCK_STEP:
        step_s = abs(int(data.get("step_ms") or 0)) / 1000
        title = f"clock stepped {data.get('direction')} by {step_s:.1f} s"
        text = (
            f"the wall clock of the daemon's machine jumped {data.get('direction')} by "
            f"{step_s:.1f} s; the daemon's time did not jump (it runs on the monotonic "
            f"clock, {int(data.get('offset_ms') or 0) / 1000:+.1f} s off the wall clock, "
            f"and closes the gap slowly): budgets charge the real elapsed time, leases "
            f"and tokens neither expired nor extended by the step. Check the machine's "
            f"time source (NTP, chrony)"
        )
    elif kind == "worker_lost":
        title = f"worker lost: {data.get('worker')} (pool {data.get('pool')})"
        tasks = data.get("tasks") or []
        text = (
            f"worker {data.get('worker')} of pool {data.get('pool')} stopped answering "
            f"(no heartbeat for {data.get('ttl_s')} s); {len(tasks)} task(s) requeued"
        )
    else:
        title = f"estate revision refused: {data.get('revision') or data.get('commit')}"
        errors = data.get("errors") or []
        first = errors[0] if errors else ""
        text = (
            f"the estate from {data.get('source')} was refused with {len(errors)} "
            f"error(s); the running revision stays. {first}"
        ).strip()
    return AlertNote(seq, at_ms, kind, grp, title, str(text), data)


def recipients(estate: CompiledEstate, channel: CAlertChannel, note: AlertNote) -> list[str]:
    """The addresses an alert goes to on ``channel``: the admins of the policy's group (by
    ``settings.alerts.contacts``; an admin without one is left out) and IT, as the channel's
    ``to`` says."""
    alerts = estate.settings.alerts
    if alerts is None:
        return []
    out: list[str] = []
    if "admins" in channel.to and note.group:
        g = estate.group(note.group)
        for user in g.admins if g is not None else []:
            addr = alerts.contacts.get(user)
            if addr and addr not in out:
                out.append(addr)
    if "it" in channel.to:
        out.extend(a for a in alerts.it if a not in out)
    return out


def idempotency_key(seq: int, channel: str) -> str:
    return f"klique-alert-{seq}-{channel}"


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    """``sha256=<hex>`` of HMAC-SHA256(secret, "<timestamp>." + body): the timestamp is
    signed too, so a captured request cannot be replayed later under a new one."""
    mac = hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={mac}"


def _secret(ch: CAlertChannel) -> bytes | None:
    if ch.secret_env:
        value = os.environ.get(ch.secret_env)
        if not value:
            raise DeliveryError(f"the secret's environment variable {ch.secret_env} is not set")
        return value.encode()
    if ch.secret_file:
        try:
            with open(ch.secret_file, "rb") as f:
                return f.read().strip()
        except OSError as exc:
            raise DeliveryError(
                f"cannot read the secret file {ch.secret_file}: {exc.strerror}"
            ) from None
    return None


class DeliveryError(Exception):
    """An attempt failed; the text says why, for the delivery record."""


def payload(note: AlertNote, ch: CAlertChannel, to: list[str], key: str) -> dict[str, Any]:
    if ch.kind == "slack":
        return {"text": f"*{note.title}*\n{note.text}"}
    return {
        "id": key,
        "kind": note.kind,
        "seq": note.seq,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(note.at_ms / 1000)),
        "title": note.title,
        "text": note.text,
        "group": note.group,
        "recipients": to,
        "data": note.data,
    }


async def _post(
    session: aiohttp.ClientSession, note: AlertNote, ch: CAlertChannel, to: list[str], key: str
) -> None:
    body = json.dumps(payload(note, ch, to, key), separators=(",", ":")).encode()
    headers = {"Content-Type": "application/json", "Idempotency-Key": key}
    secret = _secret(ch)
    if secret is not None:
        ts = str(int(time.time()))
        headers["X-Klique-Timestamp"] = ts
        headers["X-Klique-Signature"] = sign(secret, ts, body)
    assert ch.url is not None
    try:
        async with session.post(
            ch.url, data=body, headers=headers, timeout=aiohttp.ClientTimeout(total=ch.timeout_s)
        ) as resp:
            if resp.status // 100 != 2:
                raise DeliveryError(f"{ch.url} answered {resp.status}")
    except asyncio.TimeoutError:
        raise DeliveryError(f"{ch.url} did not answer within {ch.timeout_s} s") from None
    except aiohttp.ClientError as exc:
        raise DeliveryError(f"{ch.url}: {type(exc).__name__}: {exc}") from None


def _mail(note: AlertNote, ch: CAlertChannel, to: list[str], key: str) -> None:
    msg = EmailMessage()
    msg["Subject"] = f"[klique] {note.title}"
    msg["From"] = ch.sender or ""
    msg["To"] = ", ".join(to)
    msg["Message-ID"] = f"<{key}@klique>"  # the idempotency key, where mail can carry it
    msg["X-Klique-Idempotency-Key"] = key
    msg.set_content(f"{note.text}\n\n(alert {note.seq}, {note.kind})\n")
    assert ch.smtp_host is not None
    try:
        with smtplib.SMTP(ch.smtp_host, ch.smtp_port, timeout=ch.timeout_s) as smtp:
            smtp.send_message(msg)
    except (OSError, smtplib.SMTPException) as exc:
        raise DeliveryError(f"smtp {ch.smtp_host}:{ch.smtp_port}: {exc}") from None


@dataclass
class Dispatcher:
    """Delivers alerts from committed events, with retries and exponential backoff."""

    d: Daemon
    seq: Sequencer
    store: Store
    queue_size: int = 1000
    backoff_s: float = 0.5
    max_backoff_s: float = 300.0
    max_attempts: int = 12
    concurrency: int = 8
    _queue: asyncio.Queue = field(init=False)
    _done: set[tuple[int, str]] = field(default_factory=set)
    _tasks: set[asyncio.Task] = field(default_factory=set)
    _waited: set[str] = field(default_factory=set)
    """Tasks a waiting alert was raised for (from the log at start): once per task."""

    def __post_init__(self) -> None:
        self._queue = asyncio.Queue(self.queue_size)
        self._sem = asyncio.Semaphore(self.concurrency)
        self._session: aiohttp.ClientSession | None = None

    def offer(self, rows: list[tuple]) -> None:
        """Called by the sequencer after each commit: never blocks, never raises."""
        for row in rows:
            if row[2] in ALERTING:
                try:
                    self._queue.put_nowait(row)
                except asyncio.QueueFull:
                    log.warning(
                        "alert %d not queued (queue full): it is sent after the next restart",
                        row[0],
                    )

    async def load(self, now_ms: int) -> int:
        """Queues what the log raised and did not deliver (recent ones only)."""

        def read(cur: Any) -> tuple[list[tuple], list[tuple], list[tuple]]:
            cur.execute(
                f"SELECT {', '.join(COLUMNS)} FROM events WHERE list_contains(?, kind) "
                "AND at_ms >= ? ORDER BY seq",
                [list(ALERTING), now_ms - RESEND_WINDOW_MS],
            )
            raised = cur.fetchall()
            cur.execute("SELECT data FROM events WHERE kind = ?", [DELIVERY])
            delivered = cur.fetchall()
            cur.execute("SELECT task FROM events WHERE kind = ?", [WAITING])
            return raised, delivered, cur.fetchall()

        raised, deliveries, waited = await self.store.read(read)
        self._waited.update(t for (t,) in waited)
        for (text,) in deliveries:
            data = json.loads(text)
            if data.get("status") in FINAL:
                self._done.add((int(data["alert"]), data["channel"]))
        for row in raised:
            self.offer([row])
        return len(raised)

    async def run(self) -> None:
        self._session = aiohttp.ClientSession()
        try:
            while True:
                row = await self._queue.get()
                self._start(row)
        finally:
            for t in list(self._tasks):
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._session.close()

    async def watch_waits(self) -> None:
        """Raises a ``waiting_alert`` for each queue head, never placed, that has waited
        past ``waiting_after``: read from the live state between the sequencer's steps,
        recorded through it like any change."""
        while True:
            alerts = self.d.idx().estate.settings.alerts if self.d.index is not None else None
            after = alerts.waiting_after_s if alerts is not None else None
            await asyncio.sleep(min(max(1.0, (after or 60) / 4), 30.0))
            if not after or self.d.state is None:
                continue
            now = self.d.clock.now()
            raise_for = []
            for name, q in self.d.st().queues.items():
                t = q.head()
                if (
                    t is not None
                    and not t.ran_before
                    and t.id not in self._waited
                    and now - t.submitted_at >= after * 1000
                ):
                    self._waited.add(t.id)
                    rec = self.d.records.get(t.id)
                    why = self.d.reason(rec) if rec is not None else None
                    raise_for.append(
                        Event(
                            WAITING,
                            t.id,
                            "kliqued",
                            self.d.estate.revision,
                            t.group,
                            t.user,
                            {
                                "resource": name,
                                "task": t.id,
                                "user": t.user,
                                "waited_s": (now - t.submitted_at) // 1000,
                                **({"reason": why.text} if why is not None else {}),
                            },
                        )
                    )
            if raise_for:
                try:
                    await self.seq.submit(lambda now, ov: Prepared(events=raise_for))
                except Exception as exc:  # stopping, or the store away: raised again later
                    self._waited.difference_update(ev.task for ev in raise_for)
                    log.warning("waiting alerts not recorded: %s", exc)

    def _start(self, row: tuple) -> None:
        alerts = self.d.idx().estate.settings.alerts if self.d.index is not None else None
        if alerts is None:
            return
        data = json.loads(row[8]) if row[8] else {}
        note = describe(row[0], row[1], row[2], row[6], data)
        for ch in alerts.channels:
            if (note.seq, ch.name) in self._done:
                continue
            self._done.add((note.seq, ch.name))  # in flight: never started twice
            t = asyncio.create_task(self._deliver(note, ch))
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    async def _deliver(self, note: AlertNote, ch: CAlertChannel) -> None:
        key = idempotency_key(note.seq, ch.name)
        to = recipients(self.d.idx().estate, ch, note)
        if ch.kind == "email" and not to:
            await self._record(note, ch, key, 0, "given_up", "no recipient has an address")
            return
        delay = self.backoff_s
        for attempt in range(1, self.max_attempts + 1):
            try:
                async with self._sem:
                    if ch.kind == "email":
                        await asyncio.wait_for(
                            asyncio.to_thread(_mail, note, ch, to, key), ch.timeout_s + 1
                        )
                    else:
                        assert self._session is not None
                        await _post(self._session, note, ch, to, key)
            except (DeliveryError, asyncio.TimeoutError) as exc:
                error = str(exc) or f"no answer within {ch.timeout_s} s"
                last = attempt == self.max_attempts
                await self._record(note, ch, key, attempt, "given_up" if last else "failed", error)
                if last:
                    log.error(
                        "alert %d to %s given up after %d attempts: %s",
                        note.seq,
                        ch.name,
                        attempt,
                        error,
                    )
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.max_backoff_s)
                continue
            await self._record(note, ch, key, attempt, "delivered", None)
            return

    async def _record(
        self,
        note: AlertNote,
        ch: CAlertChannel,
        key: str,
        attempt: int,
        status: str,
        error: str | None,
    ) -> None:
        data = {
            "alert": note.seq,
            "channel": ch.name,
            "key": key,
            "attempt": attempt,
            "status": status,
        }
        if error:
            data["error"] = error[:500]
        ev = Event(DELIVERY, None, "kliqued", self.d.estate.revision, note.group, None, data)
        try:
            await self.seq.submit(lambda now, ov: Prepared(events=[ev]))
        except Exception as exc:  # the daemon is stopping: the next start sends it again
            log.warning("alert %d delivery to %s not recorded: %s", note.seq, ch.name, exc)
