"""A cloud pool's spend cap and node prices (autoscale.spend_cap, autoscale.node_prices):
compiled as decimal text, checked with positions, and absent from the canonical JSON when
unset (an estate without them keeps its revision)."""

from __future__ import annotations

import json

from .helpers import codes, compile_text

BASE = """\
pools:
  - name: burst
    kind: cloud
    gpu_type: {gpu_type}
    autoscale:
      max: 8
{extra}
profiles:
  - {{name: gpu1, gpus: 1, pools: [burst], policies: [team-a]}}
policies:
  - {{name: team-a, group: team-a, reservation: 0, limit: 8}}
groups:
  - {{name: team-a, users: [alice]}}
pricing:
  - {{gpu_type: l40s, per_gpu_hour: 1.25, effective_from: "2026-01-01T00:00:00Z"}}
"""


def estate(extra: str = "", gpu_type: str = "l40s"):
    return compile_text(BASE.format(extra=extra, gpu_type=gpu_type))


def test_spend_cap_and_node_prices_compile_as_decimal_text():
    res = estate(
        "      spend_cap: 2500.50\n"
        "      node_prices:\n"
        "        - {instance_type: g6e.xlarge, on_demand: 1.861, spot: 0.70}\n"
        "        - {instance_type: g6e.12xlarge, on_demand: 10.49}\n"
    )
    assert res.estate is not None, res.diagnostics
    a = res.estate.pool("burst").autoscale
    assert a.spend_cap == "2500.5"
    assert [(n.instance_type, n.on_demand, n.spot) for n in a.node_prices] == [
        ("g6e.xlarge", "1.861", "0.7"),
        ("g6e.12xlarge", "10.49", None),
    ]
    body = json.loads(res.estate.canonical_json())
    assert body["pools"][0]["autoscale"]["spend_cap"] == "2500.5"


def test_unset_they_leave_the_canonical_json_and_revision_alone():
    res = estate()
    assert res.estate is not None
    auto = json.loads(res.estate.canonical_json())["pools"][0]["autoscale"]
    assert auto == {"max_milli": 8000, "idle_timeout_s": 600, "spot_first": True}


def test_a_type_priced_twice_is_an_error_at_its_line():
    res = estate(
        "      node_prices:\n"
        "        - {instance_type: g6e.xlarge, on_demand: 1.861}\n"
        "        - {instance_type: g6e.xlarge, on_demand: 2}\n"
    )
    assert res.estate is None and codes(res) == ["duplicate-price"]
    d = res.diagnostics[0]
    assert "instance type 'g6e.xlarge' is priced twice" in d.message
    assert (d.pos.line, d.pos.col) == (9, 27)  # the second one's instance_type


def test_a_cap_needs_a_price():
    res = estate("      spend_cap: 100\n", gpu_type="h100")
    assert res.estate is None
    errors = [d for d in res.diagnostics if d.severity == "error"]
    assert [d.code for d in errors] == ["missing-price"]
    assert "autoscale.spend_cap needs the price of a node" in errors[0].message
    assert errors[0].pos.line == 7
    # node prices are enough
    ok = estate(
        "      spend_cap: 100\n      node_prices: [{instance_type: x, on_demand: 3}]\n",
        gpu_type="h100",
    )
    assert ok.estate is not None


def test_bad_values_name_the_field():
    res = estate("      spend_cap: -5\n")
    assert res.estate is None
    assert any("spend_cap" in d.message and "must be >= 0" in d.message for d in res.diagnostics), [
        d.message for d in res.diagnostics
    ]
    res = estate("      node_prices: [{instance_type: 'bad type', on_demand: 1}]\n")
    assert res.estate is None and any("instance_type" in d.message for d in res.diagnostics)
