"""The one GPU-fit rule (klique_util.gpufit): its table, and that the daemon's lease check
and the worker's placement agree on every sequence of tasks (a lease the daemon grants is one
the worker can place, and it grants every one the worker could)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from klique_util.gpufit import choose_gpus
from kliqued.daemon.fleet.workers import room
from kliqued.daemon.leases import gpu_fits
from workers.gpus import MILLI, GpuAllocator
from tests.harness.examples import examples


@pytest.mark.parametrize(
    "free, milli, expected",
    [
        ({0: 1000, 1: 1000}, 0, []),  # CPU-only: no GPU
        ({0: 1000, 1: 500}, 250, [1]),  # a fraction: the fullest GPU it fits on
        ({0: 250, 1: 500}, 500, [1]),  # ... that holds it
        ({3: 500, 1: 500}, 500, [1]),  # a tie: the lowest index
        ({0: 400, 1: 300}, 500, None),  # no GPU holds it
        ({0: 1000, 1: 999, 2: 1000}, 2000, [0, 2]),  # whole GPUs: only entirely free ones
        ({0: 1000, 1: 999}, 1500, None),  # 1.5 rounds up to 2 whole GPUs
        ({0: 1000}, 1000, [0]),
    ],
)
def test_choose_gpus(free, milli, expected) -> None:
    assert choose_gpus(free, milli) == expected


def lease_body(a: GpuAllocator) -> dict:
    """What the worker reports in a lease request (workers/daemon.py _gpu_lease_body)."""
    return {
        "free_gpus": a.fully_free(),
        "gpu_free": [{"index": i, "free": f / MILLI} for i, f in a.free().items() if f],
    }


@settings(max_examples=examples(200), deadline=None)
@given(
    n_gpus=st.integers(0, 4),
    sizes=st.lists(
        st.sampled_from([0, 100, 250, 300, 500, 750, 1000, 1500, 2000, 3000]), max_size=12
    ),
)
def test_the_daemon_leases_exactly_what_the_worker_can_place(n_gpus, sizes) -> None:
    worker = GpuAllocator(list(range(n_gpus)))
    worker.place(250)  # some room is already shared
    # one lease request: the daemon checks the waiting tasks in turn against the room the
    # worker reported, taking each one's share; the worker then places the same tasks
    free = room(lease_body(worker))
    for size in sizes:
        fits = gpu_fits(size, free)
        placed = worker.place(size)
        assert fits == (placed is not None), (size, worker.used)
