"""Capacity truth (issue 15 part 3): what the workers report at registration (GPU count per
machine, model, memory) against what the pool declares, on a real ``kliqued serve``: the
pools view, ``kliqued pools``, the event, the metric and the plan state say so; the engine
keeps counting the declared capacity."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.harness.daemon import ROOT

from .fleet import ESTATE, PY, HttpWorker, running_fleet, write_estate

POOLS = """\
pools:
  - name: bare
    kind: baremetal
    capacity: 4
    gpu_type: h100-80gb
    nodes: {count: 2, gpus: 2}
  - name: other
    kind: baremetal
    capacity: 2
    gpu_type: l40s-48gb
"""


@pytest.fixture
def fs(tmp_path):
    yield from running_fleet(
        tmp_path,
        estate=write_estate(tmp_path / "estate", {**ESTATE, "pools.yaml": POOLS}),
        ttl="60s",
    )  # the hand-driven workers stay live


def gpus(n: int, model: str | None, memory_mb: int | None) -> list[dict]:
    return [
        {"index": i, "uuid": f"GPU-{i}", "memory_mb": memory_mb, "model": model} for i in range(n)
    ]


def register(fs, wid: str, body_gpus: list[dict]) -> HttpWorker:
    w = HttpWorker(fs, fs.wt, wid)
    st, body = w.call(
        "POST",
        "/v1/workers/register",
        {
            "worker_id": wid,
            "hostname": wid,
            "pool": "bare",
            "executor": "process",
            "version": "test",
            "gpus": body_gpus,
        },
    )
    assert st == 200, body
    return w


def truth(fs) -> dict:
    return next(p for p in fs.ok("GET", "/v1/pools")["pools"] if p["name"] == "bare")[
        "capacity_truth"
    ]


def cli(fs, *argv: str) -> str:
    env = {**os.environ, "KLIQUE_URL": fs.url, "KLIQUE_TOKEN": fs.admin}
    env.pop("KLIQUE_CONFIG", None)
    p = subprocess.run(
        [PY, "-m", "kliqued.cli", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.returncode == 0, p.stderr
    return p.stdout


def metric(fs, name: str, pool: str) -> float:
    text = fs.call("GET", "/metrics")[1]
    line = next(
        line
        for line in text.splitlines()
        if line.startswith(name + "{") and f'pool="{pool}"' in line
    )
    return float(line.rsplit(" ", 1)[1])


def test_workers_that_match_the_declaration_agree(fs) -> None:
    register(fs, "a", gpus(2, "NVIDIA H100 80GB HBM3", 81559))
    register(fs, "b", gpus(2, None, None))  # fake GPUs: compared by count only
    t = truth(fs)
    assert t["agree"] is True and t["mismatches"] == []
    assert t["declared"] == {"gpus": 4, "gpu_type": "h100-80gb", "machines": [2, 2]}
    assert t["reported"] == {
        "workers": 2,
        "gpus": 4,
        "models": ["NVIDIA H100 80GB HBM3"],
        "machines": [2, 2],
    }
    assert fs.events(kind="capacity_mismatch") == []
    assert metric(fs, "klique_pool_capacity_mismatch", "bare") == 0
    assert metric(fs, "klique_pool_reported_gpus", "bare") == 4
    row = next(line for line in cli(fs, "pools").splitlines() if line.startswith("bare "))
    assert row.rstrip().endswith("2 (4 GPUs, 2+2 of 2+2 declared)")


def test_a_worker_that_disagrees_is_shown_counted_logged_and_noted_for_the_plan(fs) -> None:
    register(fs, "a", gpus(4, "NVIDIA A100-SXM4-40GB", 40960))  # 4 GPUs, an A100
    t = truth(fs)
    assert t["agree"] is False
    assert t["mismatches"] == [
        "worker a reports 4 GPUs; pool bare declares machines of 2",
        "worker a GPU 0 is a NVIDIA A100-SXM4-40GB; pool bare declares h100-80gb",
    ]
    ev = fs.events(kind="capacity_mismatch")
    assert [e["data"]["worker"] for e in ev] == ["a"]
    assert ev[0]["data"]["mismatches"] == t["mismatches"]
    assert metric(fs, "klique_pool_capacity_mismatch", "bare") == 2
    out = cli(fs, "pools")
    assert "warning: worker a reports 4 GPUs; pool bare declares machines of 2" in out
    assert "the engine counts the declared capacity" in out
    row = next(line for line in out.splitlines() if line.startswith("bare "))
    assert row.rstrip().endswith("1 (4 GPUs, 4 of 2+2 declared) !")
    # the engine still counts what the pool declares
    bare = next(p for p in fs.ok("GET", "/v1/pools")["pools"] if p["name"] == "bare")
    assert bare["capacity"] == 4
    state = fs.ok("GET", "/v1/plan/state")
    assert state["capacity_mismatches"] == {"bare": t["mismatches"]}


def test_memory_far_from_the_type_and_too_many_machines_disagree(fs) -> None:
    for wid in ("a", "b", "c"):
        register(fs, wid, gpus(2, "NVIDIA H100 PCIe", 40960 if wid == "c" else 81920))
    t = truth(fs)
    assert t["mismatches"] == [
        "worker c GPU 0 has 40 GB; pool bare declares h100-80gb",
        "3 live workers in pool bare; it declares 2 machines",
        "workers of pool bare report 6 GPUs; it declares 4",
    ]
