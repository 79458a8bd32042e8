"""GPU discovery (nvidia-smi or a declared list) and the placement of whole and fractional
tasks: never more than one GPU's worth on a GPU."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from klique_util.units import gpus_to_milli as to_milli
from workers.gpus import MILLI, Gpu, GpuAllocator, GpuDiscoveryError, discover, parse_gpu_list
from tests.harness.examples import examples


def test_fractions_share_a_gpu_and_never_exceed_one_gpu():
    a = GpuAllocator([0, 1])
    assert a.place(to_milli(0.5)) == [0]
    assert a.place(to_milli(0.25)) == [0]  # best fit: the fullest GPU it fits on
    assert a.place(to_milli(0.5)) == [1]  # 0.5 does not fit in GPU 0's 0.25
    assert a.place(to_milli(0.25)) == [0]
    assert a.used == {0: 1000, 1: 500}
    assert a.place(to_milli(0.75)) is None  # 0.5 left on GPU 1
    assert a.place(to_milli(1)) is None  # no whole GPU free
    assert a.fully_free() == []
    assert a.has_room()
    a.release([1], to_milli(0.5))
    assert a.place(to_milli(2)) is None
    assert a.place(to_milli(1)) == [1]
    assert not a.has_room()


def test_whole_tasks_take_entirely_free_gpus():
    a = GpuAllocator([0, 1, 2, 3])
    assert a.place(to_milli(0.1)) == [0]
    assert a.place(to_milli(3)) == [1, 2, 3]
    assert a.place(to_milli(1)) is None
    assert a.fits_ever(to_milli(4)) and not a.fits_ever(to_milli(5))
    with pytest.raises(Exception, match="more than one GPU"):
        a.take([1], MILLI)


@settings(max_examples=examples(150), deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([0.001, 0.1, 0.25, 0.333, 0.5, 0.75, 1, 2, 3]), st.booleans()),
        max_size=60,
    ),
    st.integers(min_value=1, max_value=4),
)
def test_placement_never_exceeds_one_gpu_per_gpu(ops, n_gpus):
    a = GpuAllocator(list(range(n_gpus)))
    placed: list[tuple[list[int], int]] = []
    rng = random.Random(len(ops))
    for amount, release in ops:
        if release and placed:
            gpus, milli = placed.pop(rng.randrange(len(placed)))
            a.release(gpus, milli)
        else:
            milli = to_milli(amount)
            gpus = a.place(milli)
            if gpus is not None:
                placed.append((gpus, milli))
                assert len(gpus) == (1 if milli < MILLI else milli // MILLI)
        # the allocator agrees with the sum of what is placed, and no GPU is over one
        per_gpu = {i: 0 for i in range(n_gpus)}
        for gpus, milli in placed:
            for i in gpus:
                per_gpu[i] += milli if milli < MILLI else MILLI
        assert per_gpu == a.used
        assert all(v <= MILLI for v in per_gpu.values())


def test_gpu_list_parsing():
    assert parse_gpu_list("auto") is None
    assert parse_gpu_list("0, 1,3") == [0, 1, 3]
    assert parse_gpu_list("none") == []
    for bad in ("0,0", "a", "1-3"):
        with pytest.raises(GpuDiscoveryError):
            parse_gpu_list(bad)


def _fake_smi(tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        '[ "$1" = --query-gpu=index,uuid,memory.total,name ] || exit 9\n'
        "echo '0, GPU-aaaa, 81920, NVIDIA H100 80GB HBM3'\n"
        "echo '1, GPU-bbbb, 81920, NVIDIA H100 80GB HBM3'\n"
        "echo '2, GPU-cccc, [N/A], [N/A]'\n"
    )
    smi.chmod(0o755)
    return str(smi)


def test_discovery_with_nvidia_smi_and_without(tmp_path):
    smi = _fake_smi(tmp_path)
    gpus, source = discover("auto", nvidia_smi=smi)
    assert gpus == [
        Gpu(0, "GPU-aaaa", 81920, "NVIDIA H100 80GB HBM3"),
        Gpu(1, "GPU-bbbb", 81920, "NVIDIA H100 80GB HBM3"),
        Gpu(2, "GPU-cccc", None),
    ]
    # the model reaches the control plane at registration (capacity truth, issue 15)
    assert gpus[0].to_json()["model"] == "NVIDIA H100 80GB HBM3"
    assert "nvidia-smi" in source
    assert [g.index for g in discover("2,0", nvidia_smi=smi)[0]] == [2, 0]
    with pytest.raises(GpuDiscoveryError, match="shows only"):
        discover("0,7", nvidia_smi=smi)
    # this machine has no nvidia-smi: the declared list, and `auto` says what to do
    import shutil

    if shutil.which("nvidia-smi") is None:
        gpus, _ = discover("0,1")
        assert [g.to_json() for g in gpus] == [
            {"index": 0, "uuid": "declared-0", "memory_mb": None, "model": None},
            {"index": 1, "uuid": "declared-1", "memory_mb": None, "model": None},
        ]
        with pytest.raises(GpuDiscoveryError, match="--gpus 0,1"):
            discover("auto")
