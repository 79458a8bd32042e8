"""Capacity truth (issue 15 part 3): what a pool declares (capacity, GPU type, machines)
against what its live workers report at registration (their GPUs: count, model, memory).

The engine keeps counting the declared capacity (engine.md): a disagreement is shown
(``GET /v1/pools``, ``kliqued pools``), counted (the ``klique_pool_capacity_mismatch`` gauge),
logged when a worker's registration brings it (a ``capacity_mismatch`` event) and noted by
``kliqued plan --against`` (``GET /v1/plan/state``), never acted on: IT fixes the estate or
the machine.

What counts as a disagreement (each worker is one machine):

- a worker with more GPUs than the pool's largest declared machine, or (a pool that declares
  its machines) a worker whose GPU count is no declared machine's;
- more live workers than declared machines, or more reported GPUs than declared capacity;
- a GPU whose model (nvidia-smi's name) does not name the pool's ``gpu_type`` family
  (``h100`` in ``NVIDIA H100 80GB HBM3``), or whose memory is well off the type's
  (``l40s-48gb``: 48 GB, within 10 %). Fake GPUs (``--gpus`` without nvidia-smi) report no
  model or memory and are compared by count only.

Fewer reported GPUs than declared is shown (``reported`` beside ``declared``) but is not a
disagreement: workers come and go, and a pool without live workers already says so.
"""

from __future__ import annotations

import re
from typing import Any

from compiler.compiled import CPool

from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.leases import WorkerInfo

_MEMORY = re.compile(r"(\d+)\s*gb", re.I)


def _family(gpu_type: str) -> str:
    """``h100`` of ``h100-80gb``; ``l40s`` of ``l40s-48gb``: the first token of the type."""
    return re.split(r"[^a-z0-9]", gpu_type.lower(), maxsplit=1)[0]


def _declared_memory_mb(gpu_type: str) -> int | None:
    m = _MEMORY.search(gpu_type)
    return int(m.group(1)) * 1024 if m else None


def _gpus(p: CPool) -> float:
    return p.capacity_milli / 1000


def machines(p: CPool) -> list[int]:
    """The declared machines' GPU counts, largest first (one pool-sized machine when the
    pool declares none)."""
    if not p.nodes:
        return []
    return sorted((n.gpus_milli // 1000 for n in p.nodes for _ in range(n.count)), reverse=True)


def worker_mismatches(p: CPool, w: WorkerInfo) -> list[str]:
    """What one worker's report says against its pool's declaration."""
    out = []
    count = len(w.gpus)
    shapes = sorted({n.gpus_milli // 1000 for n in p.nodes})
    if shapes and count and count not in shapes:
        out.append(
            f"worker {w.id} reports {count} GPUs; pool {p.name} declares machines of "
            f"{', '.join(str(s) for s in shapes)}"
        )
    elif not shapes and count > _gpus(p):
        out.append(
            f"worker {w.id} reports {count} GPUs, more than pool {p.name}'s capacity ({_gpus(p):g})"
        )
    family = _family(p.gpu_type)
    want_mb = _declared_memory_mb(p.gpu_type)
    for g in w.gpus:
        model = g.get("model") if isinstance(g, dict) else None
        if (
            isinstance(model, str)
            and model
            and family
            and family not in re.sub(r"[^a-z0-9]", "", model.lower())
        ):
            out.append(
                f"worker {w.id} GPU {g.get('index')} is a {model}; pool {p.name} "
                f"declares {p.gpu_type}"
            )
            break
        mem = g.get("memory_mb") if isinstance(g, dict) else None
        if isinstance(mem, int) and want_mb and abs(mem - want_mb) > want_mb // 10:
            out.append(
                f"worker {w.id} GPU {g.get('index')} has {mem / 1024:.0f} GB; pool "
                f"{p.name} declares {p.gpu_type}"
            )
            break
    return out


def pool_truth(d: Daemon, p: CPool) -> dict[str, Any]:
    """Declared against reported for one pool: the ``capacity_truth`` of ``GET /v1/pools``."""
    return truth(p, d.live_workers(p.name))


def truth(p: CPool, workers: list[WorkerInfo]) -> dict[str, Any]:
    """Declared against what ``workers`` (the pool's live ones) report: pure, so what
    ``kliqued dev`` starts is checked against it without a daemon."""
    live = sorted(workers, key=lambda w: w.id)
    reported = sum(len(w.gpus) for w in live)
    models = sorted(
        {
            str(g.get("model"))
            for w in live
            for g in w.gpus
            if isinstance(g, dict) and g.get("model")
        }
    )
    mismatches = [text for w in live for text in worker_mismatches(p, w)]
    declared_machines = machines(p)
    if declared_machines and len(live) > len(declared_machines):
        mismatches.append(
            f"{len(live)} live workers in pool {p.name}; it declares "
            f"{len(declared_machines)} machines"
        )
    if reported > _gpus(p):
        mismatches.append(
            f"workers of pool {p.name} report {reported} GPUs; it declares {_gpus(p):g}"
        )
    out: dict[str, Any] = {
        "declared": {
            "gpus": _gpus(p),
            "gpu_type": p.gpu_type,
            **({"machines": declared_machines} if declared_machines else {}),
        },
        "reported": {
            "workers": len(live),
            "gpus": reported,
            "models": models,
            "machines": sorted((len(w.gpus) for w in live), reverse=True),
        },
        "agree": not mismatches,
        "mismatches": mismatches,
    }
    return out


def pool_of(d: Daemon, name: str) -> CPool | None:
    return next((p for p in d.idx().estate.pools if p.name == name), None)


def mismatch_counts(d: Daemon) -> dict[str, int]:
    """Per pool: how many disagreements (the metric's value)."""
    return {p.name: len(pool_truth(d, p)["mismatches"]) for p in d.idx().estate.pools}
