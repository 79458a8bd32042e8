"""Every task records its channel beside its user (issue 14, part 5): in its submitted event,
its API view, the ledger and the usage views finance reads. A client declares only ``cli`` or
``sdk`` (``X-Klique-Channel``), nothing is ``api``; the server-side channels are the daemon's
to set; an event log from before channels replays its tasks as ``api``."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from kliqued.sdk import Client
from tests.harness.daemon import Server
from tests.harness.wait import wait_for

CMD = {"command": ["true"]}
HEADER = "X-Klique-Channel"


def _submit(s: Server, token: str, channel: str | None = None) -> tuple[int, dict]:
    headers = {HEADER: channel} if channel is not None else None
    return s.call("POST", "/v1/tasks", {"resource": "team-a/one", **CMD}, token, headers=headers)


def _ledger(s: Server, task: str) -> list[tuple]:
    sql = f"SELECT channel, \"user\" FROM usage WHERE task = '{task}'"
    return [tuple(r) for r in s.ok("POST", "/v1/ledger/sql", {"sql": sql})["rows"]]


def _submitted(s: Server, task: str) -> dict:
    events = s.ok("GET", f"/v1/events?task={task}&kind=submitted")["events"]
    assert len(events) == 1
    return events[0]


@pytest.mark.parametrize("channel, want", [(None, "api"), ("cli", "cli"), ("sdk", "sdk")])
def test_the_channel_a_client_declares_is_recorded_everywhere(
    server: Server, who, channel, want
) -> None:
    status, t = _submit(server, who.bob, channel)
    assert status == 201, t
    assert t["channel"] == want and t["user"] == "bob"
    assert server.ok("GET", f"/v1/tasks/{t['id']}", token=who.bob)["channel"] == want
    assert _submitted(server, t["id"])["data"]["channel"] == want
    wait_for(lambda: _ledger(server, t["id"]), timeout=10)  # placed: an interval opened
    assert _ledger(server, t["id"]) == [(want, "bob")]
    month = server.ok(
        "POST",
        "/v1/ledger/sql",
        {
            "sql": (
                f"SELECT channel FROM usage_monthly WHERE \"user\" = 'bob' AND channel = '{want}'"
            )
        },
    )["rows"]
    assert month, "usage_monthly has the channel as a dimension"
    server.ok(
        "POST",
        f"/v1/tasks/{t['id']}/cancel",
        token=who.bob,
        headers={HEADER: channel} if channel else None,
    )
    cancel = server.ok("GET", f"/v1/events?task={t['id']}&kind=cancelled")["events"]
    assert cancel[0]["data"]["channel"] == want and cancel[0]["actor"] == "user:bob"


@pytest.mark.parametrize("value", ["mcp", "schedule", "pipeline", "session", "API", "curl", ""])
def test_a_client_cannot_declare_another_channel(server: Server, who, value: str) -> None:
    before = server.ok("GET", "/v1/tasks?user=bob&limit=1000", token=who.bob)["tasks"]
    status, body = _submit(server, who.bob, value)
    assert status == 400, body
    msg = body["error"]["message"]
    assert HEADER in msg and "cli or sdk" in msg
    if value == "mcp":
        assert "set by the daemon itself" in msg
    after = server.ok("GET", "/v1/tasks?user=bob&limit=1000", token=who.bob)["tasks"]
    assert len(after) == len(before)  # nothing submitted


def test_the_sdk_and_the_cli_declare_theirs(server: Server, who) -> None:
    sdk = Client(server.url, who.bob)
    assert sdk.submit("team-a/one", ["true"])["channel"] == "sdk"
    cli = Client(server.url, who.bob, channel="cli")
    assert cli.submit("team-a/one", ["true"])["channel"] == "cli"


def test_an_event_log_from_before_channels_replays_as_api(tmp_path: Path) -> None:
    s = Server(tmp_path).start()
    bob = s.token({"user": "bob"})
    status, t = _submit(s, bob, "cli")
    assert status == 201
    wait_for(lambda: _ledger(s, t["id"]), timeout=10)
    assert s.stop() == 0
    # the log and the ledger as a daemon from before channels wrote them
    conn = duckdb.connect(str(s.db))
    rows = conn.execute(
        "SELECT seq, data FROM events WHERE kind IN ('submitted', 'cancelled')"
    ).fetchall()
    for seq, data in rows:
        d = json.loads(data)
        d.pop("channel", None)
        conn.execute("UPDATE events SET data = ? WHERE seq = ?", [json.dumps(d), seq])
    conn.execute("DROP VIEW IF EXISTS usage_by_department")
    for v in (
        "usage_by_business_unit",
        "usage_by_level",
        "usage_monthly",
        "usage_by_month",
        "usage_priced",
        "usage",
    ):
        conn.execute(f"DROP VIEW IF EXISTS {v}")
    conn.execute("ALTER TABLE ledger DROP COLUMN channel")
    conn.execute("ALTER TABLE ledger_monthly_pending DROP COLUMN channel")
    conn.execute("DROP TABLE ledger_monthly")
    conn.execute("DELETE FROM snapshots")  # a database from before had none: a full replay
    conn.close()
    s.start()
    assert s.ok("GET", f"/v1/tasks/{t['id']}", token=bob)["channel"] == "api"
    # the ledger's row from before keeps no channel (NULL, docs/ledger.md); the monthly
    # views finance reads count it as sent through the API
    assert _ledger(s, t["id"]) == [(None, "bob")]
    month = s.ok(
        "POST",
        "/v1/ledger/sql",
        {"sql": ("SELECT DISTINCT channel FROM usage_monthly WHERE \"user\" = 'bob'")},
    )["rows"]
    assert month == [["api"]]
    # and a new task after the upgrade records its own
    status, t2 = _submit(s, bob, "sdk")
    assert t2["channel"] == "sdk"
    wait_for(lambda: _ledger(s, t2["id"]), timeout=10)
    assert _ledger(s, t2["id"]) == [("sdk", "bob")]
    assert s.stop() == 0
