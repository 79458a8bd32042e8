"""Which GPUs of a worker a task goes on: the one rule both the worker (``workers.gpus``, which
places tasks) and the daemon (``kliqued.daemon.leases``, which offers a worker only the work
that fits its reported room) apply, so a lease the daemon grants is one the worker can place.

A task of 1 GPU or more takes whole, entirely free GPUs (a non-integer amount above 1 is
rounded up); a fraction below 1 shares one GPU with other fractions, best fit (the fullest
GPU it fits on), so that whole GPUs stay free for whole tasks. Never more than one GPU's worth
goes on a GPU. Standard library only: a worker host imports it.
"""

from __future__ import annotations

from collections.abc import Mapping

from .units import MILLI as GPU_MILLI  # one GPU in milli-GPUs: klique_util.units


def per_gpu(milli: int) -> int:
    """What a task of ``milli`` milli-GPUs holds on each GPU it is given."""
    return milli if milli < GPU_MILLI else GPU_MILLI


def choose_gpus(free: Mapping[int, int], milli: int) -> list[int] | None:
    """The GPUs (keys of ``free``: each GPU's room in milli-GPUs) a task of ``milli`` goes on
    now, or None when it does not fit. A fraction goes on the GPU with the least room that
    holds it (the lowest key on a tie); whole tasks take the first entirely free GPUs in the
    order of ``free``. A task of 0 GPUs takes none."""
    if milli <= 0:
        return []
    if milli < GPU_MILLI:
        best: int | None = None
        for i, f in free.items():
            if f >= milli and (best is None or (f, i) < (free[best], best)):
                best = i
        return None if best is None else [best]
    n = -(-milli // GPU_MILLI)
    whole = [i for i, f in free.items() if f >= GPU_MILLI]
    return whole[:n] if len(whole) >= n else None
