"""Which nodes of a pool a task goes on (issue 15): the one rule the compiler (a profile that
fits no node shape), the engine (placement, reasons, submission) and the reclaim share.

A pool that declares ``nodes`` is a set of machines; a task must fit on one of them, or, as a
gang over ``n`` nodes, its GPUs split evenly over ``n`` distinct machines. Among the nodes that
can take it, best fit: the fullest node that still has room (the first in declared order on a
tie), so whole free machines stay free for the large and multi-node work that needs them.
Standard library only, and integer milli-GPUs throughout.
"""

from __future__ import annotations

from collections.abc import Sequence


def share(size: int, nodes: int) -> int | None:
    """Milli-GPUs on each of ``nodes`` machines for a task of ``size``; None when the split is
    not even (the compiler and submission refuse such a task)."""
    if nodes <= 1:
        return size
    if size % nodes:
        return None
    return size // nodes


def shape_fits(shapes: Sequence[tuple[int, int]], size: int, nodes: int = 1) -> bool:
    """Whether an empty pool of ``shapes`` ((count, milli-GPUs per node), ...) can ever hold a
    task of ``size`` over ``nodes`` machines."""
    each = share(size, nodes)
    if each is None:
        return False
    return sum(count for count, gpus in shapes if gpus >= each) >= nodes


def largest_fit(shapes: Sequence[tuple[int, int]], nodes: int = 1) -> int:
    """The largest task (milli-GPUs) an empty pool of ``shapes`` holds over ``nodes``
    machines: ``nodes`` times the ``nodes``-th largest machine."""
    sizes = sorted((gpus for count, gpus in shapes for _ in range(min(count, nodes))), reverse=True)
    if len(sizes) < nodes:
        return 0
    return sizes[nodes - 1] * nodes


def choose_nodes(free: Sequence[int], size: int, nodes: int = 1) -> list[int] | None:
    """The machines (indices into ``free``, each one's room in milli-GPUs) a task of ``size``
    goes on now, best fit, or None when it does not fit."""
    each = share(size, nodes)
    if each is None:
        return None
    fitting = sorted((f, i) for i, f in enumerate(free) if f >= each)
    if len(fitting) < nodes:
        return None
    return sorted(i for _, i in fitting[:nodes])


def describe(shapes: Sequence[tuple[int, int]]) -> str:
    """``2 x 8 GPUs + 1 x 4 GPUs``."""

    def g(m: int) -> str:
        return f"{m / 1000:g}"

    return " + ".join(
        f"{count} x {g(gpus)} GPU{'' if gpus == 1000 else 's'}" for count, gpus in shapes
    )
