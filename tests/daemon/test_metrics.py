"""``GET /metrics`` (issue 13, item 2): a real ``kliqued serve`` scraped over HTTP and parsed
with Prometheus's own text parser; who may read it; the docs and the Grafana dashboard name
only metrics that exist."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.daemon.fleet import FleetServer, HttpWorker
from tests.harness import promtool
from tests.harness.inproc import InProcServer
from tests.harness.daemon import ROOT, Server
from tests.harness.wait import wait_for

CMD = {"command": ["true"]}
DOCS = ROOT / "docs"


def scrape(s: Server, token: str | None = None) -> dict[str, Any]:
    """The metrics as {family name: {sample name and sorted labels: value}}."""
    status, text = s.call("GET", "/metrics", token=token or s.token("role:planner"))
    assert status == 200, text
    out: dict[str, Any] = {}
    for fam in text_string_to_metric_families(text):
        out[fam.name] = {
            (smp.name, tuple(sorted(smp.labels.items()))): smp.value for smp in fam.samples
        }
    return out


def value(m: dict[str, Any], family: str, sample: str | None = None, **labels: str) -> float:
    """The one sample of ``family`` (``sample``: its ``_total``/``_count`` name) whose labels
    include ``labels``."""
    hits = [
        v
        for (name, lab), v in m[family].items()
        if name == (sample or family) and labels.items() <= dict(lab).items()
    ]
    assert len(hits) == 1, (family, labels, m[family])
    return hits[0]


def last_seq(s: Server) -> int:
    events = s.ok("GET", "/v1/events?limit=1000")["events"]
    return events[-1]["seq"]


@pytest.fixture(scope="module")
def busy(tmp_path_factory) -> Iterator[Server]:
    """The small estate with work placed, queued and reclaimed: team-a fills pool-1 (4
    GPUs, 2 of them above its reservation), then team-b takes its reservation back."""
    s = InProcServer(tmp_path_factory.mktemp("metrics")).start()
    bob, erin = s.token("bob"), s.token("erin")
    a = [s.ok("POST", "/v1/tasks", {"resource": "team-a/one", **CMD}, bob)["id"] for _ in range(4)]
    wait_for(lambda: all(s.ok("GET", f"/v1/tasks/{t}")["state"] == "placed" for t in a))
    s.borrowing = scrape(s)  # type: ignore[attr-defined]
    for _ in range(3):
        s.ok("POST", "/v1/tasks", {"resource": "team-b/one", **CMD}, erin)
    wait_for(
        lambda: sum(t["preemptions"] for t in s.ok("GET", "/v1/tasks?limit=100")["tasks"]) == 2,
        10,
        "the reclaim",
    )
    yield s
    assert s.stop() == 0, s.log()


def test_pools_queues_and_preemptions_match_the_state(busy: Server) -> None:
    before = busy.borrowing  # type: ignore[attr-defined]
    assert value(before, "klique_pool_used_gpus", pool="pool-1") == 4
    assert value(before, "klique_pool_borrowed_gpus", pool="pool-1") == 2
    wait_for(
        lambda: value(scrape(busy), "klique_queue_depth", resource="team-b/one") == 1,
        5,
        "team-b's third task queued",
    )
    m = scrape(busy)
    tasks = busy.ok("GET", "/v1/tasks?limit=100")["tasks"]
    # Pool used equals the GPUs placed on it; capacity is the estate's.
    for pool, cap in (("pool-1", 4), ("pool-2", 8)):
        placed = sum(t["gpus"] for t in tasks if t["state"] == "placed" and t["pool"] == pool)
        assert value(m, "klique_pool_used_gpus", pool=pool) == placed
        assert (
            value(
                m,
                "klique_pool_capacity_gpus",
                pool=pool,
                kind=("kubernetes" if pool == "pool-1" else "baremetal"),
            )
            == cap
        )
        assert value(m, "klique_pool_free_gpus", pool=pool) == cap - placed
    assert value(m, "klique_pool_used_gpus", pool="pool-1") == 4
    assert value(m, "klique_pool_borrowed_gpus", pool="pool-1") == 0  # reclaimed
    # Queue depth equals the tasks queued on each compute resource, as the API lists them.
    for r in busy.ok("GET", "/v1/resources")["resources"]:
        queued = [t for t in tasks if t["state"] == "queued" and t["resource"] == r["name"]]
        assert value(m, "klique_queue_depth", resource=r["name"], group=r["group"]) == len(queued)
        wait = value(m, "klique_queue_oldest_wait_seconds", resource=r["name"])
        assert (wait > 0) == bool(queued), (r["name"], wait)
    assert value(m, "klique_queue_depth", resource="team-a/one") == 2  # the reclaimed two
    # Counters: where it happened.
    assert (
        value(
            m, "klique_preemptions", "klique_preemptions_total", reason="reclaimed", pool="pool-1"
        )
        == 2
    )
    assert value(m, "klique_submissions", "klique_submissions_total", resource="team-a/one") == 4
    assert value(m, "klique_submissions", "klique_submissions_total", resource="team-b/one") == 3
    assert value(m, "klique_pass_duration_seconds", "klique_pass_duration_seconds_count") >= 2
    # every committed event counted (read twice: an event may commit between the reads)
    wait_for(
        lambda: (
            value(scrape(busy), "klique_events_committed", "klique_events_committed_total")
            == last_seq(busy)
        ),
        5,
        "the committed events' counter at the log's last event",
    )


@pytest.mark.skipif(promtool.PROMTOOL is None, reason=promtool.MISSING)
def test_promtool_accepts_the_metrics(busy: Server) -> None:
    """What operators run on a scrape: ``promtool check metrics`` (naming, base units,
    help and type lines) finds nothing, on an estate with budgets, reclaims and queues
    (under ``order: fair``: tests/daemon/test_lending_views.py)."""
    status, text = busy.call("GET", "/metrics", token=busy.token("role:planner"))
    assert status == 200 and "klique_budget_seconds" in text
    assert promtool.problems(text) == ""


def test_budgets_estate_and_engine(busy: Server) -> None:
    pol = {p["name"]: p for p in busy.ok("GET", "/v1/policies")["policies"]}
    m = scrape(busy)
    # in seconds, Prometheus' base unit (promtool refuses hours)
    assert value(m, "klique_budget_seconds", policy="team-a", period="month") == 1000 * 3600
    used = value(m, "klique_budget_used_seconds", policy="team-a")
    left = value(m, "klique_budget_left_seconds", policy="team-a")
    assert used > 0 and used + left == pytest.approx(1000 * 3600)
    # the API's figure (hours, rounded), read a moment earlier
    assert used / 3600 >= pol["team-a"]["budget"]["used_hours"] - 1e-4
    assert value(m, "klique_budget_burn_rate", policy="team-a") == 2  # two 1-GPU tasks
    assert not [k for k in m["klique_budget_seconds"] if dict(k[1])["policy"] == "team-b"]
    assert value(m, "klique_policy_used_gpus", policy="team-b", group="team-b") == 2
    assert value(m, "klique_policy_reservation_gpus", policy="team-a") == 2
    assert value(m, "klique_policy_limit_gpus", policy="team-a") == 10
    health = busy.ok("GET", "/v1/health", token=None)
    assert value(m, "klique_estate_info", revision=health["revision"]) == 1
    assert value(m, "klique_engine_enabled") == 1
    assert m["klique_estate_refused"] == {}
    assert value(m, "klique_workers", pool="pool-1", state="alive") == 0


def test_the_one_daemon_of_a_duckdb_file_leads(busy: Server) -> None:
    """Every daemon says its part (docs/ha.md); a DuckDB file's is the leader, without a
    lease or a replica (their families are there, empty), and its process is measured."""
    m = scrape(busy)
    assert value(m, "klique_leader") == 1
    assert m["klique_lease_epoch"] == {} and m["klique_replica_lag_events"] == {}
    assert value(m, "process_resident_memory_bytes") > 0
    assert value(m, "process_cpu_seconds", "process_cpu_seconds_total") > 0


def test_who_may_read_the_metrics(busy: Server) -> None:
    status, body = busy.call("GET", "/metrics", token=None)
    assert status == 401 and body["error"]["code"] == "unauthenticated"
    for who in ("bob", "alice", "role:finance"):
        status, body = busy.call("GET", "/metrics", token=busy.token(who))
        assert status == 403, (who, body)
        assert "admin, planner" in body["error"]["message"]
    worker = busy.token({"worker": True, "pool": "pool-1"})
    assert busy.call("GET", "/metrics", token=worker)[0] == 403
    for token in (busy.admin, busy.token("role:planner")):
        status, text = busy.call("GET", "/metrics", token=token)
        assert status == 200 and "klique_queue_depth{" in text


def test_workers_by_state_and_a_lost_workers_preemption(tmp_path: Path) -> None:
    s = FleetServer(tmp_path, ttl="1s").start()
    try:
        wt = s.token({"worker": True, "pool": "bare"})
        w1, w2 = HttpWorker(s, wt, "w-1"), HttpWorker(s, wt, "w-2")
        w1.register()
        w2.register()
        m = scrape(s)
        assert value(m, "klique_workers", pool="bare", state="alive") == 2
        assert value(m, "klique_workers", pool="other", state="alive") == 0
        assert value(m, "klique_pool_takes_work", pool="bare") == 1
        assert value(m, "klique_pool_takes_work", pool="other") == 0
        tid = s.submit(s.token("erin"), "team-b/one", ["sleep", "100"])
        wait_for(lambda: s.task(tid)["state"] == "placed")
        lease = w1.lease()[0]
        assert w1.report(tid, lease["epoch"], "started")[0] == 200

        def lost() -> bool:  # w-2 keeps beating, w-1 is silent
            w2.heartbeat([])
            return s.task(tid)["preemptions"] == 1

        wait_for(lost, 8, "w-1 declared lost")
        w2.heartbeat([])
        m = scrape(s)
        assert value(m, "klique_workers", pool="bare", state="lost") == 1
        assert value(m, "klique_workers", pool="bare", state="alive") == 1
        assert (
            value(m, "klique_preemptions", "klique_preemptions_total", reason="lost", pool="bare")
            == 1
        )
    finally:
        assert s.stop() == 0, s.log()


METRIC = re.compile(r"\bklique_[a-z_]+")
SUFFIXES = ("_bucket", "_count", "_sum", "_total")


def families(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def test_the_docs_and_the_dashboard_name_only_metrics_that_exist(busy: Server) -> None:
    scraped = set(scrape(busy))
    exposed = {n for n in scraped if METRIC.fullmatch(n)}
    doc = (DOCS / "metrics.md").read_text()
    listed = {families(n) for n in METRIC.findall(doc)}
    assert listed == exposed, listed ^ exposed  # every metric documented, none invented
    # the rest is prometheus_client's process collector, documented as such
    assert scraped - exposed and all(n.startswith("process_") for n in scraped - exposed)
    assert "`process_*`" in doc
    text = (DOCS / "grafana-dashboard.json").read_text()
    dash = json.loads(text)
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 8 and all(METRIC.search(e) for e in exprs)
    used = {families(n) for n in METRIC.findall(text)}  # targets and template variables
    assert used and used <= exposed, used - exposed
    assert {
        "klique_pool_used_gpus",
        "klique_queue_depth",
        "klique_budget_left_seconds",
        "klique_pass_duration_seconds",
        "klique_preemptions",
        "klique_workers",
    } <= used
    assert "metrics.md" in (ROOT / "README.md").read_text()
