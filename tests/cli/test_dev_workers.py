"""`kliqued dev`'s workers match the example estate (issue 25, item 12): before, it started
one 16-GPU worker for `onprem-baremetal`, which declares `nodes: {count: 4, gpus: 4}`, so
every `kliqued pools` and live plan carried a capacity warning from the first minute.

Checked with the function that decides the workers, against the compiled example estate and
the capacity check the warning comes from (kliqued/daemon/fleet/capacity.py), without starting
`kliqued dev` (tests/e2e/test_dev_run.py does that)."""

from __future__ import annotations

from pathlib import Path

from compiler.api import compile_dir
from kliqued.commands.dev import DEFAULT_POOL
from kliqued.commands.devworkers import dev_workers
from kliqued.daemon.fleet.capacity import truth
from kliqued.daemon.leases import WorkerInfo
from tests.harness.typed import present

ESTATE = Path(__file__).resolve().parents[2] / "estate"


def _as_registered(pool: str, name: str, gpus: str) -> WorkerInfo:
    w = WorkerInfo(f"w-{name}", pool)
    w.gpus = [{"index": int(i)} for i in gpus.split(",")]  # fake GPUs: count only
    return w


def test_the_default_pool_gets_one_worker_per_declared_machine_and_no_warning() -> None:
    res = compile_dir(ESTATE)
    assert res.estate is not None
    pool = res.estate.pool(DEFAULT_POOL)
    assert pool is not None
    workers = dev_workers(pool)
    assert [(w.name, w.gpus) for w in workers] == [
        (f"{DEFAULT_POOL}-{i}", "0,1,2,3") for i in range(1, 5)
    ]
    t = truth(pool, [_as_registered(pool.name, w.name, w.gpus) for w in workers])
    assert t["mismatches"] == [] and t["agree"]
    assert t["reported"]["gpus"] == t["declared"]["gpus"] == 16


def test_every_example_pool_started_by_kliqued_dev_pool_agrees() -> None:
    res = compile_dir(ESTATE)
    assert res.estate is not None
    for pool in res.estate.pools:
        ws = dev_workers(pool)
        t = truth(pool, [_as_registered(pool.name, w.name, w.gpus) for w in ws])
        assert t["mismatches"] == [], pool.name
        assert len({w.name for w in ws}) == len(ws)  # one state directory each


def test_gpus_given_by_hand_make_one_worker() -> None:
    res = compile_dir(ESTATE)
    assert res.estate is not None
    pool = present(res.estate.pool(DEFAULT_POOL))
    assert [(w.name, w.gpus) for w in dev_workers(pool, "auto")] == [(DEFAULT_POOL, "auto")]
