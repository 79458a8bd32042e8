"""The compiled estate: canonical, complete, and the same bytes for the same estate."""

from __future__ import annotations

import json

from compiler.api import SourceFile, compile_files
from compiler.compiled import CompiledEstate
from tests.harness.typed import present

from .helpers import MINIMAL, compile_text

SPLIT_A = """\
pools:
  - {name: onprem, kind: baremetal, capacity: 8, gpu_type: h100, generation: 2023, gpu_memory_gb: 80}
  - {name: old, kind: kubernetes, capacity: 4, gpu_type: a100, generation: 2020, gpu_memory_gb: 40}
  - {name: cloud, kind: cloud, gpu_type: h100, autoscale: {max: 16}, generation: 2023, gpu_memory_gb: 80}
"""
SPLIT_B = """\
profiles:
  - {name: big, gpus: {from_task: gpus, max: 4}, pools_by: {min_gpu_memory_gb: 40}, policies: [team-a]}
  - {name: small, gpus: 0.5, time_weight: 0.5, pools: [old, onprem], policies: [team-a]}
policies:
  - {name: team-a, group: team-a, reservation: 2, limit: 8, budget: {hours: 100, period: week, alert_at: [0.9, 0.5]}}
groups:
  - {name: team-a, parent: research, users: [bob, alice]}
  - {name: research}
pricing:
  - {gpu_type: h100, per_gpu_hour: 2.80, effective_from: "2026-01-01T00:00:00Z"}
  - {gpu_type: a100, per_gpu_hour: 1.2, effective_from: 2026-01-01T00:00:00Z}
"""


def test_defaults_and_resolution_are_explicit() -> None:
    est = compile_text(SPLIT_A + SPLIT_B).estate
    assert est is not None
    big = present(est.profile("big"))
    # pools_by: newest generation first, ties by declaration order (onprem before cloud)
    assert big.pools == ["onprem", "cloud", "old"]
    assert present(big.from_task).default_milli == 1000 and big.gpus_milli is None
    assert present(est.profile("small")).time_weight_milli == 500
    assert present(est.pool("cloud")).capacity_milli == 16000
    assert present(present(est.pool("cloud")).autoscale).idle_timeout_s == 600
    # execution order: profiles using the pool in declaration order
    assert present(est.pool("onprem")).execution_order == ["big", "small"]
    pol = present(est.policy("team-a"))
    assert pol.budget is not None
    assert pol.budget.low_watermark_s == 900 and pol.budget.alert_at_milli == [500, 900]
    assert present(est.group("team-a")).ancestors == ["research"]
    assert present(est.group("team-a")).users == ["alice", "bob"]
    assert [c.name for c in est.compute_resources] == ["team-a/big", "team-a/small"]
    assert {p.per_gpu_hour for p in est.pricing} == {"2.8", "1.2"}
    assert est.settings.pass_interval_s == 1 and est.settings.currency == "EUR"
    assert est.revision.startswith("sha256:") and len(est.revision) == 71


def test_same_bytes_whatever_the_file_split() -> None:
    one = compile_files([SourceFile("all.yaml", (SPLIT_A + SPLIT_B).encode())]).estate
    two = compile_files(
        [SourceFile("a/pools.yaml", SPLIT_A.encode()), SourceFile("b/rest.yaml", SPLIT_B.encode())]
    ).estate
    assert one is not None and two is not None
    assert one.canonical_json() == two.canonical_json()
    assert one.revision == two.revision


def test_same_bytes_whatever_the_key_order() -> None:
    reordered = SPLIT_A.replace(
        "{name: onprem, kind: baremetal, capacity: 8", "{capacity: 8, kind: baremetal, name: onprem"
    )
    a = present(compile_text(SPLIT_A + SPLIT_B).estate)
    b = present(compile_text(SPLIT_B + reordered).estate)
    assert a.canonical_json() == b.canonical_json()


def test_a_change_changes_the_revision() -> None:
    a = present(compile_text(MINIMAL).estate)
    b = present(compile_text(MINIMAL.replace("capacity: 8", "capacity: 9")).estate)
    assert a.revision != b.revision


def test_compiled_json_round_trips() -> None:
    est = present(compile_text(SPLIT_A + SPLIT_B).estate)
    text = est.canonical_json()
    again = CompiledEstate.from_json(text)
    assert again == est and again.canonical_json() == text
    assert json.loads(text)["format"] == 1


def test_invalid_estate_compiles_to_nothing() -> None:
    result = compile_text(MINIMAL.replace("limit: 8", "limit: 1"))
    assert result.estate is None and result.errors


def test_strict_turns_warnings_into_errors() -> None:
    text = MINIMAL.replace(
        "pricing:\n  - {gpu_type: h100, per_gpu_hour: 2.5, effective_from: "
        '"2026-01-01T00:00:00Z"}\n',
        "",
    )
    lenient = compile_text(text)
    assert lenient.ok and [d.code for d in lenient.warnings] == ["missing-price"]
    strict = lenient.strict()
    assert not strict.ok and [d.severity.value for d in strict.diagnostics] == ["error"]
