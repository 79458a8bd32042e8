"""Alerts that reach people (issue 13, item 3): a real daemon delivers a lost worker's alert
to local receivers (a signed JSON webhook, a Slack-shaped one, an SMTP server), retried with
backoff, exactly once per channel, recorded in the event log, and again after a restart."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.fleet import ESTATE, FleetServer, HttpWorker, write_estate
from tests.daemon.receivers import HttpReceiver, SmtpReceiver
from tests.harness.wait import wait_for

SECRET = "test-alert-secret-0123456789"


def alert_estate(tmp: Path, channels: str) -> Path:
    settings = (
        ESTATE["settings.yaml"]
        + f"""\
  alerts:
    contacts: {{erin: erin@example.org, walter: walter@example.org}}
    it: [it@example.org]
    waiting_after: 2s
    channels:
{channels}"""
    )
    return write_estate(tmp / "estate", {**ESTATE, "settings.yaml": settings})


def start(tmp: Path, channels: str, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> FleetServer:
    monkeypatch.setenv("KLIQUE_TEST_ALERT_SECRET", SECRET)
    s = FleetServer(tmp, estate=alert_estate(tmp, channels), **kw).start()
    s.wt = s.token({"worker": True, "pool": "bare"})  # type: ignore[attr-defined]
    return s


def lose_a_worker(s: FleetServer, wid: str = "w-1") -> dict:
    """A worker registers and goes silent: after the TTL (1.5 s) it is lost."""
    HttpWorker(s, s.wt, wid).register()  # type: ignore[attr-defined]
    wait_for(lambda: s.events(kind="worker_lost"), 10, "the worker declared lost")
    return s.events(kind="worker_lost")[-1]


def deliveries(s: FleetServer, channel: str) -> list[dict]:
    return [e["data"] for e in s.events(kind="alert_delivery") if e["data"]["channel"] == channel]


def stop(s: FleetServer) -> None:
    log = s.log()
    assert s.stop() == 0, log
    assert "Traceback" not in log, log


def test_a_webhook_failing_twice_gets_the_alert_once_signed(tmp_path, monkeypatch) -> None:
    hook, slack = HttpReceiver(fail=2).start(), HttpReceiver().start()
    s = start(
        tmp_path,
        f"""\
      - {{name: ops, kind: webhook, url: "{hook.url}", secret_env: KLIQUE_TEST_ALERT_SECRET}}
      - {{name: chat, kind: slack, url: "{slack.url}", to: [it]}}
""",
        monkeypatch,
    )
    try:
        lost = lose_a_worker(s)
        wait_for(
            lambda: any(d["status"] == "delivered" for d in deliveries(s, "ops")),
            15,
            "the webhook delivered",
        )
        wait_for(lambda: deliveries(s, "chat"), 10, "the slack hook delivered")
        time.sleep(1.5)  # nothing more comes
        assert len(hook.got) == 3 and len(hook.ok) == 1
        keys = {r.headers["Idempotency-Key"] for r in hook.got}
        assert keys == {f"klique-alert-{lost['seq']}-ops"}  # the same key on every retry
        r = hook.ok[0]
        ts = r.headers["X-Klique-Timestamp"]
        want = hmac.new(SECRET.encode(), ts.encode() + b"." + r.body, hashlib.sha256)
        assert hmac.compare_digest(r.headers["X-Klique-Signature"], "sha256=" + want.hexdigest())
        body = json.loads(r.body)
        assert body["kind"] == "worker_lost" and body["seq"] == lost["seq"]
        assert "w-1" in body["title"] and body["recipients"] == ["it@example.org"]
        statuses = [(d["attempt"], d["status"]) for d in deliveries(s, "ops")]
        assert statuses == [(1, "failed"), (2, "failed"), (3, "delivered")]
        assert "answered 500" in deliveries(s, "ops")[0]["error"]
        # The Slack shape: a text field, no signature.
        assert len(slack.ok) == 1
        sb = json.loads(slack.ok[0].body)
        assert list(sb) == ["text"] and "w-1" in sb["text"]
        assert "X-Klique-Signature" not in slack.ok[0].headers
    finally:
        stop(s)
        hook.stop()
        slack.stop()


def test_mail_over_smtp(tmp_path, monkeypatch) -> None:
    smtp = SmtpReceiver().start()
    s = start(
        tmp_path,
        f"""\
      - {{name: mail, kind: email, smtp_host: 127.0.0.1, smtp_port: {smtp.port},
         sender: klique@example.org}}
""",
        monkeypatch,
    )
    try:
        lost = lose_a_worker(s)
        wait_for(lambda: deliveries(s, "mail"), 15, "the mail delivered")
        assert deliveries(s, "mail")[-1]["status"] == "delivered"
        assert len(smtp.messages) == 1
        env = smtp.messages[0]
        assert env.mail_from == "klique@example.org"
        assert env.rcpt_tos == ["it@example.org"]
        text = env.content.decode()
        assert "worker lost: w-1" in text
        assert f"klique-alert-{lost['seq']}-mail" in text
    finally:
        stop(s)
        smtp.stop()


def test_a_receiver_that_never_answers_does_not_slow_the_passes(tmp_path, monkeypatch) -> None:
    hang = HttpReceiver(hang=True).start()
    s = start(
        tmp_path,
        f"""\
      - {{name: stuck, kind: webhook, url: "{hang.url}", timeout: 30s}}
""",
        monkeypatch,
    )
    try:
        lose_a_worker(s)
        wait_for(lambda: hang.got, 10, "the stuck receiver reached")
        seen: list[float] = []
        while len(seen) < 5:  # the passes' own times while the delivery hangs
            at = (
                datetime.fromisoformat(
                    s.ok("GET", "/v1/engine")["last_pass_at"].replace("Z", "+00:00")
                ).timestamp()
                * 1000
            )
            if at not in seen:
                seen.append(at)
            time.sleep(0.1)
        gaps = [b - a for a, b in zip(seen[1:], seen[2:])]
        assert all(g <= 1500 for g in gaps), gaps  # pass_interval 1s
        assert not deliveries(s, "stuck")  # still trying: no outcome yet
    finally:
        stop(s)
        hang.stop()


def test_an_undelivered_alert_is_sent_after_a_restart(tmp_path, monkeypatch) -> None:
    down = HttpReceiver(fail=10**6).start()  # fails until the restart
    s = start(
        tmp_path,
        f"""\
      - {{name: ops, kind: webhook, url: "{down.url}", secret_env: KLIQUE_TEST_ALERT_SECRET}}
""",
        monkeypatch,
    )
    try:
        lost = lose_a_worker(s)
        wait_for(lambda: deliveries(s, "ops"), 10, "a failed attempt recorded")
        stop(s)
        down.fail = 0  # the endpoint is back
        n = len(down.got)
        s.start()
        wait_for(
            lambda: any(d["status"] == "delivered" for d in deliveries(s, "ops")),
            15,
            "delivered after the restart",
        )
        assert len(down.ok) == 1 and len(down.got) == n + 1
        assert down.ok[0].headers["Idempotency-Key"] == f"klique-alert-{lost['seq']}-ops"
        stop(s)
        s.start()  # delivered: a further restart sends nothing
        time.sleep(2)
        assert len(down.ok) == 1
    finally:
        stop(s)
        down.stop()


def test_work_waiting_past_the_limit_alerts_the_group_admins(tmp_path, monkeypatch) -> None:
    hook = HttpReceiver().start()
    s = start(
        tmp_path,
        f"""\
      - {{name: ops, kind: webhook, url: "{hook.url}"}}
""",
        monkeypatch,
    )
    try:
        erin = s.token({"user": "erin"})
        tid = s.submit(erin, "team-b/one", ["true"])  # no worker: it waits
        wait_for(lambda: hook.ok, 15, "the waiting alert delivered")
        body = json.loads(hook.ok[0].body)
        assert body["kind"] == "waiting_alert" and body["data"]["task"] == tid
        assert body["recipients"] == ["erin@example.org", "it@example.org"]
        assert body["data"]["waited_s"] >= 2
        # the words people read: a duration as people say it, and why it waits (issue 32)
        assert re.search(r"has waited \d+s since its submission: \S", body["text"]), body
        assert body["data"]["reason"] and body["data"]["reason"] in body["text"]
        assert " s since" not in body["text"] and "waiting for" in body["title"]
        deliveries_said = [
            e for e in s.ok("GET", "/v1/events?kind=alert_delivery&limit=100")["events"]
        ]
        assert deliveries_said and deliveries_said[0]["data"]["channel"] == "ops"
        time.sleep(2)
        assert len(hook.ok) == 1  # once per task
    finally:
        stop(s)
        hook.stop()


def test_a_budget_threshold_reaches_the_group_admins(tmp_path, monkeypatch) -> None:
    hook = HttpReceiver().start()
    policies = ESTATE["policies.yaml"].replace(
        "    reservation: 0\n    limit: 2\n",
        "    reservation: 0\n    limit: 2\n"
        "    budget: {hours: 0.001, period: day, alert_at: [0.5]}\n",
    )  # 3.6 s
    estate = alert_estate(
        tmp_path,
        f"""\
      - {{name: ops, kind: webhook, url: "{hook.url}", to: [admins]}}
""",
    )
    (estate / "policies.yaml").write_text(policies)
    s = FleetServer(tmp_path, estate=estate, ttl="60s").start()
    try:
        wt = s.token({"worker": True, "pool": "bare"})
        w = HttpWorker(s, wt, "w-1")
        w.register()
        erin = s.token({"user": "erin"})
        tid = s.submit(erin, "team-b/one", ["sleep", "60"])
        wait_for(lambda: s.task(tid)["state"] in ("placed", "running"), 10, "placed")
        assert [x["task"] for x in w.lease()] == [tid]
        assert w.report(tid, 1, "started")[0] == 200
        wait_for(lambda: hook.ok, 20, "the budget alert delivered")
        body = json.loads(hook.ok[0].body)
        assert body["kind"] == "alert" and body["group"] == "team-b"
        assert body["title"] == "team-b: budget threshold crossed"
        assert body["recipients"] == ["erin@example.org"]  # to: [admins] only
    finally:
        stop(s)
        hook.stop()
