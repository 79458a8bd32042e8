"""Cloud nodes, their spend and the spend cap, on a real ``kliqued serve`` (kliqued/daemon/
cloud.py): what the autoscaler records, what GET /v1/pools and the ledger show, the alert,
and a restart that rebuilds the same spend from the event log."""

from __future__ import annotations

import shutil
import time
from decimal import Decimal
from pathlib import Path

import pytest

from tests.harness.daemon import Server
from tests.harness.wait import wait_for

ESTATE = Path(__file__).resolve().parents[1] / "autoscaler" / "estate"
POOLS = """\
pools:
  - name: burst
    kind: cloud
    gpu_type: l40s-48gb
    autoscale:
      max: 2
      idle_timeout: 2s
      spend_cap: 20
      node_prices:
        - {instance_type: g6e.xlarge, on_demand: 36000, spot: 18000}   # 10/s and 5/s
    settings:
      node_gpus: "1"
  - {name: onprem, kind: baremetal, capacity: 1, gpu_type: l40s-48gb}
"""
NODE = {
    "node": "i-0abc",
    "provider": "ec2",
    "instance_type": "g6e.xlarge",
    "lifecycle": "spot",
    "gpus": 1,
}


@pytest.fixture
def srv(tmp_path):
    estate = tmp_path / "estate"
    shutil.copytree(ESTATE, estate)
    (estate / "pools.yaml").write_text(POOLS)
    s = Server(tmp_path, estate=estate).start()
    yield s
    s.stop()


def cloud(srv) -> dict:
    (pool,) = [p for p in srv.ok("GET", "/v1/pools")["pools"] if p["name"] == "burst"]
    return pool["cloud"]


def kinds(srv) -> list[str]:
    return [e["kind"] for e in srv.ok("GET", "/v1/events?limit=1000")["events"]]


def test_nodes_spend_cap_alert_ledger_and_restart(srv):
    assert cloud(srv) == {
        "month": time.strftime("%Y-%m", time.gmtime()),
        "currency": "EUR",
        "spent": "0",
        "spend_cap": "20",
        "capped": False,
        "nodes": [],
        "scaling": None,
    }
    assert (
        "cloud" not in [p for p in srv.ok("GET", "/v1/pools")["pools"] if p["name"] == "onprem"][0]
    )
    node = srv.ok("POST", "/v1/pools/burst/nodes", NODE, expect=201)
    assert (node["node"], node["per_hour"], node["lifecycle"]) == ("i-0abc", "18000", "spot")
    again = srv.ok("POST", "/v1/pools/burst/nodes", NODE, expect=200)  # a retry
    assert again == node
    # an on-demand node of a type not in node_prices: its GPUs x the gpu_type's price (1.0)
    od = srv.ok(
        "POST",
        "/v1/pools/burst/nodes",
        {
            **NODE,
            "node": "i-0def",
            "gpus": 4,
            "instance_type": "g6e.12xlarge",
            "lifecycle": "on-demand",
        },
        expect=201,
    )
    assert od["per_hour"] == "4"
    c = cloud(srv)
    assert [n["node"] for n in c["nodes"]] == ["i-0abc", "i-0def"] and not c["capped"]
    # 5/s on the spot node: the cap of 20 is reached within about 4 s
    wait_for(lambda: cloud(srv)["capped"], 15, "the spend to reach the cap")
    assert Decimal(cloud(srv)["spent"]) >= 20
    # the autoscaler says work waits on the cap: logged once, alerted once this month
    body = {"cause": "spend_cap", "reason": "spend cap reached", "waiting": 1}
    c = srv.ok("POST", "/v1/pools/burst/scaling", body)
    assert c["scaling"]["cause"] == "spend_cap" and c["scaling"]["waiting"] == 1
    srv.ok("POST", "/v1/pools/burst/scaling", {**body, "waiting": 2})
    assert kinds(srv).count("scaling_waits") == 1
    assert kinds(srv).count("spend_cap_reached") == 1
    (alert,) = [e for e in srv.ok("GET", "/v1/events?kind=spend_cap_reached")["events"]]
    assert alert["data"]["pool"] == "burst" and alert["data"]["spend_cap"] == "20"
    assert cloud(srv)["scaling"]["waiting"] == 2
    metrics = srv.ok("GET", "/metrics")
    assert 'klique_cloud_spend_cap{currency="EUR",pool="burst"} 20.0' in metrics
    assert 'klique_cloud_nodes{lifecycle="spot",pool="burst"} 1.0' in metrics
    assert 'klique_cloud_nodes{lifecycle="on-demand",pool="burst"} 1.0' in metrics
    assert 'klique_cloud_waiting_tasks{cause="spend_cap",pool="burst"} 2.0' in metrics
    assert 'klique_cloud_waiting_tasks{cause="capacity",pool="burst"} 0.0' in metrics
    spent = next(
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("klique_cloud_spend{")
    )
    assert spent >= 20
    # released: the intervals close; the ledger's cost is GET /v1/pools' spent
    srv.ok("DELETE", "/v1/pools/burst/nodes/i-0abc?reason=idle")
    srv.ok("DELETE", "/v1/pools/burst/nodes/i-0def?reason=idle")
    assert srv.ok("DELETE", "/v1/pools/burst/nodes/i-0def?reason=again")["end_reason"] == "idle"
    c = cloud(srv)
    assert c["nodes"] == []
    rows = srv.ok(
        "POST",
        "/v1/ledger/sql",
        {
            "sql": "SELECT node, lifecycle, instance_type, per_hour, end_reason, hours, cost "
            "FROM cloud_node_usage ORDER BY node"
        },
    )["rows"]
    assert [(r[0], r[1], r[2], r[4]) for r in rows] == [
        ("i-0abc", "spot", "g6e.xlarge", "idle"),
        ("i-0def", "on-demand", "g6e.12xlarge", "idle"),
    ]
    assert sum(Decimal(r[6]) for r in rows) == Decimal(c["spent"])
    monthly = srv.ok(
        "POST",
        "/v1/ledger/sql",
        {"sql": "SELECT pool, lifecycle, nodes, cost FROM cloud_spend_monthly ORDER BY lifecycle"},
    )["rows"]
    assert [(r[0], r[1], r[2]) for r in monthly] == [
        ("burst", "on-demand", 1),
        ("burst", "spot", 1),
    ]
    # a restart rebuilds the same spend and wait from the log; the alert is not raised again
    srv.stop()
    srv.start()
    assert cloud(srv)["spent"] == c["spent"] and cloud(srv)["scaling"]["cause"] == "spend_cap"
    srv.ok("POST", "/v1/pools/burst/scaling", {**body, "reason": "still"})
    assert kinds(srv).count("spend_cap_reached") == 1
    # the wait ends
    assert srv.ok("POST", "/v1/pools/burst/scaling", {"cause": None})["scaling"] is None
    assert kinds(srv).count("scaling_waits") == 3


def test_bad_calls_name_what_is_wrong(srv):
    status, body = srv.call("POST", "/v1/pools/nope/nodes", NODE)
    assert status == 404 and "no pool 'nope'" in body["error"]["message"]
    status, body = srv.call("POST", "/v1/pools/onprem/nodes", NODE)
    assert status == 422 and body["error"]["code"] == "not-autoscaled"
    status, body = srv.call("POST", "/v1/pools/burst/nodes", {**NODE, "lifecycle": "reserved"})
    assert status == 400 and "lifecycle" in body["error"]["message"]
    status, body = srv.call("POST", "/v1/pools/burst/nodes", {**NODE, "gpus": -1})
    assert status == 400 and "gpus" in body["error"]["message"]
    status, body = srv.call("DELETE", "/v1/pools/burst/nodes/i-unknown")
    assert status == 404
    status, body = srv.call("POST", "/v1/pools/burst/scaling", {"cause": "spend_cap"})
    assert status == 400 and "reason" in body["error"]["message"]
    status, body = srv.call("POST", "/v1/pools/burst/scaling", {"cause": "weather", "reason": "x"})
    assert status == 400 and "cause" in body["error"]["message"]
    # an ended node's id is not taken again
    srv.ok("POST", "/v1/pools/burst/nodes", NODE, expect=201)
    srv.ok("DELETE", "/v1/pools/burst/nodes/i-0abc")
    status, body = srv.call("POST", "/v1/pools/burst/nodes", NODE)
    assert status == 409 and "used once" in body["error"]["message"]
    # only admins record nodes
    status, _ = srv.call(
        "POST", "/v1/pools/burst/nodes", {**NODE, "node": "i-x"}, token=srv.token("alice")
    )
    assert status == 403


def test_a_group_admin_sees_no_cloud_nodes_finance_does(srv):
    """Cloud nodes belong to a pool, not to a group: a group admin's ledger (their
    subtree's rows) has none; finance sees them all."""
    srv.ok("POST", "/v1/pools/burst/nodes", NODE, expect=201)
    sql = {"sql": "SELECT count(*) FROM cloud_node_usage"}
    assert srv.ok("POST", "/v1/ledger/sql", sql, token=srv.token("alice"))["rows"] == [[0]]
    assert srv.ok("POST", "/v1/ledger/sql", sql, token=srv.token("role:finance"))["rows"] == [[1]]
    assert srv.ok(
        "POST",
        "/v1/ledger/sql",
        {"sql": "SELECT count(*) FROM cloud_nodes"},
        token=srv.token("alice"),
    )["rows"] == [[0]]
