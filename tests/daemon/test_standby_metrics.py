"""``GET /metrics`` on every daemon of a control plane (issue 18): Prometheus scrapes each
daemon and must see each one's own health, so a standby answers it itself (never a redirect
to the leader) with its own registry: ``klique_leader`` 0, the lease's epoch it saw, its
replica's lag and its process; the leader says ``klique_leader`` 1 and its epoch. Real
daemons on one real PostgreSQL (skipped, saying why, where PostgreSQL is not installed)."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import psycopg
from prometheus_client.parser import text_string_to_metric_families

from tests.daemon.test_failover import leader_epoch, pair
from tests.harness.daemon import Server
from tests.harness.typed import present
from tests.harness.wait import wait_for


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # a 307 stays a 307: who answered is asserted
        return None


def scrape(s: Server, token: str | None) -> tuple[int, dict[str, list], dict[str, str]]:
    """Status, {family: [(labels, value)]} and headers of ``s``'s own answer (redirects are
    not followed)."""
    req = urllib.request.Request(
        f"{s.url}/metrics", headers=({"Authorization": f"Bearer {token}"} if token else {})
    )
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(req, timeout=10) as resp:
            text, status, headers = resp.read().decode(), resp.status, dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, {}, dict(exc.headers)
    fams = {
        f.name: [(s.labels, s.value) for s in f.samples]
        for f in text_string_to_metric_families(text)
    }
    return status, fams, headers


def one(fams: dict[str, list], name: str) -> float | None:
    samples = fams[name]  # the family is there on every daemon, with or without a sample
    assert len(samples) <= 1, samples
    return samples[0][1] if samples else None


def test_each_daemon_answers_its_own_metrics(tmp_path: Path, pg_url: str) -> None:
    a, b = pair(tmp_path, pg_url)
    try:
        planner = a.token("role:planner")
        a.ok("POST", "/v1/tasks", {"resource": "team-a/one", "command": ["true"]}, a.token("bob"))
        # the standby answers itself, once it has read the tokens to check the scrape's with
        wait_for(lambda: scrape(b, planner)[0] == 200, 15, "the standby's own /metrics")
        status, fams, headers = scrape(b, planner)
        assert headers.get("X-Klique-Role") == "standby"
        assert one(fams, "klique_leader") == 0
        assert one(fams, "klique_lease_epoch") == 1 == leader_epoch(pg_url)
        lag = one(fams, "klique_replica_lag_events")
        assert lag is not None and lag >= 0
        wait_for(
            lambda: one(scrape(b, planner)[1], "klique_replica_lag_events") == 0,
            10,
            "the standby's replica to follow the log",
        )
        # its process, not the leader's
        assert present(one(fams, "process_resident_memory_bytes")) > 0
        assert one(fams, "process_start_time_seconds") is not None
        # only its own health: the state's gauges are the leader's (a standby repeating them
        # would double every sum across the daemons)
        assert "klique_queue_depth" not in fams and "klique_pool_used_gpus" not in fams
        # its own token checks, as the leader's
        assert scrape(b, None)[0] == 401
        assert scrape(b, "kq_wrong")[0] == 401
        bob = a.token("bob")  # a token the standby learns from the log: 403 once it has
        wait_for(lambda: scrape(b, bob)[0] == 403, 10, "the standby to refuse bob's scrape")
        # the leader: 1, its own epoch, no replica, its state
        status, lead, _ = scrape(a, planner)
        assert status == 200
        assert one(lead, "klique_leader") == 1 and one(lead, "klique_lease_epoch") == 1
        assert one(lead, "klique_replica_lag_events") is None
        assert "klique_queue_depth" in lead and "process_resident_memory_bytes" in lead
        # a clean handover: each says its new part
        assert a.stop() == 0
        b.wait_ready(10)
        status, fams, headers = scrape(b, planner)
        assert status == 200 and "X-Klique-Role" not in headers
        assert one(fams, "klique_leader") == 1 and one(fams, "klique_lease_epoch") == 2
        assert "klique_queue_depth" in fams
        a.start(wait="standby")
        wait_for(lambda: scrape(a, planner)[0] == 200, 15, "the new standby's /metrics")
        fams = scrape(a, planner)[1]
        assert one(fams, "klique_leader") == 0 and one(fams, "klique_lease_epoch") == 2
        # a standby whose state cannot apply the log (an event of a kind it does not know,
        # far ahead) stops following, and its lag keeps growing with the log for all to see
        for seq in (1_000_000, 2_000_000):
            with psycopg.connect(pg_url, autocommit=True) as conn:
                conn.execute(
                    "INSERT INTO events (seq, at_ms, kind, data) VALUES "
                    "(%s, 0, 'no-such-kind', '{}')",
                    [seq],
                )
            wait_for(
                lambda: (one(scrape(a, planner)[1], "klique_replica_lag_events") or 0) > seq - 1000,
                10,
                "the stuck standby's lag to show",
            )
    finally:
        for s in (a, b):
            s.stop()
