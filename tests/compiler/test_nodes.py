"""Node shapes (issue 15): the compiler ties a pool's capacity to its machines and a profile's
size to the machines it may land on; submission refuses what no machine could ever hold."""

from __future__ import annotations

import pytest

from kliqued.engine import EstateIndex, State
from kliqued.engine.errors import SubmissionError

from .helpers import compile_text

BASE = """\
pools:
  - {{name: fra, kind: baremetal, capacity: {cap}, gpu_type: h100, nodes: {nodes}}}
  - {{name: ams, kind: baremetal, capacity: 8, gpu_type: h100}}
profiles:
  - {{name: p, gpus: {gpus}, pools: {pools}, policies: [team]{extra}}}
policies:
  - {{name: team, group: team, reservation: 0, limit: 64}}
groups:
  - {{name: team, users: [ann]}}
pricing:
  - {{gpu_type: h100, per_gpu_hour: 2.5, effective_from: "2026-01-01T00:00:00Z"}}
"""


def estate(cap=16, nodes="{count: 2, gpus: 8}", gpus="8", pools="[fra]", extra=""):
    return compile_text(BASE.format(cap=cap, nodes=nodes, gpus=gpus, pools=pools, extra=extra))


def diag(result, code):
    found = [d for d in result.diagnostics if d.code == code]
    assert found, [d.render() for d in result.diagnostics]
    return found[0]


def test_nodes_compile_into_the_pool_and_leave_other_revisions_alone() -> None:
    r = estate(nodes="[{count: 1, gpus: 8}, {count: 2, gpus: 4}]")
    assert r.ok, [d.render() for d in r.diagnostics]
    fra = next(p for p in r.estate.pools if p.name == "fra")
    assert [(n.count, n.gpus_milli) for n in fra.nodes] == [(1, 8000), (2, 4000)]
    assert '"nodes"' not in next(p for p in r.estate.pools if p.name == "ams").model_dump_json(
        exclude_defaults=True
    )
    assert "nodes" not in r.estate.canonical_json().split('"name": "ams"')[0][-300:]


def test_capacity_and_nodes_that_disagree_is_a_warning_at_nodes() -> None:
    r = estate(cap=20)
    assert r.ok
    d = diag(r, "nodes-capacity")
    assert d.severity.value == "warning"
    assert "declared capacity 20 GPUs, but its nodes (2 x 8 GPUs) hold 16" in d.message
    assert d.pos is not None and d.pos.line == 2


def test_a_profile_that_fits_no_machine_is_an_error_naming_the_shapes() -> None:
    r = estate(gpus="12")
    assert not r.ok
    d = diag(r, "profile-fits-no-node")
    assert "profile 'p' (12 GPUs) fits no node of its pools (fra: 2 x 8 GPUs)" in d.message
    assert "nodes: N" in d.hint
    # As a gang over 2 machines (6 on each) it fits.
    assert estate(gpus="12", extra=", nodes: 2").ok


def test_a_gang_that_does_not_split_evenly_is_an_error() -> None:
    # GPU amounts are in thousandths: 1.001 GPUs has no even half.
    d = diag(estate(gpus="1.001", extra=", nodes: 2"), "profile-nodes")
    assert "1.001 GPUs cannot be split evenly over 2 nodes" in d.message


def test_a_pool_the_profile_fits_only_partly_is_a_warning() -> None:
    r = estate(gpus="12", pools="[fra, ams]", extra="")
    # ams declares no nodes (one 8-GPU pool): 12 is above its capacity, but only declared
    # shapes are checked here; fra's miss is the warning.
    d = diag(r, "profile-node-fit")
    assert "fits no node of pool fra: its work is placed only on ams" in d.message


def test_submission_refuses_a_task_no_machine_could_hold() -> None:
    r = estate(gpus="{from_task: gpus, default: 2, max: 16}")
    d = diag(r, "profile-node-fit")
    assert "larger tasks are refused at submission" in d.message
    idx = EstateIndex.build(r.estate)
    st = State(idx, 0)
    with pytest.raises(SubmissionError) as e:
        st.submit("x", "team/p", "ann", None, 12_000, at=0)
    assert e.value.field == "gpus"
    assert "largest task is 8 GPUs (pool fra: 2 x 8 GPUs)" in str(e.value)
    st.submit("y", "team/p", "ann", None, 8_000, at=0)  # one machine's worth is fine
