"""Which local workers ``kliqued dev`` starts for a pool (issue 25, item 12).

Each worker is one machine to the control plane (docs/workers.md): a pool that declares its
machines (``nodes: {count: 4, gpus: 4}``) gets one worker per declared machine, each with
that machine's GPUs, so ``kliqued pools`` and a live plan find what is declared
(kliqued/daemon/fleet/capacity.py). One worker with all the pool's GPUs would be a 16-GPU machine
in a pool of 4-GPU ones: a capacity warning from the first minute.
"""

from __future__ import annotations

from dataclasses import dataclass

from compiler.compiled import CPool
from klique_util.units import MILLI


@dataclass(frozen=True, slots=True)
class DevWorker:
    pool: str
    name: str
    """Names its state directory, token and log (``worker-<name>``): one per machine."""
    gpus: str
    """The worker's ``--gpus``: fake indices ``0,1,2,3``, or what the user gave."""


def dev_workers(pool: CPool, gpus: str | None = None) -> list[DevWorker]:
    """The workers for ``pool``: with ``gpus`` (``--gpus``), one worker with them, as asked;
    otherwise one per declared machine with its GPUs, or one with the pool's capacity (at
    least 1) when it declares none."""
    if gpus is not None:
        return [DevWorker(pool.name, pool.name, gpus)]
    sizes = [n.gpus_milli // MILLI for n in pool.nodes for _ in range(n.count)]
    if not sizes:
        sizes = [int(pool.capacity_milli // MILLI) or 1]
    if len(sizes) == 1:
        return [DevWorker(pool.name, pool.name, _indices(sizes[0]))]
    return [DevWorker(pool.name, f"{pool.name}-{i}", _indices(n)) for i, n in enumerate(sizes, 1)]


def _indices(n: int) -> str:
    return ",".join(str(i) for i in range(max(1, n)))
